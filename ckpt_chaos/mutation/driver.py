"""The driver of a mutation run: the copy of the tree, ``cosmic-ray init`` and the marks on its session
(which mutants count, the sample, the equivalent and the cached), ``cosmic-ray exec`` with a time
budget, a run resumed where it stopped (in a worktree of the commit it began at, when the code has
moved on since), and the results written at the end."""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable

from ckpt_chaos.mutation import (EQUIVALENT_MARK, NOT_SAMPLED, OUT_OF_SCOPE, OUTCOME, ROOT, SLACK_S, WORK,
                                 MutationError, tool)
from ckpt_chaos.mutation.cache import cached, fingerprint, remember
from ckpt_chaos.mutation.equivalence import equivalent_reason, load_equivalent
from ckpt_chaos.mutation.results import collect, figures, is_sample, killers, mutant, results_name, write_results
from ckpt_chaos.mutation.scope import (OPERATOR_SETS, TARGETS, baseline, deadlines, make_baseline, scope_lines,
                                       select, statement_line, target)
from ckpt_chaos.mutation.verdict import cosmic_ray_command


def needs() -> None:
    """The extras a run needs, or the error that names the one missing and how to install it."""
    from ckpt_chaos.extras import missing_extra

    for extra in ("mutation", "coverage"):
        if why := missing_extra(extra):
            raise MutationError(f"make mutation {why}")


# ---- which mutants the session runs -----------------------------------------------------------------

def _provider(operator_name: str) -> str:
    return operator_name.partition("/")[0]


def _wanted(spec, only: list[str]) -> bool:
    """``--mutant FILE:LINE[:OPERATOR[:OCCURRENCE]]``: whether the mutation is one of those named."""
    here = [spec.module_path.as_posix(), str(spec.start_pos[0]), spec.operator_name, str(spec.occurrence)]
    return any(here[:len(parts)] == parts for parts in (o.split(":") for o in only))


def annotate(session: Path, base: dict, files: list[str], limit: int | None, seed: int,
             equivalent: list[dict], only: list[str] | None = None, operators: str = "core",
             cache: Path | None = None, print_: str = "", targets: dict = TARGETS) -> dict[str, int]:
    """Before ``exec``: mark as done (cosmic-ray's SKIPPED, as its filters do) the mutants out of the
    checkpoint path, out of the sample (or not named with ``only``) or equivalent. What is left
    pending is what ``exec`` runs, in random order. A mutant on a line no scenario reaches is
    counted here but left pending too: its test command answers "not reached" at once, and a run cut
    short by ``--budget`` then leaves a random share of every kind pending, not of the others only,
    which would weigh those not reached more than the rest. Mutants of operators not in
    ``operators`` are out of scope; one whose verdict is in ``cache`` gets it from there."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

    def done(db, job, output):
        db.set_result(job, WorkResult(output=output, worker_outcome=WorkerOutcome.SKIPPED))

    providers = OPERATOR_SETS[operators]
    counts = dict.fromkeys(("out of scope", "not sampled", "equivalent", "not reached", "to run", "cached"), 0)
    with use_db(str(session), WorkDB.Mode.open) as db:
        items = sorted(db.pending_work_items, key=lambda i: (i.mutations[0].module_path.as_posix(),
                                                              i.mutations[0].start_pos, i.mutations[0].operator_name,
                                                              i.mutations[0].occurrence))
        sources = {f: (ROOT / f).read_text() for f in files}
        scopes = {f: scope_lines(f, sources[f], targets) for f in files}
        inside = []
        for item in items:
            spec = item.mutations[0]
            scope = scopes[spec.module_path.as_posix()]
            if (scope is not None and spec.start_pos[0] not in scope or only and not _wanted(spec, only)
                    or _provider(spec.operator_name) not in providers):
                done(db, item.job_id, OUT_OF_SCOPE)
                counts["out of scope"] += 1
            else:
                inside.append(item)
        chosen = inside
        if limit is not None and limit < len(inside):
            keep = set(random.Random(seed).sample(range(len(inside)), limit))
            chosen = [it for i, it in enumerate(inside) if i in keep]
            for i, it in enumerate(inside):
                if i not in keep:
                    done(db, it.job_id, NOT_SAMPLED)
                    counts["not sampled"] += 1
        for item in chosen:
            m = mutant(item)
            if (reason := equivalent_reason(equivalent, m)) is not None:
                done(db, item.job_id, EQUIVALENT_MARK + reason)
                counts["equivalent"] += 1
            elif not select(base, m["file"], [statement_line(sources[m["file"]], m["line"])]):
                counts["not reached"] += 1
            elif (hit := cached(cache, m, print_)) is not None:
                db.set_result(item.job_id, WorkResult(
                    output=OUTCOME + json.dumps({**hit, "cached": True}), worker_outcome=WorkerOutcome.NORMAL,
                    test_outcome=TestOutcome.KILLED if hit["status"] == "killed" else TestOutcome.SURVIVED))
                counts["cached"] += 1
            else:
                counts["to run"] += 1
    return counts


def run_args(args: argparse.Namespace) -> list[str]:
    """What each mutant's ``ckpt-chaos run`` is given besides its scenarios: how they run, not what."""
    out = ["-n", args.jobs] if args.jobs else []
    if args.executor:
        out += ["--executor", args.executor]
    for flag, value in (("--slurm-nodes", args.slurm_nodes), ("--slurm-conf", args.slurm_conf)):
        if value:
            out += [flag, value]
    return out


