"""Configuration errors, the data order's independence of world size, checkpoint validation."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt_chaos.env.launcher import run_to_end
from tests.helpers import REPO
from reference_trainer.checkpoint import checkpoint_name, parse_name, validate, write_durably
from reference_trainer.config import ConfigError, TrainConfig, load_config, resume_mismatches
from reference_trainer.data import GlobalBatchSampler


def run_trainer_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reference_trainer", *args], cwd=REPO, capture_output=True,
                          text=True, env=env, timeout=120)


def test_malformed_toml_names_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("max_steps = = 3\n")
    with pytest.raises(ConfigError, match=r"bad\.toml: not valid TOML"):
        load_config(bad)


def test_unknown_key_lists_allowed_keys(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[trainer]\nmax_step = 3\n")
    with pytest.raises(ConfigError, match=r"c\.toml: unknown key 'max_step'; allowed keys: .*max_steps"):
        load_config(f)


def test_wrong_type_names_field_and_type(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('global_batch = "sixteen"\n')
    with pytest.raises(ConfigError, match=r"global_batch='sixteen' is not a valid int"):
        load_config(f)


@pytest.mark.parametrize("field,value", [("keep_every", -3), ("ckpt_every_steps", -1), ("ckpt_every_seconds", -0.5),
                                         ("upload_drain_s", -1.0)])
def test_a_negative_cadence_or_retention_count_is_refused_naming_the_field(field, value):
    """Not taken for "off": a negative keep_every would make every checkpoint a milestone."""
    with pytest.raises(ConfigError, match=rf"^{field}={value} must be >= 0$"):
        TrainConfig(**{field: value}).validate()
    TrainConfig(**{field: 0}).validate()


def test_world_size_that_does_not_divide_global_batch_is_rejected_with_the_sizes_that_fit():
    cfg = TrainConfig(global_batch=16, grad_accum=2)
    with pytest.raises(ConfigError, match=r"global_batch=16 is not divisible by world_size=3 x grad_accum=2; "
                                          r"world sizes that fit: \[1, 2, 4, 8\]"):
        cfg.validate(3)


def test_cli_reports_a_config_error_in_one_line_before_any_process_group():
    out = run_trainer_cli("--global-batch", "16", "--n-heads", "5")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert lines == ["reference_trainer: config error: d_model=64 must be divisible by n_heads=5"]


@pytest.mark.slow
@pytest.mark.nightly
def test_torchrun_with_impossible_world_size_fails_fast_naming_the_field(tmp_path):
    rc = run_to_end(tmp_path, 3, ["--global-batch=16", f"--run-dir={tmp_path}"], timeout=120)
    assert rc != 0
    log = (tmp_path / "torchrun.log").read_text()
    assert "config error: global_batch=16 is not divisible by world_size=3" in log
    assert not (tmp_path / "trajectory.jsonl").exists()


def test_resume_mismatch_ignores_fields_that_may_change():
    saved = TrainConfig().to_dict()
    assert resume_mismatches(saved, TrainConfig(max_steps=40, keep_last=5, device="cpu", run_dir="x")) == []
    assert resume_mismatches(saved, TrainConfig(lr=1.0)) == ["lr: checkpoint has 0.003, this run has 1.0"]
    # another thread count changes the kernels' reduction order, so the bits
    assert resume_mismatches(saved, TrainConfig(threads=2)) == ["threads: checkpoint has 1, this run has 2"]


@settings(max_examples=60, deadline=None)
@given(world_exp=st.integers(0, 3), accum=st.sampled_from([1, 2, 4]), steps=st.integers(1, 12),
       size=st.integers(8, 70))
def test_the_job_sees_the_same_samples_in_the_same_order_at_any_world_size(world_exp, accum, steps, size):
    """Concatenating every rank's micro-batches in (micro, rank) order gives one world-independent stream."""
    world = 2 ** world_exp
    cfg = TrainConfig(global_batch=8 * accum, grad_accum=accum, dataset_size=size)

    def stream(w: int) -> list[int]:
        iters = [iter(GlobalBatchSampler(cfg, r, w)) for r in range(w)]
        out = []
        for _ in range(steps * accum):
            for it in iters:
                out += next(it)
        return out

    reference = stream(1)
    assert stream(world) == reference
    for epoch_start in range(0, len(reference) - size + 1, size):  # each full epoch is a permutation
        assert sorted(reference[epoch_start:epoch_start + size]) == list(range(size))


def test_sampler_state_is_global_and_resumes_at_another_world_size():
    cfg = TrainConfig(global_batch=8, grad_accum=1, dataset_size=20)
    one = iter(GlobalBatchSampler(cfg, 0, 1))
    for _ in range(3):
        next(one)
    saved = GlobalBatchSampler(cfg, 0, 1)
    saved.consumed = 24
    halves = [GlobalBatchSampler(cfg, r, 2) for r in range(2)]
    for h in halves:
        h.load_state_dict(saved.state_dict())
    assert next(iter(halves[0])) + next(iter(halves[1])) == next(one)


def test_checkpoint_names_sort_by_position():
    names = [checkpoint_name(3, 1), checkpoint_name(10), checkpoint_name(3), checkpoint_name(2, 5)]
    assert sorted(names, key=parse_name) == ["step_00000002.005", "step_00000003", "step_00000003.001", "step_00000010"]
    assert parse_name("step_00000003.tmp") is None and parse_name(".tmp-step_00000003") is None


def test_validate_reports_each_kind_of_damage(tmp_path):
    d = tmp_path / "step_00000004"
    d.mkdir()
    assert validate(d) == "manifest.json is missing"
    (d / ".metadata").write_bytes(b"meta")
    import hashlib
    manifest = {"format": 1, "step": 4, "micro": 0,
                "files": {".metadata": {"size": 4, "sha256": hashlib.sha256(b"meta").hexdigest()}}}
    write_durably(d / "manifest.json", json.dumps(manifest).encode())
    assert validate(d) is None
    (d / ".metadata").write_bytes(b"meTa")
    assert validate(d) == ".metadata fails its SHA-256 checksum"
    assert validate(d, verify_checksums=False) is None
    (d / ".metadata").write_bytes(b"met")
    assert validate(d) == ".metadata has 3 bytes, manifest says 4"
    renamed = tmp_path / "step_00000005"
    d.rename(renamed)
    assert validate(renamed).startswith("manifest says step 4.0, directory is step_00000005")
