"""The stacks' matrix, docs/stacks.md: a row per training stack audited in examples/ (docs/analyses/), a
column per kind of fault, each cell the verdicts its scenarios got in stored suite runs, linked to the
stack's analysis (no training: it reads results.json and each run's scenario.toml).

    .venv/bin/python benchmarks/stacks_matrix.py reports/compat/latest
    .venv/bin/python benchmarks/stacks_matrix.py build/stacks/*/compat/latest --stack ray_train

A run is any ``ckpt-chaos run`` folder (``make chaos-compat`` runs every stack's compat suite in one;
the other examples' trainers it holds are left out); a scenario met in several runs counts once, from
the run given last. A scenario's stack is the folder
of the script its ``[command]`` runs (``examples/deepspeed/train.py``: deepspeed); its column is read
from its faults as they ran (the run's own ``scenario.toml``), never from its name or tags.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections import Counter
from pathlib import Path

from ckpt_chaos.check.verdict import causal
from ckpt_chaos.scenario import load

REPO = Path(__file__).resolve().parent.parent
ANALYSES = REPO / "docs" / "analyses"

# (column, what it holds), in the table's order
COLUMNS = [
    ("kill mid-write", "SIGKILL while a checkpoint file is being written"),
    ("kill at the commit", "SIGKILL after the data, around the step that makes the save count (rename, pointer, metadata)"),
    ("stalled rank, then kill", "one rank held mid-save while the others go on, then every rank killed"),
    ("kill between saves", "SIGKILL at a step, no save under way"),
    ("kill in the relaunch's load", "a fault, then the relaunch killed while it loads"),
    ("SIGTERM", "SIGTERM (a preemption notice), to one rank or all"),
    ("disk full", "the checkpoint file system full (ENOSPC), or out of inodes"),
    ("I/O error", "a call on the checkpoint files failing (errno)"),
    ("power loss", "power cut; every directory entry no fsync made durable undone, un-fsynced data lost"),
    ("power loss, entries kept", "power cut; directory entries kept, un-fsynced data lost"),
]
WRITE_POINTS = {"file.write", "ckpt.shard.write", "faultfs.write"}
STEP_POINTS = {"step.begin", "step.end", "microstep.end"}


def column(faults) -> str:
    """The kind of fault a scenario's ``[[faults]]`` make, from what each is and where it fires."""
    if any(f.attempt > 0 for f in faults):
        return "kill in the relaunch's load"
    if any(f.kind == "stop" for f in faults):
        return "stalled rank, then kill"
    f = faults[0]
    if f.kind == "kill":
        if f.when.point in WRITE_POINTS:
            return "kill mid-write"
        return "kill between saves" if f.when.point in STEP_POINTS else "kill at the commit"
    if f.kind == "term":
        return "SIGTERM"
    if f.kind in ("disk_full", "inodes_full"):
        return "disk full"
    if f.kind == "errno":
        return "I/O error"
    if f.kind == "power_loss":
        return "power loss, entries kept" if f.params.mode == "entries-kept" else "power loss"
    return f.kind.replace("_", " ")


def stack_of(row: dict) -> str | None:
    source = (row.get("trainer") or {}).get("source") or ""
    parts = Path(source).parts
    return parts[1] if len(parts) >= 3 and parts[0] == "examples" else None


def outcome(row: dict) -> str:
    """The verdict, with the known failure it declares, or the first failing check that says why."""
    v = row.get("verdict", "error")
    if v in ("xfail", "xpass"):
        return f"{v}: {row.get('known_failure', '?')}"
    if v == "pass" or v == "skipped":
        return v
    checks = row.get("checks") or []
    first = (causal([c for c in checks if c.get("verdict") == "fail"])
             or causal([c for c in checks if c.get("verdict") == "unknown"]) or [{}])[0]
    return f"{v}: {first['name']}" if first.get("name") else v


def detail(row: dict) -> str:
    if row.get("verdict") == "pass":
        return ""
    text = row.get("reason") or ""
    return text if len(text) <= 220 else text[:217] + "..."


def results(run: Path) -> dict:
    path = run / "results.json"
    if not path.is_file():
        raise SystemExit(f"{run}: no results.json: give the folder of a `ckpt-chaos run` (reports/<suite>/<time>)")
    return json.loads(path.read_text())