# ---- the whole run ----------------------------------------------------------------------------------

def _copy_tree(dest: Path) -> None:
    """The repository's tracked files, as they are in the working tree, into ``dest``."""
    if dest.exists():
        shutil.rmtree(dest)
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if listed.returncode != 0:
        raise MutationError(f"{ROOT}: not a git checkout ({listed.stderr.decode().strip()}); the mutants go into a "
                            "copy of its tracked files: run from a clone")
    files = listed.stdout
    for name in filter(None, files.decode().split("\0")):
        src = ROOT / name
        if src.is_file() and not src.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def _exec(cosmic: str, config: Path, session: Path, tree: Path, log: Path, budget: float | None,
          total: int) -> None:
    """``cosmic-ray exec`` in the copy (it writes each mutant there and runs the test command there),
    showing each outcome as it comes; stopped after ``budget`` seconds."""
    log.write_text("")
    started = time.monotonic()
    proc = subprocess.Popen([cosmic, "exec", str(config), str(session)], cwd=tree,
                            env={**os.environ, "PYTHONSAFEPATH": "1"})
    shown = 0
    try:
        while True:
            done = proc.poll() is not None
            lines = log.read_text().splitlines()
            for i, line in enumerate(lines[shown:], shown + 1):
                print(f"[{i}/{total}] {line}", flush=True)
            shown = len(lines)
            if done:
                break
            if budget is not None and time.monotonic() - started > budget:
                print(f"--budget {budget:.0f}s spent: the mutant running is stopped and left pending", flush=True)
                _stop_exec(proc)
                return
            time.sleep(5)
    except KeyboardInterrupt:
        _stop_exec(proc)
        raise
    if proc.returncode != 0:
        raise MutationError(f"cosmic-ray exec {config} {session} exited {proc.returncode}; its output is above")


def _stop_exec(proc: subprocess.Popen) -> None:
    """Stop ``cosmic-ray exec`` between results: cosmic-ray first, so that the mutant running gets no
    result (it stays pending), then its test command and the harness under it, which stop their
    jobs on SIGTERM, then whatever is left. Each result already recorded is in the session."""
    import psutil

    try:
        below = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        below = []
    proc.kill()
    proc.wait()
    for p in below:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(below, timeout=SLACK_S)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def report_only(args: argparse.Namespace) -> int:
    """The results again from the last run's session, e.g. after marking an equivalent mutant."""
    work = Path(args.work).resolve()
    if not (work / "run.json").is_file():
        raise MutationError(f"--report-only: no run in {work} (no run.json); run the mutants first, or give "
                            "the --work folder of one")
    run = json.loads((work / "run.json").read_text())
    return _report(work / "session.sqlite", run["command"], run["extra"], Path(args.results))


def resume(args: argparse.Namespace) -> int:
    """Go on with the last run's pending mutants (those a --budget cut off), in a fresh copy of the
    tree, and write the results of the whole run."""
    needs()
    work = Path(args.work).resolve()
    for need in ("run.json", "state.json", "session.sqlite", "cosmic-ray.toml"):
        if not (work / need).is_file():
            raise MutationError(f"--resume: no {need} in {work}; start a run without --resume, or give the "
                                "--work folder of one")
    from cosmic_ray.work_db import WorkDB, use_db

    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    run = json.loads((work / "run.json").read_text())
    unchanged_since(work, run)
    moved(work)
    equivalent, pending = load_equivalent(), 0
    with use_db(str(work / "session.sqlite"), WorkDB.Mode.open) as db:
        for item in list(db.pending_work_items):  # marked equivalent since: not worth a run
            if (reason := equivalent_reason(equivalent, mutant(item))) is not None:
                db.set_result(item.job_id, WorkResult(output=EQUIVALENT_MARK + reason,
                                                      worker_outcome=WorkerOutcome.SKIPPED))
            else:
                pending += 1
    if args.jobs is not None or args.executor is not None:  # how the rest runs: the verdicts do not depend on it
        state = json.loads((work / "state.json").read_text())
        state["run_args"] = run_args(args)
        (work / "state.json").write_text(json.dumps(state))
    _copy_tree(work / "tree")  # a stopped exec may have left its mutant in the copy
    run["command"] += " && python -m ckpt_chaos.mutation --resume" + (f" --budget {args.budget:g}" if args.budget else "")
    _timed_exec(work, run, lambda: _exec(tool("cosmic-ray"), work / "cosmic-ray.toml", work / "session.sqlite",
                                         work / "tree", work / "mutants.log", args.budget, pending))
    return _report(work / "session.sqlite", run["command"], run["extra"], Path(args.results))


