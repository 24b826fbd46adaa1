"""One mutant's verdict: the test command cosmic-ray runs in the copy of the tree after it wrote a
mutant there. It finds the lines the mutant changed, runs the baseline's scenarios that reach them,
cheapest first (the scenario that killed the same change last time first), under the harness of the
pristine checkout, and stops at the first failure."""

from __future__ import annotations

import difflib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ckpt_chaos.mutation import NOT_REACHED, OUTCOME, SLACK_S, tool
from ckpt_chaos.mutation.equivalence import text_change
from ckpt_chaos.mutation.results import killer_first
from ckpt_chaos.mutation.scope import select, statement_line


def cosmic_ray_command(work: Path) -> str:
    """The test command of a run in ``work``, as cosmic-ray's config holds it. ``-P`` keeps the current
    directory, the copy that holds the mutant, off the module path: the harness it imports is that
    of the checkout ``$PYTHONPATH`` names first (the driver's own, ``__main__.own_checkout_first``)."""
    return shlex.join([sys.executable, "-P", "-m", "ckpt_chaos.mutation", "test", "--state", str(work / "state.json")])


def _mutated_lines(state: dict) -> tuple[str, list[int]] | None:
    """The file the mutant changed (in the current directory, against the pristine tree) and the
    statement lines of the pristine file it touches."""
    for file in state["files"]:
        old = (Path(state["pristine"]) / file).read_text()
        new = Path(file).read_text()
        if old == new:
            continue
        touched = set()
        for tag, i1, i2, _, _ in difflib.SequenceMatcher(None, old.split("\n"), new.split("\n")).get_opcodes():
            if tag != "equal":
                touched.update(range(i1 + 1, max(i2, i1 + 1) + 1))
        return file, sorted({statement_line(old, line) for line in touched})
    return None


def run_mutant(state: dict) -> dict:
    """Run the scenarios that reach the mutated lines, cheapest first, to the first failure."""
    found = _mutated_lines(state)
    if found is None:
        return {"status": "error", "detail": "no target file differs from the pristine tree"}
    file, lines = found
    names = select(state["base"], file, lines)
    if not names:
        return {"status": "survived", "detail": NOT_REACHED, "lines": lines}
    names = killer_first(names, state.get("killers", []), file,
                         text_change((Path(state["pristine"]) / file).read_text(), Path(file).read_text()))
    reports = Path(state["work"]) / "runs"
    timeout = sum(state["deadlines"].get(n, 300.0) + SLACK_S for n in names)
    cmd = [tool("ckpt-chaos"), "run", "-x", "--plots", "none", "--golden-dir", state["golden"],
           "--reports", str(reports), *state.get("run_args", []), *names]
    if state.get("scenarios"):  # an example's: named, they are found in its folder (the pristine one)
        cmd[2:2] = ["--scenarios", state["scenarios"]]
    env = {**os.environ, "PYTHONSAFEPATH": "1", "CKPT_CHAOS_GOLDEN_TREE": state.get("golden_tree") or state["pristine"]}
    started = time.monotonic()
    with open(Path(state["work"]) / "runs.log", "ab") as log:
        log.write(f"\n== {file}:{','.join(map(str, lines))}: {shlex.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.send_signal(signal.SIGTERM)  # the harness stops its jobs and writes what it has
            try:
                proc.wait(SLACK_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    out = {"lines": lines, "planned": names, "wall_s": round(time.monotonic() - started, 1), "exit": proc.returncode}
    suite = reports / "custom" / "latest"
    rows = json.loads((suite / "results.json").read_text())["results"] if (suite / "results.json").is_file() else []
    out["ran"] = [r["scenario"] for r in rows]
    failed = next((r for r in rows if r["verdict"] not in ("pass", "skipped", "xfail")), None)
    if failed is not None:
        bad = [c for c in failed["checks"] if c["verdict"] in ("fail", "unknown")]
        out.update(status="killed", scenario=failed["scenario"], checks=[c["name"] for c in bad],
                   detail=(bad[0]["detail"] if bad else failed.get("reason", ""))[:400])
    elif timed_out:
        out.update(status="timeout", detail=f"no verdict after {timeout:.0f}s")
    elif proc.returncode not in (0, None) or len(rows) < len(names):
        out.update(status="error", detail=f"ckpt-chaos run exited {proc.returncode} with {len(rows)} of "
                                          f"{len(names)} results; see {Path(state['work']) / 'runs.log'}")
    else:
        out["status"] = "survived"
    if suite.exists() and not state.get("keep_runs"):
        shutil.rmtree(suite.resolve(), ignore_errors=True)
        suite.unlink(missing_ok=True)
    return out


def cmd_test(state_file: Path) -> int:
    """cosmic-ray's test command: the mutant now in the current directory against its scenarios; exit
    status 1 when they kill it."""
    state = json.loads(state_file.read_text())
    out = run_mutant(state)
    print(OUTCOME + json.dumps(out), flush=True)
    # cosmic-ray keeps the output to itself until the end; the driver shows this file as it grows
    where = f"{out.get('lines')}" if "lines" in out else ""
    with open(Path(state["work"]) / "mutants.log", "a") as log:
        log.write(f"{out['status']:<11} {out.get('wall_s', 0):5.0f}s  lines {where}  "
                  f"{out.get('scenario') or str(len(out.get('ran', []))) + ' scenario(s) passed'}\n")
    return 1 if out["status"] == "killed" else 0
