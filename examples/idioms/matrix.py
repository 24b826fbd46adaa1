"""The idiom matrix: every idiom of the corpus under every fault that applies to it, run through
ckpt-chaos and held to the verdict ``expect.py`` declares from the idiom's own semantics.

    python examples/idioms/matrix.py list [--sample] [-k WORDS]
    python examples/idioms/matrix.py write DIR [--sample] [-k WORDS]     # the scenario files only
    python examples/idioms/matrix.py run [--sample] [-k WORDS] [-n 2] [--out DIR] [--table docs/idioms.md]
    python examples/idioms/matrix.py table RESULTS.json... [--out docs/idioms.md]

``run`` writes a scenario per cell, runs them with ``ckpt-chaos run -n``, compares each verdict with
the expected one and writes ``matrix.json`` (every cell: expected, got, the first failing check and its
detail) beside the runs; with ``--table`` it also rewrites that file's generated table. ``--sample``
takes the cheapest cells that cover every idiom once and every fault kind once (make test's share).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import expect  # noqa: E402
from expect import EVERY, STEPS, TARGET, Expected, Fault  # noqa: E402
from idioms import IDIOMS, Idiom  # noqa: E402

from ckpt_chaos.audit.generate import toml_value  # noqa: E402  (the audit's scenario files are written the same way)

TRAINER_FILES = ("train.py", "saving.py", "loading.py")
# the relative cost of a cell, for the sample: a faultfs mount makes a golden run of its own and slows
# every call; a storage fault mounts a file system; a second relaunch is a third launch
COST = {"kill_faultfs_write": 3, "kill_before_rename": 3, "power_loss_undo": 3, "power_loss_entries_kept": 3,
        "kill_during_load": 4, "disk_full": 2, "inodes_full": 2}


OUTCOME = ("job_completed",)


@dataclass(frozen=True)
class Cell:
    idiom: Idiom
    fault: Fault

    @property
    def name(self) -> str:
        tail = self.fault.name.replace(":", "--").replace("/", "-").replace(".", "_")
        return f"idiom--{self.idiom.slug}--{tail}"

    @property
    def expected(self) -> Expected:
        return expect.expect(self.idiom, self.fault)


def cells(select: str = "") -> list[Cell]:
    """The cells whose idiom and fault names hold every word of ``select``; alternatives apart with ``|``."""
    out = [Cell(i, f) for i in IDIOMS for f in expect.faults(i)]
    if not select:
        return out
    return [c for c in out if any(all(w in f"{c.idiom.name} {c.fault.name}" for w in alt.split())
                                  for alt in select.split("|"))]


def sample(all_cells: list[Cell]) -> list[Cell]:
    """Every idiom once and every fault kind once, the cheapest cells that do it; broken idioms on a
    fault that exposes them where one is as cheap."""
    def cost(c: Cell) -> tuple:
        e = c.expected
        return (bool(c.idiom.broken) and e.verdict != "fail", COST.get(c.fault.kind, 1), e.verdict == "refused")
    chosen: dict[str, Cell] = {}
    for c in sorted(all_cells, key=cost):
        chosen.setdefault(c.idiom.name, c)
    kinds = {c.fault.kind for c in chosen.values()}
    for c in sorted(all_cells, key=cost):
        if c.fault.kind not in kinds:
            kinds.add(c.fault.kind)
            chosen[f"{c.idiom.name} {c.fault.kind}"] = c
    return list(chosen.values())


# ---- scenario files ----------------------------------------------------------------------------------

def complete(i: Idiom) -> str | dict:
    """``command.complete``: the pointer, or a glob of the entries its saves make (a framework's own name)."""
    if i.pointer != "none":
        return {"pointer": "latest"}
    if i.trainer == "dcp_train.py":  # its resume takes a folder only once DCP renamed .metadata into it
        return "step_*/.metadata"
    return expect.entry(i, 0).replace("step_0", "step_*", 1)


def trigger(c: Cell) -> tuple[list[dict], dict]:
    """The faults of the cell's scenario, and its [recovery] table."""
    i, f = c.idiom, c.fault
    late = expect.written_late(i)
    ckpt = "checkpoints/"
    if f.kind in ("kill_file_write", "kill_faultfs_write"):
        rank = next(r for r, p in expect.written_files(i) if p == f.file)
        point = "file.write" if f.kind == "kill_file_write" else "faultfs.write"
        if point == "file.write" and f.file.endswith(".distcp"):
            point = "ckpt.shard.write"  # the probe layer's name for a DCP shard's writes
        return [{"kind": "kill", "target": f"rank:{rank}",
                 "when": {"point": point, "rank": rank, "path": ckpt + f.file, "min_fraction": 0.5}}], {}
    if f.kind == "kill_before_rename":
        # what the save renames into place: its folder, DCP's .metadata (its shards keep their names), or
        # the data file
        data = expect.entry(i, TARGET) if i.commit == "tmp_folder" else expect.data_files(i, TARGET)[
            -1 if i.trainer == "dcp_train.py" else 0][1]
        return [{"kind": "kill", "target": "rank:0",
                 "when": {"point": "faultfs.rename", "rank": 0, "path": ckpt + data}}], {}
    if f.kind == "kill_mid_pointer":
        # 24 bytes a pointer: reported at 10 tenths, 6 of them at half or more; the 7th is the 2nd save's
        return [{"kind": "kill", "target": "rank:0",
                 "when": {"point": "file.write", "rank": 0, "path": ckpt + "latest", "min_fraction": 0.5,
                          "nth": 7}}], {}
    if f.kind == "kill_between_data_and_pointer":
        if i.pointer == "before_data":  # the pointer moved; the data's first tenth written
            data = expect.data_files(i, TARGET)[0][1]
            when = {"point": "file.write", "rank": 0, "path": ckpt + data, "min_fraction": 0.1}
        else:  # the data whole; the pointer's first tenth written (the 11th report of latest)
            when = {"point": "file.write", "rank": 0, "path": ckpt + "latest", "min_fraction": 0.1, "nth": 11}
        return [{"kind": "kill", "target": "rank:0", "when": when}], {}
    if f.kind.startswith("power_loss"):
        mode = "undo" if f.kind == "power_loss_undo" else "entries-kept"
        when = {"point": "step.begin", "rank": 0, "step": TARGET + 1 + late}
        if i.trainer == "dcp_train.py":  # DCP's last call of the save, in the writer's thread when async
            when = {"point": "file.rename", "rank": 0, "path": f"{ckpt}step_{TARGET}/.metadata"}
        return [{"kind": "power_loss", "mode": mode, "when": when}], {}
    if f.kind == "term_rank1":
        return [{"kind": "term", "target": "rank:1", "grace_s": 10.0,
                 "when": {"point": "step.begin", "rank": 1, "step": expect.TERM_AT}}], {}
    if f.kind in ("disk_full", "inodes_full"):
        # rank 0 held at the end of the step before: every rank's save of TARGET comes after the fill, as
        # the step between needs rank 0's gradients. Held at TARGET's own end, rank 0 would race the
        # other ranks, which go on to their part of the save (a mkdir, a shard) while the disk fills.
        return [{"kind": f.kind, "when": {"point": "step.end", "rank": 0, "step": TARGET - 1}}], {}
    if f.kind == "kill_during_load":
        data = expect.data_files(i, TARGET)[-1 if i.trainer == "dcp_train.py" else 0][1]  # DCP reads .metadata first
        if i.trainer == "dcp_train.py" and i.is_async:
            # the save of step 8 may still be in flight at the kill, and the relaunch then loads step_4:
            # the kill in the load is aimed at whichever checkpoint it loads, so it fires either way
            data = re.sub(r"step_\d+", "step_*", data)
        return [{"kind": "kill", "target": "all", "when": {"point": "step.begin", "rank": 0, "step": expect.LOAD_KILL_AT}},
                {"kind": "kill", "target": "rank:0", "attempt": 1,
                 "when": {"point": "faultfs.open", "rank": 0, "path": ckpt + data}}], {"max_restarts": 2}
    raise ValueError(f"no trigger for {f.kind}")


def scenario_toml(c: Cell) -> str:
    i, e = c.idiom, c.expected
    faults, recovery = trigger(c)
    trainer = f"examples/idioms/{i.trainer}"
    command = {"argv": [trainer, "--ckpt-dir", "{ckpt_dir}", "--steps", str(STEPS), "--save-every", str(EVERY),
                        *i.argv()],
               "key": [f"examples/idioms/{f}" for f in (TRAINER_FILES if i.trainer == "train.py" else (i.trainer, "train.py"))],
               "complete": complete(i), "save_every": EVERY}
    if i.writer == "staging" or i.tmpdir == "watched" and i.trainer == "fabric_train.py":
        command |= {"env": {"TMPDIR": "{run_dir}/tmp"}, "watch": ["tmp"]}
    elif i.tmpdir == "other_fs":
        command["env"] = {"TMPDIR": "/dev/shm"}  # a tmpfs: never the checkpoint folder's file system
    if i.is_async:
        command["saves_in_flight"] = 1  # training goes on while a save writes
    needs = [m for m, used in (("safetensors", i.writer == "safetensors"), ("lightning", "fabric" in i.trainer))
             if used]
    if needs:
        command["requires"] = needs
    lines = [f"description = {toml_value(f'{i.name} under {c.fault.name}: expected {e.verdict} ({e.why})')}",
             f"tags = {toml_value(['idioms', c.fault.kind])}", "world_size = 2", 'suites = ["idioms"]', "",
             "[command]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in command.items()]
    if c.fault.kind in ("disk_full", "inodes_full"):
        lines += ["", "[storage]", 'fs = "tmpfs"', "size_mb = 16"]
    for f in faults:
        lines += ["", "[[faults]]"] + [f"{k} = {toml_value(v)}" for k, v in f.items()]
    if recovery:
        lines += ["", "[recovery]"] + [f"{k} = {toml_value(v)}" for k, v in recovery.items()]
    return "\n".join(lines) + "\n"


def write(folder: Path, chosen: list[Cell]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("idiom--*.toml"):
        old.unlink()
    return [write_one(folder, c) for c in chosen]


# ---- comparing -----------------------------------------------------------------------------------------

def judge(c: Cell, row: dict) -> dict:
    """The cell's line: expected, got, the first failing check and its detail, and whether they agree."""
    e = c.expected
    # ckpt-chaos run -n gives a scenario whose trigger it refused a failed row whose reason quotes the error
    reason = row.get("reason") or ""
    error = row.get("harness_error") or (reason if "harness error" in reason else "")
    checks = row.get("checks") or []
    failing = [ch for ch in checks if ch.get("verdict") in ("fail", "unknown")]
    # the job's own outcome says that something failed, not what: the first check that says what
    telling = [ch for ch in failing if ch["name"] not in OUTCOME] or failing
    first = telling[0] if telling else None
    # a refusal names the fault's key it refuses; a fault-free run that failed is an error of the run
    got = "refused" if "ScenarioError" in error and ".when" in error else "error" if error \
        else row.get("verdict", "error")
    if e.verdict == "refused":
        agree = got == "refused" and all(w in error for w in e.cause)
    elif got == "refused" and e.refusal_ok:
        agree = e.refusal_ok in error
    elif e.verdict == "pass":  # and from the checkpoint the model says, where the harness names one
        resumed = (row.get("resumed_from") or [""])[-1]
        agree = got == "pass" and (not resumed or not e.resumed or resumed.endswith("/" + e.resumed)
                                   or resumed == e.resumed)
    else:
        named = [ch for ch in failing if ch.get("verdict") == "fail" and ch["name"] in e.checks
                 and all(w in (ch.get("detail") or "") for w in e.cause)]
        agree = got == "fail" and bool(named)
    return {"cell": c.name, "idiom": c.idiom.name, "fault": c.fault.name, "broken": c.idiom.broken,
            "expected": e.verdict, "expected_resume": e.resumed, "expected_checks": list(e.checks),
            "expected_cause": list(e.cause), "why": e.why, "got": got,
            "resumed_from": row.get("resumed_from") or [], "agree": agree,
            "first_failing": first["name"] if first else "",
            "detail": (first or {}).get("detail") or error[error.find("ScenarioError"):] if "ScenarioError" in error
            else (first or {}).get("detail") or error,
            "wall_s": row.get("wall_s"), "run_dir": row.get("run_dir", "")}


def run_cell(c: Cell, out: Path, golden_root: Path | None = None) -> dict:
    """One cell run in this process (``run_scenario``), judged: what a test of the sample does."""
    from ckpt_chaos.run.runner import run_scenario
    from ckpt_chaos.scenario import ScenarioError, load

    path = write_one(out / "scenarios", c)
    try:
        row = run_scenario(load(path), out / "runs", golden_root).to_dict()
    except ScenarioError as e:
        row = {"harness_error": f"ScenarioError: {e}"}
    return judge(c, row)


def write_one(folder: Path, c: Cell) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / f"{c.name}.toml"
    p.write_text(scenario_toml(c))
    return p


def run(chosen: list[Cell], out: Path, jobs: int) -> list[dict]:
    folder = out / "scenarios"
    paths = write(folder, chosen)
    cmd = [str(REPO / ".venv" / "bin" / "ckpt-chaos"), "run", *map(str, paths), "--out", str(out / "runs"),
           "-n", str(max(2, jobs)), "--json", "--plots", "none"]
    started = time.monotonic()
    log = out / "ckpt-chaos.log"
    with open(log, "w") as err:  # its progress, a line a scenario, as it goes
        proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        rows = {r["scenario"]: r for r in json.loads(proc.stdout)["results"]}
    except (ValueError, KeyError):  # cut short: the cells that finished left their result.json
        rows = {p.parent.name: json.loads(p.read_text())
                for p in (out / "runs").glob("reports/*/*/idiom--*/result.json")}
        if not rows:
            raise SystemExit(f"ckpt-chaos run gave no results (exit {proc.returncode}); its log: {log}") from None
    lines = [judge(c, rows.get(c.name, {"harness_error": "no row"})) for c in chosen]
    (out / "matrix.json").write_text(json.dumps({"wall_s": round(time.monotonic() - started, 1), "cells": lines},
                                                indent=1))
    return lines


# ---- the table -------------------------------------------------------------------------------------------

BEGIN, END = "<!-- matrix: generated by examples/idioms/matrix.py; do not edit -->", "<!-- end of matrix -->"


def tidy(detail: str) -> str:
    """A detail as the table shows it: no folder of the machine it ran on."""
    detail = re.sub(r"harness error in its worker \(exit status \d+; [^)]*\): ", "", detail or "")
    detail = re.sub(r"/\S*/golden/\S*?/([\w.]+)", r"the golden run's \1", detail)
    return re.sub(r"/\S*/scenarios/(idiom--\S*?\.toml)", r"\1", detail).replace(str(REPO) + "/", "")


def cell_text(line: dict) -> str:
    exp = line["expected"] + (f" ({', '.join(line['expected_checks'])})" if line["expected_checks"] else "")
    got = line["got"]
    if line["first_failing"] and got == "fail":
        got += f" ({line['first_failing']})"
    mark = "ok" if line["agree"] else "**DISAGREES**"
    detail = tidy(line["detail"]).replace("|", "/").replace("\n", " ")
    if len(detail) > 240:
        detail = detail[:237] + "..."
    return f"| `{line['idiom']}` | `{line['fault']}` | {exp} | {got} | {mark} | {detail} |"


def corpus() -> list[str]:
    rows = ["| idiom | trainer | switches (besides the defaults) | broken |", "|---|---|---|---|"]
    plain = Idiom().argv()
    for i in IDIOMS:
        argv = i.argv()
        shown = [f"{argv[n]} {argv[n + 1]}" for n in range(0, len(argv) - 1, 2)
                 if i.trainer == "train.py" and argv[n:n + 2] != plain[n:n + 2]] or argv
        rows.append(f"| `{i.name}` | `{i.trainer}` | `{' '.join(shown) or '(none)'}`"
                    + (f" (TMPDIR {'on another file system' if i.tmpdir == 'other_fs' else 'beside the checkpoints'})"
                       if i.trainer == "fabric_train.py" else "") + f" | {i.broken or 'no'} |")
    return rows


def faults_table() -> list[str]:
    return ["| fault | what |", "|---|---|"] + [f"| `{k}` | {v} |" for k, v in expect.FAULT_KINDS.items()]


def table(lines: list[dict]) -> str:
    ran = {(x["idiom"], x["fault"]) for x in lines}
    rows = ["| idiom | fault | expected | got | | cause (the first failing check's detail) |", "|---|---|---|---|---|---|"]
    rows += [cell_text(x) for x in sorted(lines, key=lambda x: (x["idiom"], x["fault"]))]
    pending = [c for c in cells() if (c.idiom.name, c.fault.name) not in ran]
    agree = sum(x["agree"] for x in lines)
    head = (f"{len(lines)} of {len(lines) + len(pending)} cells run: {agree} as expected, "
            f"{len(lines) - agree} disagreeing with the expected verdict.")
    bad = [x for x in sorted(lines, key=lambda x: (x["idiom"], x["fault"])) if not x["agree"]]
    disagree = ["", "Cells where the harness disagrees with the expected verdict:", ""] + [
        f"* `{x['idiom']}` under `{x['fault']}`: expected {x['expected']}"
        + (f" ({', '.join(x['expected_checks'])})" if x["expected_checks"] else "")
        + f", because {x['why']}; got {x['got']}"
        + (f", {x['first_failing'] or 'the run'}: {tidy(x['detail'])}" if x["detail"] else "")
        for x in bad] if bad else []
    rest = ["", f"Not run in the results this table was made from ({len(pending)}): expected verdicts only.", "",
            "| idiom | fault | expected | why |", "|---|---|---|---|"]
    rest += [f"| `{c.idiom.name}` | `{c.fault.name}` | {c.expected.verdict} | {c.expected.why} |" for c in pending]
    return "\n".join([BEGIN, "", "### The idioms", "", *corpus(), "", "### The faults", "", *faults_table(), "",
                      "### The matrix", "", head, *disagree, "", *rows, *(rest if pending else []), "", END])


def write_table(doc: Path, lines: list[dict]) -> None:
    text = doc.read_text() if doc.exists() else f"{BEGIN}\n{END}\n"
    before, _, after = text.partition(BEGIN)
    _, _, after = after.partition(END)
    doc.write_text(before + table(lines) + after)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("list", "write", "run"):
        s = sub.add_parser(name)
        s.add_argument("--sample", action="store_true")
        s.add_argument("-k", default="", help="words every chosen cell's idiom and fault names hold; "
                                              "alternatives apart with |")
        if name == "write":
            s.add_argument("folder", type=Path)
        if name == "run":
            s.add_argument("-n", type=int, default=int(os.environ.get("IDIOMS_JOBS", "2")))
            s.add_argument("--out", type=Path, default=REPO / "build" / "idioms")
            s.add_argument("--table", type=Path, default=None)
            s.add_argument("--skip", type=Path, nargs="*", default=[], metavar="MATRIX_JSON",
                           help="leave out the cells these earlier runs' matrix.json files hold")
    j = sub.add_parser("rejudge", help="judge the cells of earlier runs again (their results.json), as this "
                                        "model and judge say now; rewrites each OUT/matrix.json")
    j.add_argument("outs", type=Path, nargs="+")
    t = sub.add_parser("table")
    t.add_argument("results", type=Path, nargs="+")
    t.add_argument("--out", type=Path, default=REPO / "docs" / "idioms.md")
    args = p.parse_args(argv)
    if args.cmd == "table":
        lines = {}
        for r in args.results:
            lines.update({x["cell"]: x for x in json.loads(r.read_text())["cells"]})
        write_table(args.out, list(lines.values()))
        return 0
    if args.cmd == "rejudge":
        by_name = {c.name: c for c in cells()}
        for out in args.outs:
            rows = {}
            for results in sorted((out / "runs").glob("reports/*/*/results.json")):
                rows.update({r["scenario"]: r for r in json.loads(results.read_text())["results"]
                             if r.get("scenario") in by_name})
            lines = [judge(by_name[name], row) for name, row in rows.items()]
            (out / "matrix.json").write_text(json.dumps({"cells": lines}, indent=1))
            print(f"{out}: {len(lines)} cells, {sum(not x['agree'] for x in lines)} disagreeing")
        return 0
    chosen = cells(args.k)
    if args.sample:
        chosen = sample(chosen)
    if args.cmd == "list":
        for c in chosen:
            e = c.expected
            print(f"{c.name}\t{e.verdict}\t{e.why}")
        return 0
    if args.cmd == "run" and args.skip:
        done = {x["cell"] for m in args.skip for x in json.loads(m.read_text())["cells"]}
        chosen = [c for c in chosen if c.name not in done]
    if args.cmd == "write":
        for path in write(args.folder, chosen):
            print(path)
        return 0
    lines = run(chosen, args.out, args.n)
    for x in lines:
        print(f"{'ok ' if x['agree'] else 'BAD'} {x['idiom']}  {x['fault']}: expected {x['expected']}, got {x['got']}"
              + (f" ({x['first_failing']}: {x['detail'][:200]})" if not x["agree"] else ""))
    if args.table:
        write_table(args.table, lines)
    return 0 if all(x["agree"] for x in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