def moved(work: Path) -> None:
    """A run resumed from another checkout of the same code (a worktree of the commit it began at):
    its mutants are compared with, and their golden runs keyed by, this checkout; and cosmic-ray's
    test command is this interpreter's ``python -m ckpt_chaos.mutation test``, whichever command the
    run began with."""
    state = json.loads((work / "state.json").read_text())
    old = Path(state["pristine"])
    if old != ROOT:
        state["pristine"] = str(ROOT)
        if state.get("scenarios"):
            state["scenarios"] = str(ROOT / Path(state["scenarios"]).relative_to(old))
        (work / "state.json").write_text(json.dumps(state))
    config = work / "cosmic-ray.toml"
    line = f"test-command = {json.dumps(cosmic_ray_command(work))}"
    config.write_text(re.sub(r"(?m)^test-command = .*$", lambda _: line, config.read_text()))


def _commit(fingerprinted: tuple[str, ...]) -> str | None:
    """The commit the checkout is at, where what the verdicts depend on (``fingerprinted``) is as committed."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", *fingerprinted], cwd=ROOT, capture_output=True,
                           text=True)
    return head.stdout.strip() or None if head.returncode == 0 and not dirty.stdout.strip() else None


def unchanged_since(work: Path, run: dict) -> None:
    """A resumed run's verdicts must all be of one tree: the trainer, the harness and the scenarios
    (their fingerprint) as they were when the run began, or the pending mutants would run against
    other code and be cached under the old fingerprint."""
    began = (run["extra"].get("cache") or {}).get("fingerprint")
    if not began:
        return
    state = json.loads((work / "state.json").read_text())
    aim = target(run["extra"]["sample"].get("example"))
    if fingerprint(state["base"], state["files"], fingerprinted=aim["fingerprinted"]) != began:
        commit = run["extra"].get("commit")
        where = (f"go on in a worktree of the commit it began at: git worktree add ../at-{commit[:7]} {commit} && "
                 f"cd ../at-{commit[:7]} && python -m ckpt_chaos.mutation {' '.join(run['extra'].get('flags', []))} "
                 f"--resume --work {work}" if commit else "check out the commit it began at to go on (git log)")
        raise MutationError(f"--resume: {', '.join(aim['fingerprinted'])} changed since the run in {work} began, so "
                            f"its pending mutants would run against other code than its verdicts so far; {where}; "
                            "or start a new run without --resume")


def _report(session: Path, command: str, extra: dict, results: Path) -> int:
    mutants = collect(session, equivalent=load_equivalent())
    cache = extra.get("cache") or {}
    remember(Path(cache["dir"]) if cache.get("dir") else None, mutants, cache.get("fingerprint", ""))
    path = write_results(mutants, command, results=results, extra=extra)
    f = figures(mutants, sampled=is_sample(mutants, extra))["totals"]
    ci = f" (95 % interval {f['score_ci95'][0]}-{f['score_ci95'][1]})" if f.get("score_ci95") else ""
    print(f"score {f['score']}{ci}: {f['killed']} killed of {f['total'] - f['equivalent'] - f['pending']} "
          f"({f['survived']} survived, {f['not reached']} not reached, {f['timeout']} timed out, "
          f"{f['error']} errors, {f['equivalent']} equivalent, {f['pending']} pending); {path}")
    for op, c in figures(mutants)["operators"].items():
        print(f"  {op}: {c['killed']} killed of {c['total'] - c['equivalent'] - c['pending']} ({c['survived']} survived, "
              f"{c['not reached']} not reached, {c['equivalent']} equivalent, {c['pending']} pending)")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    needs()
    from ckpt_chaos.config import golden_tree

    if golden_tree() is not None:
        raise MutationError("$CKPT_CHAOS_GOLDEN_TREE is set: unset it, this script sets it for the mutants")
    aim = target(args.example)
    targets = aim["targets"]
    files = args.files or list(targets)
    for f in files:
        if f not in targets:
            raise MutationError(f"--files {f}: not on the checkpoint path; one of {', '.join(targets)}")
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    golden = Path(args.golden_dir).resolve() if args.golden_dir else work / "golden"
    suite = Path(args.coverage_from) if args.coverage_from else make_baseline(work, golden, aim["scenarios"])
    base = baseline(suite, targets)
    if args.coverage_from:
        if len(base["golden"]) > 1 and not args.golden_dir:
            raise MutationError(f"--coverage-from {suite}: its scenarios used several golden folders "
                                f"({', '.join(base['golden'])}); name the one to use with --golden-dir")
        golden = Path(args.golden_dir).resolve() if args.golden_dir else Path(base["golden"][0])
    if not base["walls"]:
        raise MutationError(f"{suite}: no scenario passed on the pristine tree; fix the baseline first")
    if base["not_passing"]:
        print(f"not used against mutants (they do not pass on the pristine tree): {', '.join(base['not_passing'])}")
    tree = work / "tree"
    _copy_tree(tree)
    state = {"pristine": str(ROOT), "work": str(work), "files": files, "golden": str(golden), "base": base,
             "deadlines": deadlines(aim["scenarios"]), "keep_runs": args.keep_runs,
             "scenarios": str(ROOT / aim["scenarios"]) if aim["scenarios"] else None,
             "golden_tree": str(Path(args.golden_tree).resolve()) if args.golden_tree else None,
             "run_args": run_args(args),
             "killers": killers(Path(args.results) / f"{results_name(args.operators, args.example)}.json")}
    (work / "state.json").write_text(json.dumps(state))
    # only a backstop: the test command stops the harness first (see run_mutant)
    backstop = sum(state["deadlines"].get(n, 300.0) + SLACK_S for n in base["walls"]) + 2 * SLACK_S
    config = work / "cosmic-ray.toml"
    config.write_text("[cosmic-ray]\n" f"module-path = {json.dumps(files)}\n" f"timeout = {backstop:.0f}\n"
                      "excluded-modules = []\n" f"test-command = {json.dumps(cosmic_ray_command(work))}\n\n"
                      "[cosmic-ray.distributor]\nname = \"local\"\n")
    session = work / "session.sqlite"
    session.unlink(missing_ok=True)
    cosmic = tool("cosmic-ray")
    subprocess.run([cosmic, "init", str(config), str(session)], cwd=tree, check=True)
    cache = None if args.no_cache else Path(args.cache).resolve()
    print_ = fingerprint(base, files, fingerprinted=aim["fingerprinted"])
    counts = annotate(session, base, files, args.limit, args.seed, load_equivalent(), args.mutant, args.operators,
                      cache, print_, targets)
    print("mutants: " + ", ".join(f"{v} {k}" for k, v in counts.items()), flush=True)
    command = "python -m ckpt_chaos.mutation" + (" " + shlex.join(args.argv) if args.argv else "")
    sample = {"limit": args.limit, "seed": args.seed, "files": files, "named": args.mutant,
              "operators": args.operators, **counts,
              **({"example": args.example, "scenarios": aim["scenarios"]} if args.example else {})}
    flags = ["--operators", args.operators] + (["--example", args.example] if args.example else [])
    run = {"command": command, "extra": {"sample": sample, "exec_wall_s": 0.0, "baseline": str(suite),
                                         "commit": _commit(aim["fingerprinted"]), "flags": flags,
                                         "cache": {"dir": None if cache is None else str(cache),
                                                   "fingerprint": print_}}}
    _timed_exec(work, run, lambda: _exec(cosmic, config, session, tree, work / "mutants.log", args.budget,
                                         counts["to run"] + counts["not reached"]))
    return _report(session, command, run["extra"], Path(args.results))


def _timed_exec(work: Path, run: dict, exec_: Callable[[], None]) -> None:
    """Run ``exec_``, keeping ``run`` (command, sample, wall time) in ``WORK/run.json`` before and after
    it, also when Ctrl-C stops it: ``--resume`` then goes on with this run, not the one before."""
    (work / "run.json").write_text(json.dumps(run))
    started = time.monotonic()
    try:
        exec_()
    finally:
        run["extra"]["exec_wall_s"] = round(run["extra"]["exec_wall_s"] + time.monotonic() - started, 1)
        (work / "run.json").write_text(json.dumps(run))


def work_dir(operators: str, example: str | None = None) -> Path:
    """The default --work: build/mutation, build/mutation-OPERATORS, build/mutation-OPERATORS-EXAMPLE."""
    return WORK.with_name(results_name(operators, example))
