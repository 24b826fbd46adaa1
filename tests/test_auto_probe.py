"""The automatic probe layer: an unmodified trainer (examples/plain_ddp) reports the probe's points
and a trajectory, and a fault lands at the byte the trigger names."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_chaos.check.history import read_jsonl
from ckpt_chaos.probe import auto, follow
from ckpt_chaos.run.controller import ProbeServer
from tests.helpers import REPO

TRAINER = REPO / "examples" / "plain_ddp" / "train.py"


def torchrun(run_dir: Path, server: ProbeServer, *args: str, planned: Path | None = None) -> int:
    ckpt = run_dir / "ckpt"
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           **auto.environment(server.address, run_dir, [ckpt], planned=planned, digest_every=4,
                              pythonpath=str(REPO))}
    with open(run_dir / "torchrun.log", "ab") as log:
        return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                               str(TRAINER), "--ckpt-dir", str(ckpt), *args],
                              env=env, stdout=log, stderr=subprocess.STDOUT, timeout=180).returncode


class Recorder:
    def __init__(self, act=None):
        self.events: list[dict] = []
        self.act = act

    def __call__(self, event: dict):
        self.events.append(event)
        return self.act(event) if self.act else None

    def points(self, name: str, rank: int | None = None) -> list[dict]:
        return [e for e in self.events if e["point"] == name and (rank is None or e["rank"] == rank)]


def log(run_dir: Path) -> str:
    return (run_dir / "torchrun.log").read_text()[-3000:]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """12 steps, a save every 4: the events and records of a fault-free run."""
    from ckpt_chaos.env.launcher import native_crash

    for attempt in (1, 2):
        run_dir = tmp_path_factory.mktemp("plain")
        rec = Recorder()
        with ProbeServer(rec) as server:
            rc = torchrun(run_dir, server, "--steps", "12")
        # gloo now and then aborts a rank at exit ("terminate called without an active exception"):
        # the harness runs such a launch again once (run_scenario), and so does this fixture
        if rc == 0 or attempt == 2 or native_crash(run_dir / "torchrun.log") is None:
            break
    assert rc == 0, log(run_dir)
    return run_dir, rec


def test_each_rank_says_what_is_armed_before_its_first_point(first_run):
    _, rec = first_run
    ranks = {e["rank"] for e in rec.events}
    assert ranks == {0, 1}  # torchrun's own process reports nothing
    for rank in (0, 1):
        first = [e for e in rec.events if e["rank"] == rank][0]
        assert first["point"] == "probe.armed"
        assert {"files", "torch.optim", "torch.autograd", "torch.save", "torch.load"} <= set(first["info"]["armed"])
        assert "step.end" in first["info"]["points"]


def test_steps_are_numbered_by_the_optimizer_and_recorded_on_rank_0(first_run):
    run_dir, rec = first_run
    for rank in (0, 1):
        assert [e["info"]["step"] for e in rec.points("step.end", rank)] == list(range(1, 13))
        assert [e["info"]["step"] for e in rec.points("step.begin", rank)] == list(range(1, 13))
        assert len(rec.points("microstep.end", rank)) == 12
    records = read_jsonl(run_dir / "trajectory.jsonl")
    assert [r["step"] for r in records] == list(range(1, 13))
    assert all(float.fromhex(r["loss_hex"]) > 0 for r in records)
    assert all(len(r["samples"]) == 1 and len(r["samples"][0]) == 8 for r in records)  # one batch of 8 ids
    assert [r["step"] for r in records if "model_digest" in r] == [4, 8, 12]
    exit_event = read_jsonl(run_dir / "events.jsonl")[-1]
    assert exit_event["event"] == "exit" and exit_event["step"] == 12
    assert exit_event["model_digest"] == records[-1]["model_digest"]


def test_a_torch_save_is_staged_written_fsynced_renamed_and_old_ones_removed(first_run):
    _, rec = first_run
    saves = rec.points("ckpt.stage", 0)
    assert [e["info"]["path"] for e in saves] == [f"ckpt/step_{s:08d}.pt.tmp" for s in (4, 8, 12)]
    assert rec.points("ckpt.stage", 1) == []  # rank 0 saves alone
    done = rec.points("file.done", 0)
    assert [e["info"]["path"] for e in done] == [f"ckpt/step_{s:08d}.pt.tmp" for s in (4, 8, 12)]
    assert all(e["info"]["bytes"] > 0 and e["info"]["via"] == "torch.save" for e in done)
    assert [e["info"]["path"] for e in rec.points("file.fsync", 0)][:1] == ["ckpt/step_00000004.pt.tmp"]
    renames = [(e["info"]["src"], e["info"]["path"]) for e in rec.points("file.rename", 0)]
    assert renames == [(f"ckpt/step_{s:08d}.pt.tmp", f"ckpt/step_{s:08d}.pt") for s in (4, 8, 12)]
    assert [e["info"]["path"] for e in rec.points("file.remove", 0)] == ["ckpt/step_00000004.pt"]
    # the order of one save, as the trainer wrote it
    seq = [e["point"] for e in rec.events if e["rank"] == 0 and e["point"].startswith(("file.", "ckpt."))]
    assert seq[0] == "ckpt.stage"
    assert seq.index("file.done") < seq.index("file.fsync") < seq.index("file.rename")


# Nightly, with the next: the plain DDP example's stored run (tests/test_any_trainer.py) resumes from the newest
# file after a kill half-way through it, in make test; these launch the layer by hand.
@pytest.mark.nightly
def test_a_resume_loads_the_newest_file_and_counts_on_from_its_step(first_run, tmp_path):
    run_dir, _ = first_run
    rec = Recorder()
    with ProbeServer(rec) as server:
        rc = torchrun(run_dir, server, "--steps", "14")
    assert rc == 0, log(run_dir)
    loads = rec.points("load.begin", 0)
    assert [e["info"]["path"] for e in loads] == ["ckpt/step_00000012.pt"]
    assert [e["info"]["step"] for e in rec.points("step.begin", 1)] == [13, 14]


@pytest.mark.nightly
def test_a_kill_at_half_of_a_file_finds_half_of_its_planned_bytes_on_disk(first_run, tmp_path):
    _, golden = first_run
    plan = tmp_path / "planned.json"
    plan.write_text(json.dumps(auto.planned_sizes(golden.events)))
    planned = auto.planned_sizes(golden.events)["ckpt/step_00000008.pt.tmp"]
    seen: list[dict] = []

    def kill_at_half(event):
        info = event["info"]
        if (event["point"] == "file.write" and info.get("path") == "ckpt/step_00000008.pt.tmp"
                and info.get("fraction", 0) >= 0.5 and not seen):
            seen.append(event)
            os.kill(event["pid"], signal.SIGKILL)

    with ProbeServer(Recorder(kill_at_half)) as server:
        rc = torchrun(tmp_path, server, "--steps", "12", planned=plan)
    assert rc != 0
    assert seen, "the trigger never matched"
    on_disk = (tmp_path / "ckpt" / "step_00000008.pt.tmp").stat().st_size
    assert on_disk == seen[0]["info"]["bytes"]
    assert abs(on_disk / planned - 0.5) <= 0.1, (on_disk, planned)
    assert not (tmp_path / "ckpt" / "step_00000008.pt").exists()


def test_the_layer_stays_out_without_a_controller_and_never_imports_torch(tmp_path):
    code = "import builtins, sys; print(builtins.open.__module__ == 'ckpt_chaos.probe.auto_files', 'torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([auto.SITE_DIR, str(REPO)])}
    env.pop("CKPT_CHAOS_CONTROLLER", None)
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert off.stdout.split() == ["False", "False"]
    env["CKPT_CHAOS_CONTROLLER"] = str(tmp_path / "nobody.sock")
    on = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert on.stdout.split() == ["True", "False"]


def test_a_sitecustomize_it_shadows_still_runs(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = '1'\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([auto.SITE_DIR, str(REPO), str(theirs)]),
           "CKPT_CHAOS_CONTROLLER": str(tmp_path / "nobody.sock")}
    out = subprocess.run([sys.executable, "-c", "import os, builtins; print(os.environ.get('THEIRS_RAN'), "
                          "builtins.open.__module__)"], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "ckpt_chaos.probe.auto_files"]


def test_a_file_renamed_into_place_is_planned_under_both_names_and_by_a_trigger_glob():
    # safetensors renames its temporary file before closing it: faultfs's done says where it was opened
    events = [{"point": "faultfs.rename", "info": {"path": "ckpt/s8/model.safetensors", "src": "ckpt/s8/.tmpAb12"}},
              {"point": "faultfs.done", "info": {"path": "ckpt/s8/model.safetensors", "bytes": 2612,
                                                 "opened": "ckpt/s8/.tmpAb12"}},
              {"point": "file.done", "info": {"path": "ckpt/s8/optimizer.bin", "bytes": 8831}}]
    plan = auto.planned_sizes(events)
    assert plan == {"ckpt/s8/model.safetensors": 2612, "ckpt/s8/.tmpAb12": 2612, "ckpt/s8/optimizer.bin": 8831}
    # the next run's temporary name differs: a glob key (a trigger's when.path) plans it
    assert auto.planned_size(plan, "ckpt/s8/.tmpZz99") is None
    assert auto.planned_size({**plan, "ckpt/s8/.tmp*": 2612}, "ckpt/s8/.tmpZz99") == 2612
    assert auto.planned_size({**plan, "ckpt/s8/.tmp*": 1}, "ckpt/s8/optimizer.bin") == 8831


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="accelerate is not installed "
                    "(pip install 'ckpt-chaos[examples]')")
@pytest.mark.nightly  # make chaos-examples runs Accelerate's trajectory
def test_the_samples_of_each_step_are_those_accelerate_hands_over_though_it_fetches_ahead(tmp_path):
    # 96 samples, 2 processes, 8 per batch: an epoch is 6 steps, and every sample of rank 0's half once
    with ProbeServer(Recorder()) as server:
        env = {**os.environ, "OMP_NUM_THREADS": "1",
               **auto.environment(server.address, tmp_path, [tmp_path / "ckpt"], pythonpath=str(REPO))}
        with open(tmp_path / "torchrun.log", "ab") as out:
            rc = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
                                 "2", "--num_machines", "1", "--main_process_port", "0", "--mixed_precision", "no",
                                 "--dynamo_backend", "no",
                                 str(REPO / "examples" / "accelerate" / "train.py"), "--ckpt-dir",
                                 str(tmp_path / "ckpt"), "--steps", "7", "--save-every", "100"],
                                env=env, stdout=out, stderr=subprocess.STDOUT, timeout=180).returncode
    assert rc == 0, log(tmp_path)
    records = read_jsonl(tmp_path / "trajectory.jsonl")
    assert [r["step"] for r in records] == list(range(1, 8))
    batches = [r.get("samples") for r in records[:6]]
    assert all(b is not None and len(b) == 1 and len(b[0]) == 8 for b in batches), batches
    assert len({i for b in batches for i in b[0]}) == 48, batches


NATIVE = r"""
import os, resource, signal, sys
import numpy as np
d = sys.argv[1]
np.arange(1000, dtype=np.float32).tofile(os.path.join(d, "model.f32"))  # numpy: C stdio on a dup of fileno()
with open(os.path.join(d, "raw.bin"), "wb") as f:
    os.write(f.fileno(), b"x" * 5000)  # os.write on a Python file's descriptor
