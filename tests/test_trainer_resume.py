"""The reference trainer's checkpoints are complete: real torchrun runs, compared bit for bit."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from ckpt_chaos.run.controller import ProbeServer
from ckpt_chaos.env.launcher import launch
from tests.helpers import final_state, log_tail, mismatches, train, trainer_args, trainer_events, trajectory

pytestmark = pytest.mark.slow

# Relative loss difference allowed after a world-size change; see README "World-size change".
WORLD_CHANGE_REL_TOL = 0.03


def test_stop_and_resume_is_bit_exact_mid_epoch_and_mid_accumulation(golden, tmp_path):
    gold = golden(2)
    # 10 micro-batches = step 5 boundary (mid-epoch: 6 steps per epoch); 17 = step 8 + 1 micro-batch,
    # inside a gradient-accumulation cycle, in the second epoch.
    assert train(tmp_path, stop_after_microbatches=10) == 0, log_tail(tmp_path)
    assert train(tmp_path, stop_after_microbatches=17) == 0, log_tail(tmp_path)
    assert train(tmp_path) == 0, log_tail(tmp_path)
    loads = trainer_events(tmp_path, "loaded")
    assert [e["name"] for e in loads] == ["step_00000005", "step_00000008.001"]
    assert all(e["digests"] == e["saved_digests"] for e in loads), "loaded state differs from saved state"
    assert "grads" in loads[1]["digests"], "mid-accumulation checkpoint must carry the partial gradients"
    assert mismatches(gold, tmp_path) == []
    assert final_state(tmp_path) == final_state(gold)


@pytest.mark.nightly
def test_stop_before_the_first_optimizer_step_resumes_bit_exact(golden, tmp_path):
    """A checkpoint one micro-batch into step 1, before AdamW has ever stepped, holds the optimizer's
    state like any other, and the resume is bit-exact. Found by ``ckpt-chaos explore`` (a SIGTERM at
    the first micro-batch): the resume failed with "Missing key in checkpoint state_dict:
    optim.state...", because AdamW makes its state at its first step and the save had none."""
    gold = golden(2)
    assert train(tmp_path, stop_after_microbatches=1) == 0, log_tail(tmp_path)
    assert train(tmp_path) == 0, log_tail(tmp_path)
    (load,) = trainer_events(tmp_path, "loaded")
    assert load["name"] == "step_00000000.001" and load["digests"] == load["saved_digests"]
    assert mismatches(gold, tmp_path) == []
    assert final_state(tmp_path) == final_state(gold)


@pytest.mark.parametrize("fused", [False, True], ids=["for-loop", "fused"])
def test_eager_optimizer_state_is_the_state_adamw_makes_at_its_first_step(fused):
    """``init_optimizer_state`` changes nothing numerically (three steps bit-identical to a lazily
    initialized AdamW, fused as the reference trainer's or not), and torch's ``get_state_dict`` no
    longer fakes a step on it."""
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from reference_trainer.state import init_optimizer_state

    def run(eager: bool):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, fused=fused)
        if eager:
            init_optimizer_state(opt)
            _, sd = get_state_dict(model, opt)
            assert {float(s["step"]) for s in sd["state"].values()} == {0.0}
        for i in range(3):
            opt.zero_grad()
            model(torch.randn(2, 4, generator=torch.Generator().manual_seed(i))).pow(2).sum().backward()
            opt.step()
        return [p.detach().clone() for p in model.parameters()], [float(s["step"]) for s in opt.state.values()]

    (lazy, lazy_steps), (eager, eager_steps) = run(False), run(True)
    assert all(torch.equal(a, b) for a, b in zip(lazy, eager)) and lazy_steps == eager_steps == [3.0, 3.0]


@pytest.mark.nightly
def test_async_save_trajectory_and_resume_are_bit_exact(golden, tmp_path):
    gold = golden(2)
    assert train(tmp_path, async_save=True, stop_after_microbatches=18) == 0, log_tail(tmp_path)
    assert train(tmp_path, async_save=True) == 0, log_tail(tmp_path)
    saves = trainer_events(tmp_path, "saved")
    assert any(s["asynchronous"] for s in saves)
    assert trainer_events(tmp_path, "loaded")[0]["name"] == "step_00000009"
    assert mismatches(gold, tmp_path) == []
    assert final_state(tmp_path)["state_digest"] == final_state(gold)["state_digest"]


@pytest.mark.parametrize("saved_world,resumed_world", [(4, 2), (2, 4)])
@pytest.mark.nightly
def test_world_size_change_loads_the_saved_state_and_stays_within_tolerance(golden, tmp_path, saved_world,
                                                                            resumed_world):
    gold = golden(saved_world)
    assert train(tmp_path, saved_world, stop_after_microbatches=12) == 0, log_tail(tmp_path)
    assert train(tmp_path, resumed_world) == 0, log_tail(tmp_path)
    (load,) = trainer_events(tmp_path, "loaded")
    assert load["saved_world_size"] == saved_world and load["world_size"] == resumed_world
    for part in ("model", "optimizer", "scheduler", "counters", "dataloader"):
        assert load["digests"][part] == load["saved_digests"][part], f"{part} changed across the world-size change"
    a, b = trajectory(gold), trajectory(tmp_path)
    assert sorted(a) == sorted(b)
    for step in a:
        # The same samples in the same global order, whatever the world size.
        assert a[step]["batch_digest"] == b[step]["batch_digest"], f"step {step}: different samples"
        rel = abs(a[step]["loss"] - b[step]["loss"]) / abs(a[step]["loss"])
        assert rel <= WORLD_CHANGE_REL_TOL, f"step {step}: loss differs by {rel:.2%}"
        if step <= 6:
            assert a[step]["loss_hex"] == b[step]["loss_hex"], "steps before the resume are not the golden ones"


