"""The time of every phase in view, for `make chaos`, `make chaos-examples`, `.ci/run` and `.ci/nightly`.

Each of them keeps a record, ``reports/timings/NAME.json`` (``NAME.prev.json``: the run before,
which the summary compares against): the wall time and exit status of each phase and, for a phase
that ran a suite, every scenario's wall time and verdict (from the suite run's ``results.json``).
``make test`` writes its own, ``reports/timings/test.json`` (``tests/timings.py``); the record of
``.ci/run`` (``ci.json``) holds the records of the targets it ran, so one file has the time of every
phase, test and scenario of a CI run. Standard library only: it runs before ``make setup`` has made
the venv. No verdict rests on a time.

    python3 .ci/times.py start chaos                      # a fresh record (the old one becomes .prev)
    python3 .ci/times.py start nightly --resume           # go on with an unfinished record of this commit:
                                                          # a phase that passed in it is not run again
                                                          # (status 1: nothing to go on with, a fresh one)
    python3 .ci/times.py phase chaos search -- CMD ARG... # run CMD, record its time and exit status
                                                          # (failing: print the summary so far)
    python3 .ci/times.py phase chaos suite --suite-run reports/default/latest -- ckpt-chaos run ...
    python3 .ci/times.py summary chaos                    # print phases, slowest scenarios, changes
    python3 .ci/times.py summary ci --parts test chaos chaos-examples   # and take in those records
    python3 .ci/times.py phase nightly "make test-full" --keep reports/nightly/test-full.junit.xml -- make ...
    python3 .ci/times.py skip nightly "make compat" --reason "3 GiB free here"   # a phase that could not run
    python3 .ci/times.py summary nightly --parts test-full --failures   # and each phase's status, what failed
                                                          # by name, where its reports are; exit 1 if any
                                                          # (--finished: the run ended; no --resume of it)
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
FAILURES_SHOWN = 12  # names per phase in the --failures block, which must stay one screen
# Outcomes (tests/timings.py) and verdicts (results.json) listed as failures. A skipped scenario is
# one: it fails a --strict run, and a run without --strict that skipped one has not shown it passes.
FAILED_TESTS = ("failed", "error")
PASSING_VERDICTS = ("pass", "xfail")


def timings_dir() -> Path:
    return ROOT / "reports" / "timings"


def path_of(name: str) -> Path:
    return timings_dir() / f"{name}.json"


def prev_of(name: str) -> Path:
    return timings_dir() / f"{name}.prev.json"


def fmt(s: float) -> str:
    if s < 59.95:
        return f"{s:.1f} s"
    whole = round(s)  # before splitting, so 10,799.6 s reads 180 min 0 s, not 179 min 60 s
    return f"{whole // 60} min {whole % 60} s"


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


def resumable(rec: dict | None, rev: dict | None) -> str | None:
    """Why record ``rec`` cannot be gone on with in a tree at ``rev`` (None: it can): a resumed run must
    be the same code as the phases it keeps."""
    if rec is None:
        return "there is no record to go on with"
    if rec.get("finished"):
        return f"the run of {rec.get('started_at', '?')} finished"
    was = rec.get("revision") or {}
    if rev is None or not was:
        return "the commit is not known (git)"
    if rev.get("dirty") or was.get("dirty"):
        return "the tree " + ("has" if rev.get("dirty") else "had") + " uncommitted changes to tracked files"
    if was.get("commit") != rev.get("commit"):
        return f"the run of {rec.get('started_at', '?')} was at {was.get('commit')}, this tree is at {rev.get('commit')}"
    return None


def start(name: str, resume: bool = False) -> dict:
    if resume:
        rec = read(path_of(name))
        why = resumable(rec, revision())
        if why is None:
            now = time.time()
            kept = [p for p in rec["phases"] if p.get("exit_status") == 0]
            rec["dropped"] = rec.get("dropped", []) + [p for p in rec["phases"] if p not in kept]
            rec["phases"] = kept
            rec["resumed"] = rec.get("resumed", []) + [time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(now))]
            write(name, rec)
            print(f"[times] {name}: going on with the run of {rec['started_at']} at {rec['revision']['commit']}; "
                  f"kept, as passed: {', '.join(p['name'] for p in kept) or 'nothing'}", flush=True)
            return rec
        print(f"[times] {name}: nothing to go on with ({why}): a fresh run", flush=True)
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


def found_in(folder: str, since: float) -> list[str]:
    """Files a command wrote into ``folder`` since ``since`` (a search writes one per failure it found)."""
    try:
        files = [f for f in Path(folder).rglob("*") if f.is_file() and f.stat().st_mtime >= since - 1]
    except OSError:
        return []
    return sorted(shown_path(f) for f in files)


def shown_path(p: str | Path) -> str:
    """A path as printed: relative to the repository when inside it."""
    p = Path(p)
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def phase(name: str, label: str, cmd: list[str], suite: str | None, summary_on_failure: bool = True,
          keep: list[str] | None = None, found: str | None = None, note: str | None = None) -> int:
    rec = read(path_of(name)) or start(name)
    done = next((p for p in rec["phases"] if p["name"] == label and p.get("exit_status") == 0), None)
    if rec.get("resumed") and done is not None:
        print(f"[times] {name}: phase {label!r} passed in {fmt(done['wall_s'])} before the run was resumed; "
              "not run again", flush=True)
        return 0
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
    if suite and (ran := scenarios_of(suite_run(suite), t0)) is not None:
        entry["suite"] = ran
    if keep:
        entry["keep"] = keep
    if found:
        entry["found"] = found_in(found, t0)
    if note:
        entry["note"] = note
    rec = read(path_of(name)) or rec
    rec["phases"].append(entry)
    write(name, rec)
    print(f"[times] {name}: phase {label!r} took {fmt(entry['wall_s'])} (exit status {rc})", flush=True)
    if rc != 0 and summary_on_failure:  # make stops at a failed phase: the times so far, before it does
        summary(name, [])
    return rc


def skip(name: str, label: str, reason: str, allowed: bool, note: str | None = None) -> int:
    """Record a phase that did not run here: a failure of the run unless ``allowed``."""
    rec = read(path_of(name)) or start(name)
    entry = {"name": label, "wall_s": 0.0, "exit_status": None, "skipped": reason, "skip_allowed": allowed}
    if note:
        entry["note"] = note
    rec["phases"].append(entry)
    write(name, rec)
    print(f"[times] {name}: phase {label!r} SKIPPED: {reason}" + ("" if allowed else " (counts as a failure)"),
          flush=True)
    return 0 if allowed else 1


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


def _counted(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {k}" for k, n in counts.items())


def verdict_counts(run: dict) -> dict[str, int]:
    """How many scenarios of a suite run got each verdict, in the order they first appear."""
    counts: dict[str, int] = {}
    for s in run["scenarios"].values():
        counts[s["verdict"]] = counts.get(s["verdict"], 0) + 1
    return counts


def lines(rec: dict, prev: dict | None) -> list[str]:
    out = [f"==== times of {rec['what']}: {fmt(total(rec))} in {len(rec['phases'])} phase(s); load average "
           f"{rec['machine']['loadavg'][0]:.1f} at the start on {rec['machine']['cpus']} cores ===="]
    if rec.get("resumed"):
        out.append(f"  started {rec['started_at']}, resumed {', '.join(rec['resumed'])}; each phase ran once "
                   "to its end (a phase cut short by the interruption ran again from its start)")
    before = {p["name"]: p for p in (prev or {}).get("phases", [])}
    for p in rec["phases"]:
        was = before.get(p["name"])
        change = f"  (last run {fmt(was['wall_s'])})" if was else ""
        extra = ""
        if "suite" in p:
            extra = (f": {len(p['suite']['scenarios'])} scenarios ({_counted(verdict_counts(p['suite']))}), "
                     f"{fmt(sum(s['wall_s'] for s in p['suite']['scenarios'].values()))} of scenario time")
        if "skipped" in p:
            out.append(f"  {'SKIPPED':>12}  {p['name']}: {p['skipped']}")
            continue
        out.append(f"  {fmt(p['wall_s']):>12}  {p['name']}{extra}; exit status {p['exit_status']}{change}")
    for key, part in (rec.get("parts") or {}).items():
        if part.get("what") == "pytest":
            out.append(f"  {key}: {len(part['tests'])} tests ({_counted(part['counts'])}) in {fmt(part['wall_s'])}, "
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


def part_of(phase_name: str, parts: dict) -> dict | None:
    """The record a ``make TARGET ...`` phase wrote of its own (``--parts``), if it was taken in."""
    words = phase_name.split()
    return parts.get(words[1]) if len(words) > 1 and words[0] == "make" else None


def failed_phase(p: dict) -> bool:
    return not p.get("skip_allowed") if "skipped" in p else p["exit_status"] != 0


def status_of(p: dict) -> str:
    if "skipped" in p:
        return "SKIPPED"
    rc = p["exit_status"]
    return "passed" if rc == 0 else "INTERRUPTED" if rc == 130 else f"FAILED ({rc})"




def phase_failures(p: dict, part: dict | None) -> tuple[str, list[str], list[str]]:
    """What a phase ran (one clause), the failures by name (``verdict name``), and where its reports are."""
    what, names, where = [], [], []
    runs = [p["suite"]] if "suite" in p else []
    if part and part.get("what") == "pytest":
        tests = part.get("tests", {})
        bad = sorted(n for n, t in tests.items() if t.get("outcome") in FAILED_TESTS)
        what.append(f"{len(tests)} tests ({_counted(part.get('counts', {}))})")
        names += [f"{tests[n]['outcome']:<7} {n}" for n in bad]
    elif part:
        runs += [q["suite"] for q in part.get("phases", []) if "suite" in q]
    for run in runs:
        sc = run["scenarios"]
        what.append(f"{len(sc)} scenarios ({_counted(verdict_counts(run))})")
        names += [f"{s['verdict']:<7} {n}" for n, s in sorted(sc.items()) if s["verdict"] not in PASSING_VERDICTS]
        where.append(f"report  {shown_path(Path(run['run']) / 'index.html')}")
    if "found" in p:
        what.append(f"{len(p['found'])} finding(s)")
        names += [f"{'found':<7} {f}" for f in p["found"]]
    for k in p.get("keep", []):
        where.append(f"{'junit' if k.endswith('.xml') else 'output':<7} {k}"
                     + ("" if (ROOT / k).exists() else "  (not written)"))
    return "; ".join(what), names, where


def failures(rec: dict) -> list[str]:
    """One screen: each phase's status and wall time, what failed by name, where the reports are."""
    parts = rec.get("parts") or {}
    bad = [p for p in rec["phases"] if failed_phase(p)]
    skipped = sum(1 for p in rec["phases"] if "skipped" in p)
    verdict = (f"FAILED: {len(bad)} of {len(rec['phases'])} phases" if bad else
               f"no phase of {len(rec['phases'])} failed" + (f", {skipped} skipped" if skipped else ""))
    out = [f"==== {rec['what']}: {verdict}; {fmt(total(rec))} ====",
           f"  {'status':<13} {'wall time':>12}  phase"]
    for p in rec["phases"]:
        what, names, where = phase_failures(p, part_of(p["name"], parts))
        if "skipped" in p:
            what = p["skipped"] + ("" if p.get("skip_allowed") else "; counts as a failure")
        out.append(f"  {status_of(p):<13} {fmt(p['wall_s']):>12}  {p['name']}" + (f": {what}" if what else ""))
        pad = " " * 31
        out += [f"{pad}{n}" for n in names[:FAILURES_SHOWN]]
        if len(names) > FAILURES_SHOWN:
            out.append(f"{pad}... and {len(names) - FAILURES_SHOWN} more (the JUnit file and report list them)")
        out += [f"{pad}{w}" for w in where]
        if p.get("note"):
            out.append(f"{pad}{p['note']}")
    out.append(f"  record: {shown_path(path_of(rec['what']))} (every phase, test and scenario, with its time)")
    return out