with open(os.path.join(d, "mixed.bin"), "wb") as f:
    f.write(b"h" * 100)
    f.flush()
    os.write(f.fileno(), b"y" * 900)
with open(os.path.join(d, "log.txt"), "a") as f:  # an append counts from the size it found
    os.write(f.fileno(), b"z" * 10)
fd = os.open(os.path.join(d, "deep.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)  # DeepSpeed's writer
for _ in range(3):
    os.write(fd, b"d" * 3000)
os.fsync(fd)
os.close(fd)
os.close(os.open(os.path.join(d, "deep.bin"), os.O_RDONLY))
import tempfile
fd, tmp = tempfile.mkstemp(dir=d, suffix=".part")
with os.fdopen(fd, "wb") as f:  # a descriptor made a Python file: one file, one count
    f.write(b"t" * 700)
os.replace(tmp, os.path.join(d, "staged.bin"))
# a file limited to 6500 bytes: a write(2) that takes part of it, then fails (EFBIG), as a filling disk does
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (6500, resource.RLIM_INFINITY))
try:
    np.arange(2500, dtype=np.float32).tofile(os.path.join(d, "optim.f32"))
except OSError as e:
    print("numpy:", e)
try:
    with open(os.path.join(d, "py.bin"), "wb") as f:
        f.write(b"p" * 10000)
except OSError as e:
    print("python:", e)
"""


def run_native(tmp_path: Path, planned: dict | None = None) -> Recorder:
    watched = tmp_path / "ckpt"
    watched.mkdir(parents=True)
    (watched / "log.txt").write_bytes(b"old\n")
    plan = None
    if planned is not None:
        plan = tmp_path / "planned.json"
        plan.write_text(json.dumps(planned))
    rec = Recorder()
    with ProbeServer(rec) as server:
        env = {**os.environ, "RANK": "0",
               **auto.environment(server.address, tmp_path, [watched], planned=plan, pythonpath=str(REPO))}
        out = subprocess.run([sys.executable, "-c", NATIVE, str(watched)], env=env, capture_output=True, text=True,
                             timeout=60)
    assert out.returncode == 0, out.stderr
    assert "numpy: 2500 requested and" in out.stdout and "python:" in out.stdout, out.stdout
    return rec


def test_bytes_written_through_the_descriptor_are_counted_from_the_file_size_and_said_native(tmp_path):
    rec = run_native(tmp_path)
    done = {e["info"]["path"]: e["info"] for e in rec.points("file.done")}
    on_disk = {p: (tmp_path / p).stat().st_size for p in done if (tmp_path / p).exists()}
    assert done["ckpt/model.f32"] == {"path": "ckpt/model.f32", "bytes": 4000, "via": "open", "native": True,
                                      "python_bytes": 0}
    # os.write on a Python file's descriptor is that file's write: Python's bytes, not native ones
    assert done["ckpt/raw.bin"] == {"path": "ckpt/raw.bin", "bytes": 5000, "via": "open"}
    assert done["ckpt/mixed.bin"] == {"path": "ckpt/mixed.bin", "bytes": 1000, "via": "open"}
    assert done["ckpt/log.txt"]["bytes"] == 10 and on_disk["ckpt/log.txt"] == 14  # not the 4 bytes it found
    assert "native" not in done["ckpt/log.txt"]
    # numpy's fwrite took 6500 bytes and failed: Python never saw the error, the bytes are the file's
    assert on_disk["ckpt/optim.f32"] == 6500 and done["ckpt/optim.f32"]["bytes"] == 6500
    assert "failed" not in done["ckpt/optim.f32"] and "short" not in done["ckpt/optim.f32"]  # no plan to compare
    # Python's own write that the limit cut: what write(2) took is counted, and the error it met is kept
    assert on_disk["ckpt/py.bin"] == 6500 and done["ckpt/py.bin"]["bytes"] == 6500, done["ckpt/py.bin"]
    assert done["ckpt/py.bin"]["failed"] and "native" not in done["ckpt/py.bin"]
    # the plan of the next runs takes those sizes
    sizes = auto.planned_sizes(rec.events)
    assert sizes["ckpt/model.f32"] == 4000 and sizes["ckpt/raw.bin"] == 5000


def test_a_file_os_open_opened_is_written_fsynced_closed_and_read_as_a_python_file_is(tmp_path):
    rec = run_native(tmp_path)
    seq = [(e["point"], e["info"].get("bytes")) for e in rec.events if e["info"].get("path") == "ckpt/deep.bin"]
    assert seq == [("file.fsync", None), ("file.done", 9000), ("file.read", None)], seq
    assert rec.points("file.done")[[e["info"]["path"] for e in rec.points("file.done")].index("ckpt/deep.bin")][
        "info"] == {"path": "ckpt/deep.bin", "bytes": 9000, "via": "os.write"}
    assert [e["info"]["size"] for e in rec.points("file.read") if e["info"]["path"] == "ckpt/deep.bin"] == [9000]
    # tempfile.mkstemp's descriptor handed to os.fdopen: one file, written under its temporary name
    staged = [e for e in rec.points("file.done") if e["info"]["path"].endswith(".part")]
    assert len(staged) == 1 and staged[0]["info"]["bytes"] == 700 and staged[0]["info"]["via"] == "open", staged
    assert "ckpt/deep.bin" in auto.planned_sizes(rec.events)
    assert {"os.write", "files"} <= set(rec.points("probe.armed")[0]["info"]["armed"])


def test_a_native_write_that_failed_unseen_is_short_of_the_golden_runs_file(tmp_path):
    golden = run_native(tmp_path / "golden")
    # the golden run as if its disk had room: optim.f32 whole (10000 bytes)
    events = [e if e["info"].get("path") != "ckpt/optim.f32" else
              {**e, "info": {**e["info"], "bytes": 10000}} for e in golden.events]
    plan = follow.plan(events)
    assert plan["files"]["file"]["0"]["ckpt/optim.f32"][0]["size"] == 10000
    done = {e["info"]["path"]: e["info"] for e in run_native(tmp_path / "run", plan).points("file.done")}
    assert done["ckpt/optim.f32"]["bytes"] == 6500 and done["ckpt/optim.f32"]["short"] is True
    assert done["ckpt/py.bin"]["failed"] and "short" not in done["ckpt/py.bin"]  # its golden file was 6500 too
    assert not any(i.get("short") for p, i in done.items() if p != "ckpt/optim.f32")



SIZES_ON_DISK = r"""
import json, os, sys
out = []
for d in sys.argv[1:]:  # the watched folder, then one the layer leaves alone: the same writes
    sizes = []
    with open(os.path.join(d, "state.json"), "w") as f:
        for i in range(40):  # json.dump's pieces: many small writes, then a long string
            f.write(json.dumps({"k%d" % i: "v" * (97 * i % 1500)}))
            sizes.append(os.fstat(f.fileno()).st_size)
        f.write("x" * 20000)
        sizes.append(os.fstat(f.fileno()).st_size)
    with open(os.path.join(d, "blob.bin"), "wb") as f:
        for n in (3000, 3000, 3000, 9000, 100):
            f.write(b"b" * n)
            sizes.append(os.fstat(f.fileno()).st_size)
    with open(os.path.join(d, "one.bin"), "wb") as f:  # serialized first, then written in one call
        f.write(b"o" * 20000)
    out.append(sizes)
print(json.dumps(out))
"""


def test_a_watched_file_reaches_the_disk_in_the_writes_it_would_without_the_layer(tmp_path):
    """The layer counts a trainer's bytes but keeps Python's buffer: a write(2) that fails (a full
    disk, EIO) fails in the statement it would fail in unwatched, json.dump rather than the flush."""
    watched, plain = tmp_path / "ckpt", tmp_path / "elsewhere"
    watched.mkdir()
    plain.mkdir()
    rec = Recorder()
    with ProbeServer(rec) as server:
        env = {**os.environ, "RANK": "0", **auto.environment(server.address, tmp_path, [watched], pythonpath=str(REPO))}
        out = subprocess.run([sys.executable, "-c", SIZES_ON_DISK, str(watched), str(plain)], env=env,
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    in_watched, in_plain = json.loads(out.stdout)
    assert in_watched == in_plain
    assert 0 < in_plain[39] < in_plain[40]  # the buffer filled and went to disk before the end
    done = {e["info"]["path"]: e["info"]["bytes"] for e in rec.points("file.done")}
    assert done == {"ckpt/state.json": in_plain[40], "ckpt/blob.bin": 18100, "ckpt/one.bin": 20000}, done
    # with no plan, a file is cut in tenths only where one call wrote it: not at the buffer's first fill
    tenths = {}
    for e in rec.points("file.write"):
        if "fraction" in e["info"]:
            tenths.setdefault(e["info"]["path"], []).append(e["info"]["fraction"])
    assert tenths == {"ckpt/one.bin": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]}, tenths


WARM_UP = r"""
import torch
from torch.distributed.checkpoint.state_dict import get_state_dict
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.AdamW(model.parameters(), lr=0.1)
get_state_dict(model, opt)  # a state dict built up front: a zero-lr step creates AdamW's state
for _ in range(3):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
sched_opt = torch.optim.SGD(model.parameters(), lr=0.0)  # a schedule that starts at zero trains all the same
model(torch.randn(2, 4)).sum().backward()
sched_opt.step()
"""


def test_the_step_that_only_creates_the_optimizers_state_is_no_step(tmp_path):
    rec = Recorder()
    with ProbeServer(rec) as server:
        env = {**os.environ, "RANK": "0", **auto.environment(server.address, tmp_path, [tmp_path / "ckpt"],
                                                             pythonpath=str(REPO))}
        out = subprocess.run([sys.executable, "-c", WARM_UP], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # AdamW's own count is 2..4 after the warm-up step: numbered as the training steps they are
    assert [e["info"]["step"] for e in rec.points("step.end")] == [1, 2, 3, 1]
    assert [r["step"] for r in read_jsonl(tmp_path / "trajectory.jsonl")] == [1, 2, 3, 1]