@pytest.mark.nightly
def test_sigkill_of_a_rank_mid_shard_write_resumes_from_the_previous_checkpoint(golden, tmp_path):
    gold = golden(2)
    killed = []

    def on_event(ev):  # rank 1, half-way through its shard of the step-8 checkpoint
        if (ev["point"] == "ckpt.shard.write" and ev["rank"] == 1 and ev["info"]["fraction"] >= 0.5
                and not killed and (tmp_path / "checkpoints" / ".tmp-step_00000008").exists()):
            killed.append(ev)
            os.kill(ev["pid"], signal.SIGKILL)  # while the rank is blocked at this exact point

    with ProbeServer(on_event) as server:
        job = launch(tmp_path, 2, trainer_args(tmp_path), controller=server.address)
        try:
            rc = job.wait(120)
        finally:
            job.kill()
    assert killed, "the fault never fired"
    assert rc != 0
    ckpts = tmp_path / "checkpoints"
    assert not (ckpts / "step_00000008").exists(), "a save killed mid-write must not be committed"
    assert (ckpts / "latest").read_text() == "step_00000004"
    assert train(tmp_path) == 0, log_tail(tmp_path)
    (load,) = trainer_events(tmp_path, "loaded")
    assert load["name"] == "step_00000004"
    assert any(e["name"] == ".tmp-step_00000008" for e in trainer_events(tmp_path, "stray_removed"))
    assert mismatches(gold, tmp_path) == []


@pytest.mark.parametrize("damage", ["flip_byte", "missing_shard", "missing_manifest"])
@pytest.mark.nightly
def test_damaged_newest_checkpoint_is_rejected_and_the_older_one_used(golden, tmp_path, damage):
    gold = golden(2)
    assert train(tmp_path, stop_after_microbatches=16) == 0, log_tail(tmp_path)
    newest = tmp_path / "checkpoints" / "step_00000008"
    shard = newest / "__1_0.distcp"
    if damage == "flip_byte":
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data))
    elif damage == "missing_shard":
        shard.unlink()
    else:
        (newest / "manifest.json").unlink()
    assert train(tmp_path) == 0, log_tail(tmp_path)
    (load,) = trainer_events(tmp_path, "loaded")
    assert load["name"] == "step_00000004"
    (name, reason), = load["rejected"]
    expected = {"flip_byte": "fails its XXH3-128 checksum", "missing_shard": "__1_0.distcp is missing",
                "missing_manifest": "manifest.json is missing"}[damage]
    assert name == "step_00000008" and expected in reason
    rejected = list((tmp_path / "checkpoints" / "rejected").iterdir())
    assert len(rejected) == 1 and (rejected[0] / "REJECTED_BECAUSE").read_text().strip() == reason
    assert mismatches(gold, tmp_path) == []


@pytest.mark.nightly
def test_when_every_checkpoint_fails_on_load_the_run_starts_afresh_from_a_clean_state(golden, tmp_path):
    # The load verifies each shard as it reads it, so it has copied the intact rank's tensors by the
    # time the other rank's shard fails: a fresh start must not train on from those.
    gold = golden(2)
    assert train(tmp_path, stop_after_microbatches=16) == 0, log_tail(tmp_path)
    names = ["step_00000008", "step_00000004"]
    for name in names:
        shard = tmp_path / "checkpoints" / name / "__1_0.distcp"
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data))
    assert train(tmp_path) == 0, log_tail(tmp_path)
    fresh = trainer_events(tmp_path, "fresh_start")[-1]  # the first launch started fresh too
    assert [name for name, _ in fresh["rejected"]] == names
    assert all("__1_0.distcp fails its XXH3-128 checksum" in reason for _, reason in fresh["rejected"])
    assert [e["name"] for e in trainer_events(tmp_path, "ckpt_rejected")] == names
    assert mismatches(gold, tmp_path) == []


def test_each_shard_is_verified_by_exactly_one_rank_at_any_world_size():
    from reference_trainer.checkpoint import _verifier, read_while_loading
    files = [f"__{r}_0.distcp" for r in range(4)]
    for world in (1, 2, 3, 4, 8):
        owners = {f: _verifier(f, world) for f in files}
        assert all(0 <= r < world for r in owners.values())
        assert set(owners.values()) == set(range(min(world, len(files))))
    assert read_while_loading("__0_0.distcp") and not read_while_loading(".metadata")