def summary(name: str, parts: list[str], with_failures: bool = False, finished: bool = False) -> int:
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
    if finished:
        rec["finished"] = time.time()
        write(name, rec)
    if not with_failures:
        return 0
    for line in failures(rec):
        print(line)
    return 1 if any(failed_phase(p) for p in rec["phases"]) else 0


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
        part = part_of(p["name"], parts)
        what = f"skipped: {p['skipped']}" if "skipped" in p else ""
        if part and part.get("what") == "pytest":
            what = f"{len(part['tests'])} tests ({_counted(part['counts'])}), {fmt(part['test_time_s'])} of test time on {part.get('workers')} workers"
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
    st = sub.add_parser("start")
    st.add_argument("name")
    st.add_argument("--resume", action="store_true",
                    help="go on with the record if it is an unfinished run of this commit (a clean tree): "
                         "phases that passed in it are not run again; otherwise a fresh record, exit status 1")
    p = sub.add_parser("phase")
    p.add_argument("name")
    p.add_argument("label")
    p.add_argument("--suite-run", help="the suite run the command writes (reports/SUITE/latest)")
    p.add_argument("--no-summary", action="store_true", help="print no summary when the command fails")
    p.add_argument("--keep", action="append", default=[], metavar="PATH",
                   help="a file or folder the command writes for people (a JUnit file); named in --failures")
    p.add_argument("--found", metavar="DIR", help="where the command writes one file per failure it finds")
    p.add_argument("--note", help="a line printed under the phase in --failures (how to reproduce it)")
    k = sub.add_parser("skip")
    k.add_argument("name")
    k.add_argument("label")
    k.add_argument("--reason", required=True)
    k.add_argument("--note")
    k.add_argument("--allowed", action="store_true", help="the skip does not fail the run")
    s = sub.add_parser("summary")
    s.add_argument("name")
    s.add_argument("--parts", nargs="*", default=[], help="records of targets this run ran, taken into it")
    s.add_argument("--finished", action="store_true",
                   help="the run has ended (not interrupted): a later start --resume begins a fresh one")
    s.add_argument("--failures", action="store_true",
                   help="then each phase's status, what failed by name and where its reports are; exit 1 if any failed")
    sub.add_parser("table").add_argument("name")
    args = ap.parse_args(argv)
    if args.action == "start":
        rec = start(args.name, args.resume)
        return 1 if args.resume and not rec.get("resumed") else 0
    if args.action == "phase":
        if not cmd:
            ap.error("phase: give the command after --")
        return phase(args.name, args.label, cmd, args.suite_run, not args.no_summary, args.keep, args.found, args.note)
    if args.action == "skip":
        return skip(args.name, args.label, args.reason, args.allowed, args.note)
    if args.action == "summary":
        return summary(args.name, args.parts, args.failures, args.finished)
    return table(args.name)


if __name__ == "__main__":
    sys.exit(main())
