"""ckpt-chaos installs next to a project's own torch: the core requires none, the reference trainer
and the examples carry it through their extras, and the automatic probe layer says when the
trainer's processes run a framework release outside the ones it supports. Unit tests: seconds."""

from __future__ import annotations

import os
import sys
import tomllib
import types

import pytest
from packaging.requirements import Requirement

from ckpt_chaos import cli, probe
from ckpt_chaos.check.history import ProbeEvent
from ckpt_chaos.config import builtin_scenarios
from ckpt_chaos.extras import EXTRAS
from ckpt_chaos.probe import auto_state, auto_torch, versions
from ckpt_chaos.run import runner
from ckpt_chaos.scenario import load
from tests.helpers import REPO

ABSENT = "no_such_module_for_ckpt_chaos"
SCENARIO = "kill-rank1-mid-shard-write"
LINE = "needs the 'trainer' extra: pip install 'ckpt-chaos[trainer]'"


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _names(requirements) -> dict[str, Requirement]:
    return {(r := Requirement(s)).name.lower(): r for s in requirements}


def test_the_core_requires_no_torch_and_the_trainer_and_examples_extras_carry_it():
    project = _project()
    extras = project["optional-dependencies"]
    core = _names(project["dependencies"])
    assert not {"torch", "torchdata", "lightning", "accelerate", "transformers"} & set(core), sorted(core)
    trainer = _names(extras["trainer"])
    assert {"torch", "torchdata"} <= set(trainer)
    assert "ckpt-chaos[trainer]" in extras["examples"]
    # the fault-family extras a project installs next to its torch bring none either
    for extra in ("storage", "cluster", "remote", "search", "report", "coverage", "all"):
        assert "torch" not in _names(r for r in extras[extra] if not r.startswith("ckpt-chaos[")), extra
        assert "ckpt-chaos[trainer]" not in extras[extra] and "trainer" not in str(extras[extra]), extra


def test_the_probe_layer_range_of_each_framework_is_the_examples_extras_and_holds_the_trainers_torch():
    examples = _names(r for r in _project()["optional-dependencies"]["examples"] if not r.startswith("ckpt-chaos["))
    for name in ("lightning", "accelerate", "transformers"):
        assert str(examples[name].specifier) == str(Requirement(f"x{versions.supported(name)}").specifier), name
    trainer_torch = _names(_project()["optional-dependencies"]["trainer"])["torch"]
    lo, _ = versions.SUPPORTED["torch"]
    assert trainer_torch.specifier.contains(lo + ".0")  # the reference trainer's series is one the layer supports


@pytest.mark.parametrize("name,version,ok", [
    ("torch", "2.13.0+cpu", True), ("torch", "2.14.1", True), ("torch", "2.14.1+cu128", True),
    ("torch", "2.15.0", False), ("torch", "2.12.1", False), ("torch", "2.15.0.dev20260101", False),
    ("torch", None, False), ("lightning", "2.6.6", True), ("lightning", "3.0.0", False),
    ("accelerate", "1.14.0", False), ("transformers", "5.24.0", True), ("transformers", "4.57.6", False),
    ("safetensors", "0.1", True),  # no range: not a framework the layer patches
])
def test_a_release_outside_the_range_is_said_in_one_line(name, version, ok):
    why = versions.unsupported(name, version)
    assert (why is None) == ok, why
    if not ok:
        assert why.startswith(f"{name} {version or '(version unknown)'} is outside") and versions.supported(name) in why
        assert "\n" not in why


@pytest.fixture
def layer(monkeypatch):
    """A fresh state of the automatic layer in this process, its points captured instead of sent."""
    # reset in place: the layer's modules share this one object (probe/auto_state.py)
    for key, value in vars(auto_state._State()).items():
        monkeypatch.setattr(auto_state._s, key, value)
    auto_state._s.pid = os.getpid()
    sent: list[tuple[str, dict]] = []
    monkeypatch.setattr(probe, "point", lambda name, /, **info: sent.append((name, info)))
    return sent