# Resumed after step 5. Dropout masks and batches show at step 6 itself; wrong Adam moments only
# change the update of step 6, so the first loss they can change is step 7's.
@pytest.mark.parametrize("module,part,first_divergent_step", [
    ("tests.planted.rng_not_restored", "rng", 6),
    ("tests.planted.loader_not_restored", "dataloader", 6),
    ("tests.planted.optimizer_not_restored", "optimizer", 7),
])
def test_bit_exact_check_catches_planted_bug(golden, tmp_path, module, part, first_divergent_step):
    gold = golden(2)
    assert train(tmp_path, module=module, stop_after_microbatches=10) == 0, log_tail(tmp_path)
    assert train(tmp_path, module=module) == 0, log_tail(tmp_path)
    diffs = mismatches(gold, tmp_path)
    assert diffs, f"planted bug {module} went unnoticed"
    assert min(step for step, _ in diffs) == first_divergent_step
    (load,) = trainer_events(tmp_path, "loaded")
    differing = {k for k in load["saved_digests"] if load["digests"][k] != load["saved_digests"][k]}
    assert differing == {part}


@pytest.mark.nightly
def test_retention_keeps_last_k_and_milestones(tmp_path):
    assert train(tmp_path, ckpt_every_steps=2, keep_last=2, keep_every=4, max_steps=10,
                 record_digests=False) == 0, log_tail(tmp_path)
    kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert kept == ["latest", "step_00000004", "step_00000008", "step_00000010"]
    # the milestone step 8 and the last two (8, 10); step 4 is a milestone too; 2 and 6 are gone


@pytest.mark.nightly
def test_sigterm_writes_an_emergency_checkpoint_and_loses_no_step(golden, tmp_path):
    gold = golden(2)
    job_box = []

    def on_event(ev):  # the preemption notice arrives while rank 0 is inside step 7
        if ev["point"] == "microstep.end" and ev["rank"] == 0 and ev["info"] == {"step": 7, "micro": 1}:
            job_box[0].signal(signal.SIGTERM)  # to torchrun, which forwards it to its workers

    with ProbeServer(on_event) as server:
        job = launch(tmp_path, 2, trainer_args(tmp_path), controller=server.address)
        job_box.append(job)
        try:
            job.wait(120)
        finally:
            job.kill()
    (stop,) = trainer_events(tmp_path, "stopped")
    assert stop["reason"] == "preempt"
    # torchrun forwards the signal when it gets to it: the stop lands inside step 7 or a little later,
    # and the emergency checkpoint holds every step completed before it.
    assert stop["step"] >= 6
    assert max(trajectory(tmp_path)) == stop["step"]
    assert train(tmp_path) == 0, log_tail(tmp_path)
    (load,) = trainer_events(tmp_path, "loaded")
    assert (load["step"], load["micro"]) == (stop["step"], stop["micro"])  # zero lost work
    assert mismatches(gold, tmp_path) == []


def test_incompatible_config_on_resume_names_the_field(tmp_path):
    assert train(tmp_path, stop_after_microbatches=8) == 0, log_tail(tmp_path)
    assert train(tmp_path, d_model=32) != 0
    assert "d_model: checkpoint has 64, this run has 32" in (tmp_path / "torchrun.log").read_text()


def _gather_in_rank(rank: int, world: int, store_path: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from reference_trainer.state import _gathered

    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        g = torch.Generator().manual_seed(0)
        # rows that do not divide by the world (padding), two dtypes, an empty tensor, plain values
        full = {"a": torch.randn(5, 3, generator=g), "b": [torch.randn(7, dtype=torch.float64, generator=g),
                                                          torch.randn(4, 2, generator=g)],
                "empty": torch.zeros(0, 3), "step": torch.tensor(3.0), "lr": 0.5, "none": None}
        tree = {"a": distribute_tensor(full["a"], mesh, [Shard(0)]),
                "b": [distribute_tensor(t, mesh, [Shard(0)]) for t in full["b"]],
                "empty": distribute_tensor(full["empty"], mesh, [Shard(0)]),
                "step": full["step"], "lr": 0.5, "none": None}
        got = _gathered(tree)
        pairs = [(got["a"], full["a"]), (got["b"][0], full["b"][0]), (got["b"][1], full["b"][1]),
                 (got["empty"], full["empty"]), (got["step"], full["step"])]
        assert all(x.dtype == y.dtype and torch.equal(x, y) for x, y in pairs), pairs
        assert got["lr"] == 0.5 and got["none"] is None
    finally:
        dist.destroy_process_group()
    # past this point only the interpreter's finalization is left, where gloo's threads can abort
    # the process (as reference_trainer.__main__.run_and_exit says); a failed assertion never gets here
    os._exit(0)


@pytest.mark.nightly  # make test: every planted-bug run compares these digests
def test_the_digests_gather_every_shard_whole_in_one_collective_per_dtype(tmp_path):
    """``_gathered`` packs a tree's shards into one ``all_gather`` per dtype; each tensor must come
    back as ``full_tensor`` gives it, padding rows and dtypes included, on every rank."""
    import torch.multiprocessing as mp

    mp.start_processes(_gather_in_rank, args=(2, str(tmp_path / "store")), nprocs=2, start_method="spawn")