def read_runs(runs: list[Path]) -> dict[tuple[str, str], dict]:
    """(stack, scenario) -> its row, with ``column`` added; the run given last wins."""
    rows = {}
    for run in runs:
        data = results(run)
        for row in data["results"]:
            stack = stack_of(row)
            if stack is None:
                continue
            toml = run / row["scenario"] / "scenario.toml"
            if not toml.is_file():
                raise SystemExit(f"{toml}: missing; the matrix reads each scenario's faults as they ran from it")
            rows[stack, row["scenario"]] = {**row, "column": column(load(toml).faults), "run": str(run)}
    return rows


def cell(rows: list[dict], link: str | None) -> str:
    if not rows:
        return ""
    counts = Counter(outcome(r) for r in rows)
    text = " · ".join(o if n == 1 else f"{o} ×{n}" for o, n in sorted(counts.items(), key=lambda x: x[0] != "pass"))
    return f"[{text}]({link})" if link else text


def analysis(stack: str) -> str | None:
    return f"analyses/{stack}.md" if (ANALYSES / f"{stack}.md").is_file() else None


def render(rows: dict[tuple[str, str], dict], stacks: list[str], argv: list[str],
           runs: list[tuple[str, str, int, float, str]] = ()) -> str:
    used = [c for c, _ in COLUMNS if any(r["column"] == c for r in rows.values())]
    used += sorted({r["column"] for r in rows.values()} - set(used))
    head = ["stack", *used]
    lines = ["# The stacks under faults", "",
             "Generated from stored suite runs by", "", "```",
             " ".join([".venv/bin/python benchmarks/stacks_matrix.py", *map(shlex.quote, argv)]), "```", "",
             "Do not edit: run the command again. Each folder it names is a stored `ckpt-chaos run` of "
             "`examples/<stack>/scenarios` (`make chaos-compat` runs every stack's suite `compat` in one); a scenario "
             "in several counts once, from the folder named last. A cell holds the verdict of each "
             "scenario of that kind of fault: `pass`; `xfail: CHECK`, a framework failure the scenario declares "
             "as a known failure (`expect.known_failure`), which the linked analysis shows with its source lines "
             "and a plain reproduction; `fail: CHECK` or `unknown: CHECK`, the first check that failed; an empty "
             "cell, no scenario of that kind in the runs.", ""]
    lines += ["The runs read:", ""]
    lines += [f"* `{run}`: suite `{suite}`, {n} scenario(s) in {wall:.0f} s, ckpt-chaos {version}"
              for run, suite, n, wall, version in runs]
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for stack in stacks:
        mine = [r for (s, _), r in rows.items() if s == stack]
        link = analysis(stack)
        name = f"[{stack}]({link})" if link else stack
        if not mine:
            lines.append("| " + " | ".join([name + " (no stored run)", *[""] * len(used)]) + " |")
            continue
        lines.append("| " + " | ".join([name, *(cell([r for r in mine if r["column"] == c], link) for c in used)])
                     + " |")
    lines += ["", "The kinds of fault:", ""]
    lines += [f"* **{c}**: {what}" for c, what in COLUMNS if c in used]
    lines += ["", "## Each scenario", "",
              "| stack | scenario | kind of fault | verdict | why, from the run |", "|---|---|---|---|---|"]
    for (stack, name), r in sorted(rows.items()):
        why = detail(r).replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {stack} | `{name}` | {r['column']} | {outcome(r)} | {why} |")
    missing = [s for s in stacks if not any(k[0] == s for k in rows)]
    if missing:
        lines += ["", "No stored run was given for: " + ", ".join(
            f"{s} (its scenarios: `examples/{s}/scenarios/`)" for s in missing) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", type=Path, nargs="+", help="suite run folders, each holding results.json")
    p.add_argument("--stack", action="append", default=[],
                   help="a stack (examples/NAME) to give a row though it has no analysis yet (repeatable); the rows "
                        "are these and every stack with docs/analyses/NAME.md")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "stacks.md")
    args = p.parse_args(argv)
    stacks = sorted({a.stem for a in ANALYSES.glob("*.md")} | set(args.stack))
    rows = {k: r for k, r in read_runs(args.runs).items() if k[0] in stacks}  # not the other examples' trainers
    read = [(str(r), d.get("suite", "?"), len(d["results"]), d.get("wall_s") or 0.0, d.get("tool_version", "?"))
            for r, d in ((r, results(r)) for r in args.runs)]
    args.out.write_text(render(rows, stacks, argv, read))
    print(f"{args.out}: {len(stacks)} stacks, {len(rows)} scenarios")
    return 0


if __name__ == "__main__":
    sys.exit(main())
