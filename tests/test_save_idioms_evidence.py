"""The file evidence follows the save idioms trainers use, judged through the real harness on a
DeepSpeed-style trainer (tests/trainers/deepspeed_style.py, 2 ranks under torchrun) on faultfs, where
fanotify sees opens and closes but no renames: every rank writes its ``rankR_state.pt`` under a
temporary name with ``os.open``/``os.write``/``os.fsync``/``os.close``, renames it into place, and rank 0
then moves the ``latest`` pointer the same way. Rank 1 is SIGKILLed half-way through step 8's file.

Expected verdicts, from what the trainer's code does:

* the correct save (rank 0 with a fixed temporary name, ``rank0_state.pt.tmp`` and ``latest.tmp``,
  rank 1 with one named by its pid: both idioms in one run): ``latest`` still names ``global_step4``
  when the kill lands, both of its files whole, so the relaunch resumes from it:
  ``resumed_newest@1``, ``no_torn_read@1`` and ``committed_valid`` pass. The killed writer's
  temporary file, half written, is left in ``global_step8``, which the relaunch saves again; its
  loader opens ``rankR_state.pt`` by name and never reads it: reported as a stray, not a failure;
* written in place with the pointer moved first: ``latest`` names ``global_step8`` while rank 1's
  file there is half written; the relaunch's rank 1 loads it and dies, writing nothing, so the job
  ends counting that torn file complete: ``no_torn_read@1`` and ``committed_valid`` fail, the torn
  file named, although the launch that tore it was not the last.

Needs root and /dev/fuse (faultfs); skipped with the reason without them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_chaos.env.storage import Storage, StorageSpec, missing
from ckpt_chaos.run.runner import run_scenario
from ckpt_chaos.scenario import load
from tests.helpers import REPO

NO_FAULTFS = missing("host", faultfs=True)
needs_faultfs = pytest.mark.skipif(NO_FAULTFS is not None, reason=f"cannot mount faultfs here: {NO_FAULTFS}")

TRAINER = REPO / "tests" / "trainers" / "deepspeed_style.py"
RANK1 = "checkpoints/global_step8/rank1_state.pt"


def scenario(tmp_path, *options: str):
    argv = ", ".join(f'"{a}"' for a in (str(TRAINER), "--ckpt-dir", "{ckpt_dir}", *options))
    path = tmp_path / "deepspeed-style-kill-rank1-mid-write.toml"
    path.write_text(f"""