def test_a_faked_torch_outside_the_range_goes_out_in_probe_armed_and_becomes_a_warning_in_the_result(layer):
    fake = types.ModuleType("torch")
    fake.__version__ = "2.99.0"
    assert auto_torch._found(fake).startswith("torch 2.99.0 is outside the releases the probe layer supports (torch>=2.13,<2.15)")
    auto_state._arm("torch.optim")
    auto_state._point("step.end", step=1)
    auto_state._point("step.end", step=2)  # told once
    armed = [info for name, info in layer if name == "probe.armed"]
    assert len(armed) == 1 and armed[0]["versions"] == {"torch": "2.99.0"}
    assert armed[0]["unsupported"] == [auto_state._s.unsupported[0]]

    history = [ProbeEvent(t=1.0, point="probe.armed", rank=r, pid=10 + r, launch=0, info=armed[0]) for r in (0, 1)]
    check = runner.probe_versions(history)
    assert check["verdict"] == "warn" and check["detail"] == auto_state._s.unsupported[0]  # once, not once per rank


def test_a_release_is_checked_when_the_import_hook_patches_its_module(layer, capsys):
    class Loader:  # the module's own loader: transformers of a release the layer does not support
        def exec_module(self, module):
            module.__version__ = "4.57.6"

    module = types.ModuleType("transformers")
    auto_torch._Loader(Loader(), auto_torch._AFTER_IMPORT["transformers"]).exec_module(module)
    assert auto_state._s.versions == {"transformers": "4.57.6"}
    assert "transformers 4.57.6 is outside" in capsys.readouterr().err  # the trainer's log says it too
    auto_state._point("step.end", step=1)
    assert "transformers 4.57.6 is outside" in layer[0][1]["unsupported"][0]


def test_supported_releases_pass_and_a_run_without_the_layer_has_no_such_check(layer):
    fake = types.ModuleType("torch")
    fake.__version__ = "2.13.0+cpu"
    assert auto_torch._found(fake) is None
    auto_state._point("step.end", step=1)
    history = [ProbeEvent(t=1.0, point="probe.armed", rank=0, pid=1, launch=0, info=layer[0][1])]
    check = runner.probe_versions(history)
    assert check["verdict"] == "pass" and check["detail"].startswith("torch 2.13.0+cpu:")
    assert runner.probe_versions([ProbeEvent(t=1.0, point="train.start", rank=0, pid=1, launch=0)]) is None


def test_the_reference_trainer_without_torch_stops_a_run_with_one_line_naming_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(EXTRAS, "trainer", (ABSENT,))
    monkeypatch.chdir(tmp_path)
    code = cli.main(["run", SCENARIO, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == cli.EXIT_CANNOT_RUN
    assert err == [f"ckpt-chaos run: {SCENARIO} trains the reference trainer, which {LINE}"]
    assert not (tmp_path / "out").exists()


def test_the_runner_skips_a_reference_trainer_scenario_without_torch_with_that_line(monkeypatch, tmp_path):
    monkeypatch.setitem(EXTRAS, "trainer", (ABSENT,))
    r = runner.run_scenario(load(builtin_scenarios() / "process" / f"{SCENARIO}.toml"), tmp_path / "out",
                            tmp_path / "golden")
    assert r.verdict == "skipped" and r.reason == f"cannot train: {LINE}"


def test_the_harness_imports_no_torch():
    """The CLI, runner, checks and reports import no torch at module level (a fresh interpreter)."""
    import subprocess

    code = ("import sys, ckpt_chaos.cli, ckpt_chaos.run.runner, ckpt_chaos.run.parallel, ckpt_chaos.check.judge, "
            "ckpt_chaos.report.results, ckpt_chaos.pytest_plugin, ckpt_chaos.probe.auto; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'torchdata', 'lightning', 'accelerate', 'transformers')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
