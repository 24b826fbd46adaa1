"""The time of every phase in view, for `make chaos`, `make chaos-examples` and `.ci/run`.

Each of them keeps a record, ``reports/timings/NAME.json`` (``NAME.prev.json``: the run before,
which the summary compares against): the wall time and exit status of each phase and, for a phase
that ran a suite, every scenario's wall time and verdict (from the suite run's ``results.json``).
``make test`` writes its own, ``reports/timings/test.json`` (``tests/timings.py``); the record of
``.ci/run`` (``ci.json``) holds the records of the targets it ran, so one file has the time of every
phase, test and scenario of a CI run. Standard library only: it runs before ``make setup`` has made
the venv. No verdict rests on a time.

    python3 .ci/times.py start chaos                      # a fresh record (the old one becomes .prev)
    python3 .ci/times.py phase chaos search -- CMD ARG... # run CMD, record its time and exit status
                                                          # (failing: print the summary so far)
    python3 .ci/times.py phase chaos suite --suite-run reports/default/latest -- ckpt-chaos run ...
    python3 .ci/times.py summary chaos                    # print phases, slowest scenarios, changes
    python3 .ci/times.py summary ci --parts test chaos chaos-examples   # and take in those records
    python3 .ci/times.py table ci                         # markdown rows for docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = 1
SHOWN = 10


def timings_dir() -> Path:
    return ROOT / "reports" / "timings"


def path_of(name: str) -> Path:
    return timings_dir() / f"{name}.json"


def prev_of(name: str) -> Path:
    return timings_dir() / f"{name}.prev.json"


def fmt(s: float) -> str:
    return f"{int(s // 60)} min {s % 60:.0f} s" if s >= 60 else f"{s:.1f} s"


def revision() -> dict | None:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())} if head.returncode == 0 else None


def read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write(name: str, rec: dict) -> None:
    path_of(name).parent.mkdir(parents=True, exist_ok=True)
    tmp = path_of(name).with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, indent=1) + "\n")
    tmp.replace(path_of(name))


def start(name: str) -> dict:
    if path_of(name).exists():
        path_of(name).replace(prev_of(name))
    now = time.time()
    rec = {"schema": SCHEMA, "what": name, "revision": revision(), "started": now,
           "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(now)),
           "machine": {"cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()]}, "phases": []}
    write(name, rec)
    return rec


def suite_run(rel: str) -> Path:
    """A suite run directory given as ckpt-chaos names it under the output directory (reports/SUITE/latest)."""
    out = os.environ.get("CKPT_CHAOS_OUT")
    p = Path(rel)
    return p if p.is_absolute() or not out else Path(out) / p


def scenarios_of(run: Path, since: float) -> dict | None:
    """Each scenario's wall time and verdict, from a suite run written after ``since`` (else None)."""
    results = run / "results.json"
    try:
        if results.stat().st_mtime < since:
            return None
    except OSError:
        return None
    data = read(results) or {}
    return {"run": str(run.resolve()), "wall_s": data.get("wall_s"),
            "scenarios": {r["scenario"]: {"wall_s": round(r["wall_s"], 1), "verdict": r["verdict"]}
                          for r in data.get("results", [])}}


def phase(name: str, label: str, cmd: list[str], suite: str | None, summary_on_failure: bool = True) -> int:
    rec = read(path_of(name)) or start(name)
    t0 = time.time()
    print(f"[times] {name}: phase {label!r} starts", flush=True)
    try:
        rc = subprocess.run(cmd).returncode
    except KeyboardInterrupt:
        rc = 130
    except OSError as e:
        print(f"[times] {name}: {label}: {e}", file=sys.stderr)
        rc = 127
    entry = {"name": label, "wall_s": round(time.time() - t0, 1), "exit_status": rc}
    if suite and (found := scenarios_of(suite_run(suite), t0)) is not None:
        entry["suite"] = found
    rec = read(path_of(name)) or rec
    rec["phases"].append(entry)
    write(name, rec)
    print(f"[times] {name}: phase {label!r} took {fmt(entry['wall_s'])} (exit status {rc})", flush=True)
    if rc != 0 and summary_on_failure:  # make stops at a failed phase: the times so far, before it does
        summary(name, [])
    return rc


def scenarios(rec: dict) -> list[tuple[str, str, float, str]]:
    """(phase, scenario, wall s, verdict) of every suite phase of a record and of its parts."""
    out = [(p["name"], n, s["wall_s"], s["verdict"]) for p in rec.get("phases", []) if "suite" in p
           for n, s in p["suite"]["scenarios"].items()]
    for part in (rec.get("parts") or {}).values():
        if part.get("what") != "pytest":
            out += [(f"{part['what']}: {ph}", n, w, v) for ph, n, w, v in scenarios(part)]
    return out


def total(rec: dict) -> float:
    return sum(p["wall_s"] for p in rec.get("phases", []))