description = "rank 1 is SIGKILLed half-way through writing step 8's rank1_state.pt"
world_size = 2
[command]
argv = [{argv}]
key = ["{TRAINER}"]
complete = {{ pointer = "latest" }}
save_every = 4
[[faults]]
kind = "kill"
target = "rank:1"
when = {{ point = "faultfs.write", rank = 1, path = "{RANK1}", min_fraction = 0.5 }}
""")
    return load(path)


def checks(tmp_path, golden_root, *options: str) -> tuple[dict[str, tuple[str, str]], int]:
    """The run's checks, and how many bytes of rank 1's file the kill left (half the golden run's)."""
    r = run_scenario(scenario(tmp_path, *options), tmp_path / "out", golden_root)
    out = {c["name"]: (c["verdict"], c["detail"]) for c in r.checks}
    assert out["fault_0_fired"][0] == "pass", (r.reason, out)
    size = json.loads((Path(r.run_dir) / "golden" / "planned.json").read_text())["sizes"][RANK1]
    return out, -(-size // 2)


_WRITER = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
os.write(fd, b"x" * 1000)
if sys.argv[2] == "close":
    os.close(fd)
print("written", flush=True)
time.sleep(60)
"""


@needs_faultfs
@pytest.mark.parametrize("how", ["close", "killed"])
def test_faultfs_says_a_file_was_closed_by_its_writers_death_not_by_the_writer(tmp_path, how):
    """A writer killed with its file open never closes it: the kernel does as the process ends, and
    faultfs says so (``exited``), so that a writer killed by anything, not only a held fault, leaves
    its file torn in the evidence."""
    from ckpt_chaos.env.storage import FAULTFS_POINTS
    from ckpt_chaos.run.controller import ProbeServer

    events = []
    with ProbeServer(events.append) as server, Storage(tmp_path, StorageSpec(faultfs=True)) as st:
        st.client.call("report", controller=server.address, points=list(FAULTFS_POINTS), prefix="checkpoints")
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(st.ckpt / "w.bin"), how], stdout=subprocess.PIPE,
                                env={**os.environ, "CKPT_CHAOS_CONTROLLER": server.address, "RANK": "0"})
        assert proc.stdout.readline() == b"written\n"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        proc.stdout.close()
    [done] = [e["info"] for e in events if e["point"] == "faultfs.done"]
    assert done["bytes"] == 1000 and done.get("exited", False) == (how == "killed"), done


@pytest.mark.slow
@needs_faultfs
def test_an_atomic_save_on_faultfs_resumes_from_the_pointer_without_a_false_alarm(tmp_path, golden_root):
    c, half = checks(tmp_path, golden_root, "--tmp", "fixed,pid")
    for name in ("resumed_newest@1", "no_torn_read@1", "committed_valid"):
        assert c[name][0] == "pass", (name, c[name][1])
    assert "checkpoints/global_step4" in c["resumed_newest@1"][1]
    # the killed writer's temporary file is still in global_step8, which the relaunch saved again
    detail = c["committed_valid"][1]
    assert re.search(rf"stray .*checkpoints/global_step8/\.rank1_state\.pt\.tmp\d+: {half} of \d+ bytes written "
                     r"\(the golden run's checkpoints/global_step8/rank1_state\.pt\), never completed, by launch 0",
                     detail), detail


@pytest.mark.nightly  # make test: the planted torn-load tests
@pytest.mark.slow
@needs_faultfs
def test_a_torn_file_an_earlier_launch_left_in_a_complete_checkpoint_fails_committed_valid(tmp_path, golden_root):
    c, half = checks(tmp_path, golden_root, "--tmp", "none", "--pointer-first")
    verdict, detail = c["no_torn_read@1"]
    assert verdict == "fail" and f"{RANK1}: {half} of " in detail, (verdict, detail)
    verdict, detail = c["committed_valid"]
    assert verdict == "fail" and f"{RANK1}: {half} of " in detail and "never completed, by launch 0" in detail, \
        (verdict, detail)


# ---- a loader that tries the newest checkpoint and falls back on an error ------------------------------

_FALLBACK = r"""
import io, sys, torch
buf = io.BytesIO()
torch.save({"w": torch.ones(4000)}, buf)  # step_4.pt whole, step_8.pt cut at half as a kill left it
with open(f"{sys.argv[1]}/step_4.pt", "wb") as f:
    f.write(buf.getvalue())
with open(f"{sys.argv[1]}/step_8.pt", "wb") as f:
    f.write(buf.getvalue()[:len(buf.getvalue()) // 2])
for loader in sys.argv[2:]:  # each loader: the names it tries in order, until one loads
    for name in loader.split(","):
        try:
            state = torch.load(f"{sys.argv[1]}/{name}", weights_only=True)
            break
        except Exception as e:
            print("cannot load", name, type(e).__name__, flush=True)
    open(f"{sys.argv[1]}/step_4.pt", "rb").close()  # a file.read between loaders
"""


def _fallback_events(tmp_path: Path, *loaders: str) -> list[list[dict]]:
    """The probe layer's load events of each of ``loaders`` (names, apart with ``,``, that it
    torch.loads in order until one loads), from step_4.pt whole and step_8.pt cut at half, as a kill
    left it."""
    from ckpt_chaos.probe import auto
    from ckpt_chaos.run.controller import ProbeServer

    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir(parents=True)
    events: list[dict] = []
    with ProbeServer(events.append) as server:
        env = {**os.environ, "RANK": "0", "CKPT_CHAOS_ATTEMPT": "1",
               **auto.environment(server.address, tmp_path, [ckpt], pythonpath=str(REPO))}
        out = subprocess.run([sys.executable, "-c", _FALLBACK, str(ckpt), *loaders], env=env, capture_output=True,
                             text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    each: list[list[dict]] = [[]]
    for e in events:
        if e["point"] == "file.read":
            each.append([])
        elif e["point"] in ("load.begin", "load.end"):
            each[-1].append(e)
    return each[:len(loaders)]


def _stored_fallback_run(tmp_path: Path, relaunch: list[dict]):
    """A stored run whose launch 0 was killed half-way through step_8.pt (the probe layer's writes of it,
    never done) and whose launch 1 made the probe events ``relaunch``."""
    from ckpt_chaos.check.verdict import Run

    run, gold = tmp_path / "run", tmp_path / "golden"
    run.mkdir(parents=True)
    gold.mkdir()
    (run / "scenario.toml").write_text(
        'description = "t"\nworld_size = 1\n[command]\nargv = ["train.py", "--ckpt-dir", "{ckpt_dir}"]\n'
        'complete = "step_*.pt"\nsave_every = 4\n')
    (gold / "probe.jsonl").write_text("".join(json.dumps(
        {"rank": 0, "pid": 1, "attempt": 0, "point": "file.done", "t": 1.0 + i,
         "info": {"path": f"checkpoints/step_{s}.pt", "bytes": 19184, "via": "open"}}) + "\n"
        for i, s in enumerate((4, 8))))
    t0 = 100.0

    def rec(kind, launch, t, **kw):
        return {"kind": kind, "launch": launch, "t": t, "source": "harness", **kw}

    def probe(e, launch, t):
        return {"kind": e["point"], "launch": launch, "pid": e.get("pid", 2), "rank": e.get("rank", 0),
                "source": "probe", "t": t, "info": e.get("info", {})}

    complete = {f"checkpoints/step_{s}.pt": {"mtime_ns": int((t0 + s) * 1e9), "size": n}
                for s, n in ((4, 19184), (8, 9592))}
    history = [rec("launch", 0, t0, mode="harness", pid=1, world_size=1),
               probe({"point": "file.done", "info": {"path": "checkpoints/step_4.pt", "bytes": 19184, "via": "open"}},
                     0, t0 + 4),
               probe({"point": "file.write", "info": {"path": "checkpoints/step_8.pt", "bytes": 9592, "via": "open",
                                                      "fraction": 0.5}}, 0, t0 + 8),
               rec("exit", 0, t0 + 9, rc=-9, snapshot={}, complete=complete,
                   files={p: v["size"] for p, v in complete.items()}),
               rec("launch", 1, t0 + 10, mode="harness", pid=3, world_size=1),
               *[probe(e, 1, t0 + 11 + i / 100) for i, e in enumerate(relaunch)]]
    (run / "history.jsonl").write_text("".join(json.dumps(h) + "\n" for h in history))
    return Run.load(load(run / "scenario.toml"), run, gold)


def test_a_load_that_raised_is_tried_not_resumed_from_and_a_load_with_no_fall_back_is_the_resume(tmp_path):
    """torch.load of step_8.pt, torn by the kill, raises and the loader falls back to step_4.pt: the
    probe layer ends the first load with ``failed``, the relaunch resumed from step_4.pt, the newest
    whole one, and reading the torn file it only tried is no torn read. A loader that stops at the
    load that raised (nothing else loads) is judged by that load: it took the torn step_8.pt."""
    from ckpt_chaos.check.resume import resumes
    from ckpt_chaos.check.verdict import Report

    fallback, stuck = _fallback_events(tmp_path, "step_8.pt,step_4.pt", "step_8.pt")
    ends = [e["info"] for e in fallback if e["point"] == "load.end"]
    assert [(i["path"], "failed" in i) for i in ends] == [("checkpoints/step_8.pt", True),
                                                         ("checkpoints/step_4.pt", False)], ends
    run = _stored_fallback_run(tmp_path / "fallback", fallback)
    r = run.evidence.resumed_from(1)
    assert (r.checkpoint, r.tried) == ("checkpoints/step_4.pt", ["checkpoints/step_8.pt"]), r
    report = Report(launches=2)
    resumes(run, report)
    got = {c.name: (c.verdict, c.detail) for c in report.checks}
    assert got["resumed_newest@1"][0] == "pass", got
    assert got["no_torn_read@1"][0] == "pass" and "it tried checkpoints/step_8.pt first" in got["no_torn_read@1"][1], got

    report = Report(launches=2)
    resumes(_stored_fallback_run(tmp_path / "stuck", stuck), report)
    got = {c.name: (c.verdict, c.detail) for c in report.checks}
    assert got["resumed_newest@1"][0] == "fail" and "it loaded checkpoints/step_8.pt" in got["resumed_newest@1"][1]
    assert got["no_torn_read@1"][0] == "fail" and "checkpoints/step_8.pt: 9592 of 19184" in got["no_torn_read@1"][1]


def test_a_checkpoint_whose_files_were_opened_before_the_resumed_ones_was_tried_in_every_source_that_saw_both():
    """np.load of the torn step_8.npy raises and the loader falls back to step_4.npy: no load point says
    so, but each source saw step_8.npy opened before step_4.npy (fanotify stamps later than the others,
    so each source's order is held to itself). A checkpoint opened after the one resumed from, or
    before it in one source and after it in another, is no fall back."""
    from ckpt_chaos.check.evidence import Read, _tried

    def ckpt(p):
        return p

    fallback = [Read("c/step_8.npy", "faultfs", 1.00), Read("c/step_8.npy", "probe layer", 1.01, 6992),
                Read("c/step_4.npy", "faultfs", 1.02), Read("c/step_8.npy", "fanotify", 1.025, 6992),
                Read("c/step_4.npy", "probe layer", 1.03, 13984), Read("c/step_4.npy", "fanotify", 1.04, 13984)]
    assert _tried(fallback, "c/step_4.npy", ckpt) == ["c/step_8.npy"]
    after = [Read("c/step_4.npy", "probe layer", 1.0, 13984), Read("c/step_8.npy", "probe layer", 1.1, 6992)]
    assert _tried(after, "c/step_4.npy", ckpt) == []
    crossed = [Read("c/step_8.npy", "probe layer", 1.0), Read("c/step_4.npy", "probe layer", 1.1),
               Read("c/step_4.npy", "fanotify", 1.2), Read("c/step_8.npy", "fanotify", 1.3)]
    assert _tried(crossed, "c/step_4.npy", ckpt) == []


# ---- a writer thread handed the live state: the file of step 4 holds the state after step 5 ---------------

def _thread_no_copy_run(tmp_path: Path, relaunch_loss: str):
    """A stored run of a trainer whose writer thread wrote step_4.pt after step 5 trained, from the live
    tensors (saving.py's ``--thread nocopy``), killed in the save of step 8 and resumed from step_4.pt:
    the trainer goes on at its step 5 (the name's), the optimizer's count at 6. The golden run recorded
    its state before steps 1, 6, 10 and 14; the relaunch before its first step, the golden run's before
    step 6. ``relaunch_loss``: "other" (its step 5's data on step 6's state) or "golden" (the golden
    run's losses from step 6 on: a trainer that did go on at step 6)."""
    from ckpt_chaos.check.verdict import Run

    run, gold = tmp_path / "run", tmp_path / "golden"
    run.mkdir(parents=True)
    gold.mkdir()
    (run / "scenario.toml").write_text(
        'description = "t"\nworld_size = 2\n[command]\nargv = ["train.py", "--ckpt-dir", "{ckpt_dir}"]\n'
        'complete = "step_*.pt"\nsave_every = 4\n')
    (gold / "golden.json").write_text(json.dumps({"unstable": ["pre_python_rng", "pre_numpy_rng"]}))

    def rec(step, attempt, t, loss, state=None):
        out = {"step": step, "attempt": attempt, "t": t, "loss_hex": loss, "lr_hex": "0x1.47ae147ae147bp-7"}
        if state is not None:
            out |= {"pre_rng": "3a9e8c28f62dd976", "pre_model_digest": f"model-{state}",
                    "pre_optimizer_digest": f"opt-{state}"}
        return out

    golden = [rec(s, 0, 10.0 + s, f"gold-{s}", s if s in (1, 6, 10, 14) else None) for s in range(1, 17)]
    (gold / "trajectory.jsonl").write_text("".join(json.dumps(r) + "\n" for r in golden))
    first = [rec(s, 0, 100.0 + s, f"gold-{s}", s if s in (1, 6) else None) for s in range(1, 10)]
    again = [rec(s, 1, 200.0 + s, f"other-{s}" if relaunch_loss == "other" else f"gold-{s}", 6 if s == 6 else None)
             for s in range(6, 18 if relaunch_loss == "other" else 17)]
    (run / "trajectory.jsonl").write_text("".join(json.dumps(r) + "\n" for r in first + again))
    history = [{"kind": "launch", "launch": 0, "t": 100.0, "source": "harness", "mode": "harness", "pid": 1,
                "world_size": 2},
               {"kind": "file.done", "launch": 0, "pid": 2, "rank": 0, "source": "probe", "t": 105.5,
                "info": {"path": "checkpoints/step_4.pt", "bytes": 19184, "via": "torch.save"}},
               {"kind": "exit", "launch": 0, "t": 110.0, "source": "harness", "rc": -9, "snapshot": {},
                "complete": {"checkpoints/step_4.pt": {"mtime_ns": 105_500_000_000, "size": 19184}},
                "files": {"checkpoints/step_4.pt": 19184}},
               {"kind": "launch", "launch": 1, "t": 199.0, "source": "harness", "mode": "harness", "pid": 3,
                "world_size": 2},
               *[{"kind": k, "launch": 1, "pid": 4, "rank": 0, "source": "probe", "t": 199.5,
                  "info": {"path": "checkpoints/step_4.pt", "name": "step_4.pt", "via": "torch.load"}}
                 for k in ("load.begin", "load.end")]]
    (run / "history.jsonl").write_text("".join(json.dumps(h) + "\n" for h in history))
    return Run.load(load(run / "scenario.toml"), run, gold)


def test_a_state_of_a_later_step_than_its_checkpoints_name_is_numbered_by_the_name_and_named_in_the_diagnosis(
        tmp_path):
    """The file's time says step 5 (the thread wrote it after step 5), as the optimizer's count does, so
    time cannot tell them apart; but the relaunch began from the golden run's state before step 6 and made
    another loss than the golden step 6: its data was not step 6's. Numbered by the name, it diverges at
    step 5, the state of step 6 named. A relaunch that made the golden run's losses from that state went
    on at step 6, and is numbered by its count."""
    from ckpt_chaos.check.trajectory import trajectory_check
    from ckpt_chaos.check.verdict import Report

    run = _thread_no_copy_run(tmp_path / "ahead", "other")
    assert run.evidence.numbering(1).offset == -1, run.evidence.numbering(1)
    report = Report(launches=2)
    trajectory_check(run, report)
    [c] = report.checks
    assert c.verdict == "fail" and c.detail.startswith("trajectory diverges at step 5 (loss_hex)"), c.detail
    assert ("the model, optimizer state it resumed with is the golden run's before step 6, not before step 5"
            in c.detail), c.detail

    same = _thread_no_copy_run(tmp_path / "same", "golden")
    assert same.evidence.numbering(1).offset == 0
    report = Report(launches=2)
    trajectory_check(same, report)
    assert [c.verdict for c in report.checks] == ["pass"], report.checks


_DIES_LOOKING = r"""
import sys
from pathlib import Path
ckpt = Path(sys.argv[1])
if sys.argv[2] == "stat":  # a loader that checks a file's size before a native read of it
    try:
        (ckpt / "step_8" / "model.bin").stat()
    except FileNotFoundError as e:
        raise RuntimeError("cannot resume") from e
else:  # a save into a folder that is gone: a write, not a read
    open(ckpt / "gone" / "model.bin", "wb")
"""


@pytest.mark.parametrize("how", ["stat", "create"])
def test_a_process_that_dies_looking_for_a_checkpoint_file_is_seen_trying_it(tmp_path, how):
    """A resume that takes step_8, whose model.bin a kill left unwritten, dies of the FileNotFoundError
    of a stat (or of a native reader) the layer wraps no call of: its uncaught error names the file, in
    a folder that exists, so the layer reports the read it tried (``failed``). A create that fails so
    (its folder is gone) is no read. Judged: the relaunch took step_8 and died in it, a torn read."""
    from ckpt_chaos.check.resume import resumes
    from ckpt_chaos.check.verdict import Report
    from ckpt_chaos.probe import auto
    from ckpt_chaos.run.controller import ProbeServer

    ckpt = tmp_path / "checkpoints"
    (ckpt / "step_8").mkdir(parents=True)
    events: list[dict] = []
    with ProbeServer(events.append) as server:
        env = {**os.environ, "RANK": "0", "CKPT_CHAOS_ATTEMPT": "1",
               **auto.environment(server.address, tmp_path, [ckpt], pythonpath=str(REPO))}
        out = subprocess.run([sys.executable, "-c", _DIES_LOOKING, str(ckpt), how], env=env, capture_output=True,
                             text=True, timeout=120)
    assert out.returncode == 1 and ("cannot resume" if how == "stat" else "FileNotFoundError") in out.stderr
    reads = [e["info"] for e in events if e["point"] == "file.read"]
    if how == "create":
        assert reads == [], reads
        return
    assert reads == [{"path": "checkpoints/step_8/model.bin", "size": None,
                      "failed": "FileNotFoundError: No such file or directory"}], reads
    # the same record in a relaunch of a stored run whose launch 0 left step_8.pt torn
    died = {"point": "file.read", "info": {**reads[0], "path": "checkpoints/step_8.pt"}}
    run = _stored_fallback_run(tmp_path / "stored", [died])
    assert run.evidence.resumed_from(1).died
    report = Report(launches=2)
    resumes(run, report)
    got = {c.name: (c.verdict, c.detail) for c in report.checks}
    assert got["resumed_newest@1"] == ("fail", "it took checkpoints/step_8.pt (its process died looking for "
                                       "checkpoints/step_8.pt (FileNotFoundError: No such file or directory)), but "
                                       "the newest complete checkpoint was checkpoints/step_4.pt (complete: "
                                       "checkpoints/step_4.pt)"), got
    assert got["no_torn_read@1"][0] == "fail" and "checkpoints/step_8.pt: 9592 of 19184" in got["no_torn_read@1"][1]
