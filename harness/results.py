"""Results of a suite: one row per scenario, stored as CSV and JSON, summarised as plain HTML.

A suite run lives in ``reports/<suite>/<UTC time>/`` with a ``latest`` link next to it (as
Jepsen's store does): ``results.csv``, ``results.json``, ``index.html`` and one directory per
scenario with its history, trajectory, logs and ``result.json``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pandas as pd
from jinja2 import Environment, select_autoescape

COLUMNS = ["scenario", "verdict", "families", "kinds", "launches", "steps_lost", "time_to_detect_s",
           "time_to_recover_s", "save_s", "wall_s", "reason"]


def suite_dir(reports_root: Path, suite: str) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = Path(reports_root) / suite / stamp
    out.mkdir(parents=True, exist_ok=False)
    link = Path(reports_root) / suite / "latest"
    tmp = link.with_name(".latest.tmp")
    if tmp.is_symlink():
        tmp.unlink()
    tmp.symlink_to(stamp)
    os.replace(tmp, link)
    return out


def table(results: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(results)
    for col in COLUMNS:
        if col not in df:
            df[col] = None
    for col in ("families", "kinds"):
        df[col] = df[col].map(lambda v: " ".join(v) if isinstance(v, list) else v)
    return df[COLUMNS]


def write(out: Path, suite: str, results: list[dict], wall_s: float) -> Path:
    """Write results.csv, results.json and index.html; returns the HTML path."""
    out = Path(out)
    df = table(results)
    df.to_csv(out / "results.csv", index=False)
    (out / "results.json").write_text(json.dumps({"suite": suite, "wall_s": wall_s, "results": results}, indent=1))
    html = _TEMPLATE.render(suite=suite, wall_s=wall_s, rows=results, counts=df["verdict"].value_counts().to_dict(),
                            generated=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    (out / "index.html").write_text(html)
    return out / "index.html"


def _fmt(v, digits: int = 1) -> str:
    return "" if v is None or v != v else f"{v:.{digits}f}"


_env = Environment(autoescape=select_autoescape(default=True))
_env.filters["fmt"] = _fmt
_TEMPLATE = _env.from_string("""<!doctype html>
<html><head><meta charset="utf-8"><title>ckpt-chaos: {{ suite }}</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 4px 8px; vertical-align: top; }
th { background: #f3f3f3; } .pass { background: #e5f5e0; } .fail { background: #fde0dd; }
.skipped { background: #fff7bc; } td.num { text-align: right; } details { margin: 0; }
</style></head><body>
<h1>ckpt-chaos suite <code>{{ suite }}</code></h1>
<p>{{ generated }} &middot; {{ rows|length }} scenarios &middot;
{% for k, v in counts.items() %}{{ v }} {{ k }}{% if not loop.last %}, {% endif %}{% endfor %}
&middot; wall time {{ wall_s|fmt }} s</p>
<table><tr><th>scenario</th><th>verdict</th><th>faults</th><th>launches</th><th>steps lost</th>
<th>detect (s)</th><th>recover (s)</th><th>save (s)</th><th>wall (s)</th><th>checks</th></tr>
{% for r in rows %}<tr class="{{ r.verdict }}">
<td><a href="{{ r.scenario }}/history.jsonl">{{ r.scenario }}</a></td><td>{{ r.verdict }}</td>
<td>{{ r.families|join(' ') }}: {{ r.kinds|join(' ') }}</td><td class="num">{{ r.launches }}</td>
<td class="num">{{ r.steps_lost if r.steps_lost is not none else '' }}</td>
<td class="num">{{ r.time_to_detect_s|fmt }}</td><td class="num">{{ r.time_to_recover_s|fmt }}</td>
<td class="num">{{ r.save_s|fmt(3) }}</td><td class="num">{{ r.wall_s|fmt }}</td>
<td>{% if r.reason %}<b>{{ r.reason }}</b>{% endif %}
<details><summary>{{ r.checks|length }} checks</summary><ul>
{% for c in r.checks %}<li class="{{ c.verdict }}">{{ c.name }}: {{ c.detail }}</li>{% endfor %}</ul></details></td>
</tr>{% endfor %}</table></body></html>
""")