def lines(rec: dict, prev: dict | None) -> list[str]:
    out = [f"==== times of {rec['what']}: {fmt(total(rec))} in {len(rec['phases'])} phase(s); load average "
           f"{rec['machine']['loadavg'][0]:.1f} at the start on {rec['machine']['cpus']} cores ===="]
    before = {p["name"]: p for p in (prev or {}).get("phases", [])}
    for p in rec["phases"]:
        was = before.get(p["name"])
        change = f"  (last run {fmt(was['wall_s'])})" if was else ""
        extra = ""
        if "suite" in p:
            verdicts: dict[str, int] = {}
            for s in p["suite"]["scenarios"].values():
                verdicts[s["verdict"]] = verdicts.get(s["verdict"], 0) + 1
            extra = (f": {len(p['suite']['scenarios'])} scenarios ({', '.join(f'{n} {v}' for v, n in verdicts.items())}), "
                     f"{fmt(sum(s['wall_s'] for s in p['suite']['scenarios'].values()))} of scenario time")
        out.append(f"  {fmt(p['wall_s']):>12}  {p['name']}{extra}; exit status {p['exit_status']}{change}")
    for key, part in (rec.get("parts") or {}).items():
        if part.get("what") == "pytest":
            c = ", ".join(f"{n} {k}" for k, n in part["counts"].items())
            out.append(f"  {key}: {len(part['tests'])} tests ({c}) in {fmt(part['wall_s'])}, "
                       f"{fmt(part['test_time_s'])} of test time on {part.get('workers') or 1} worker(s)")
            slowest = sorted(part["tests"].items(), key=lambda kv: -kv[1]["s"])[:SHOWN]
            out.append(f"  slowest {len(slowest)} tests:")
            out += [f"    {t['s']:7.1f} s  {n}" for n, t in slowest]
        else:
            out.append(f"  {key}: " + ", ".join(f"{p['name']} {fmt(p['wall_s'])}" for p in part["phases"]))
    sc = scenarios(rec)
    if sc:
        prev_sc = {(n): w for _, n, w, _ in scenarios(prev or {})}
        out.append(f"  slowest {min(SHOWN, len(sc))} scenarios (wall time each; side by side under -n):")
        for ph, n, w, v in sorted(sc, key=lambda x: -x[2])[:SHOWN]:
            was = f"  (last run {prev_sc[n]:.0f} s)" if n in prev_sc else ""
            out.append(f"    {w:7.1f} s  {n} [{v}] in {ph}{was}")
    if prev:
        rev = (prev.get("revision") or {}).get("commit", "?")
        out.append(f"  last run (at {rev}, {prev.get('started_at', '?')}): "
                   f"{fmt(total(prev))}; this run {fmt(total(rec))}")
    return out


def summary(name: str, parts: list[str]) -> int:
    rec = read(path_of(name))
    if rec is None:
        print(f"[times] no record {path_of(name)}", file=sys.stderr)
        return 1
    if parts:
        rec["parts"] = {p: r for p in parts if (r := read(path_of(p))) is not None
                        and _started(r) >= rec["started"] - 1}  # only records this run wrote
        write(name, rec)
    for line in lines(rec, read(prev_of(name))):
        print(line)
    print(f"[times] record: {path_of(name)}")
    return 0


def _started(rec: dict) -> float:
    s = rec.get("started")
    return s if isinstance(s, (int, float)) else 0.0


def table(name: str) -> int:
    """Markdown rows: each phase, and of each part its own phases (what docs/benchmarks.md shows)."""
    rec = read(path_of(name))
    if rec is None:
        print(f"[times] no record {path_of(name)}", file=sys.stderr)
        return 1
    rev = rec.get("revision") or {}
    print(f"{rec['what']} at {rev.get('commit')}{' (uncommitted changes)' if rev.get('dirty') else ''}, "
          f"{rec.get('started_at', '?')}, {rec['machine']['cpus']} cores, load average {rec['machine']['loadavg'][0]:.1f}:\n")
    print("| phase | wall time | what |")
    print("|---|---|---|")
    parts = rec.get("parts") or {}
    for p in rec["phases"]:
        key = p["name"].removeprefix("make ")
        part = parts.get(key)
        what = ""
        if part and part.get("what") == "pytest":
            c = ", ".join(f"{n} {k}" for k, n in part["counts"].items())
            what = f"{len(part['tests'])} tests ({c}), {fmt(part['test_time_s'])} of test time on {part.get('workers')} workers"
        elif part:
            what = "; ".join(f"{q['name']} {fmt(q['wall_s'])}" + (f" ({len(q['suite']['scenarios'])} scenarios)"
                                                                  if "suite" in q else "") for q in part["phases"])
        print(f"| `{p['name']}` | {fmt(p['wall_s'])} | {what} |")
    print(f"| all | {fmt(total(rec))} | |")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cmd: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, cmd = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="action", required=True)
    sub.add_parser("start").add_argument("name")
    p = sub.add_parser("phase")
    p.add_argument("name")
    p.add_argument("label")
    p.add_argument("--suite-run", help="the suite run the command writes (reports/SUITE/latest)")
    p.add_argument("--no-summary", action="store_true", help="print no summary when the command fails")
    s = sub.add_parser("summary")
    s.add_argument("name")
    s.add_argument("--parts", nargs="*", default=[], help="records of targets this run ran, taken into it")
    sub.add_parser("table").add_argument("name")
    args = ap.parse_args(argv)
    if args.action == "start":
        start(args.name)
        return 0
    if args.action == "phase":
        if not cmd:
            ap.error("phase: give the command after --")
        return phase(args.name, args.label, cmd, args.suite_run, not args.no_summary)
    if args.action == "summary":
        return summary(args.name, args.parts)
    return table(args.name)


if __name__ == "__main__":
    sys.exit(main())
