"""benchmarks/cuda/check_cuda.py, the check of the reference trainer on a CUDA GPU, as far as a
machine without one can take it: its scenarios load, are one rank on CUDA and name every scenario
it treats specially; asked for CUDA where there is none it fails loudly (exit 2) and runs nothing.
The CPU path of the whole script (``--device cpu``) takes minutes: run by hand, not here."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_chaos.scenario import load

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "cuda" / "check_cuda.py"
_spec = importlib.util.spec_from_file_location("check_cuda", SCRIPT)
check_cuda = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_cuda)


def test_scenarios_are_one_rank_on_cuda():
    paths = sorted(check_cuda.SCENARIOS.glob("*.toml"))
    assert len(paths) >= 3
    names = set()
    for p in paths:
        s = load(p)
        names.add(s.name)
        assert s.world_size == 1, p  # one GPU: NCCL refuses two ranks on one device
        assert s.trainer["device"] == "cuda", p
        assert {k: s.trainer[k] for k in check_cuda.TRAIN} == check_cuda.TRAIN, p  # the direct runs' training
    assert check_cuda.AGENT_SCENARIO in names
    assert set(check_cuda.NEEDS_SUPPORTED_TORCH) <= names


def test_scenario_copies_set_the_device(tmp_path):
    names = check_cuda.scenario_copies(tmp_path, "cpu", [check_cuda.AGENT_SCENARIO])
    assert names == [check_cuda.AGENT_SCENARIO]
    assert load(tmp_path / f"{check_cuda.AGENT_SCENARIO}.toml").trainer["device"] == "cpu"


def test_no_gpu_fails_loudly(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    p = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "NO CUDA GPU SEEN" in p.stdout
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["exit_status"] == 2
    assert {c["stage"] for c in summary["checks"]} == {"preflight"}  # nothing trained
