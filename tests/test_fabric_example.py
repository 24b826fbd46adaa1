"""Lightning Fabric's own fabric.save / fabric.load (examples/fabric, docs/analyses/fabric.md).

End to end (slow, nightly): a kill half-way through the step-8 checkpoint, once with TMPDIR on the
checkpoint folder's file system and once with faultfs mounted on that folder (TMPDIR then on another
one). Expected, from lightning/fabric/utilities/cloud_io.py:96-117 and fsspec's LocalFileOpener
(implementations/local.py:404-407, :449): the file is written in TMPDIR and shutil.move'd into place,
a rename on one file system (the kill leaves no step_8.ckpt: the relaunch resumes from step_4.ckpt, a
pass) and a copy into the final name across two (the kill leaves step_8.ckpt torn and the relaunch
loads it: no_torn_read@1 fails naming it, the known failure the scenario declares).
"""

from __future__ import annotations

import importlib.util

import pytest

from ckpt_chaos.report.results import apply_known_failure
from ckpt_chaos.run.runner import run_scenario
from ckpt_chaos.scenario import load
from tests.helpers import REPO

SCENARIOS = REPO / "examples" / "fabric" / "scenarios"
SAME_FS = SCENARIOS / "fabric-kill-rank0-mid-write-tmpdir-same-fs.toml"
OTHER_FS = SCENARIOS / "fabric-train--mid-write--kill-at-half-step-ckpt.toml"


def test_the_scenarios_load_into_the_compat_suite_with_tmpdir_in_the_run():
    scenarios = [load(p) for p in sorted(SCENARIOS.glob("*.toml"))]
    assert len(scenarios) >= 6
    for s in scenarios:
        assert "compat" in s.suites, s.name
        assert s.command.env.get("TMPDIR") == "{run_dir}/tmp", s.name  # never the machine's /tmp
    # the file.* triggers aimed at the final name need the staging folder watched
    assert all("tmp" in s.command.watch for s in scenarios if any(f.when.point.startswith("file.") for f in s.faults))


def _run(path, tmp_path, golden):
    s = load(path)
    row = run_scenario(s, tmp_path / s.name, golden).to_dict()
    if row["verdict"] == "skipped":
        pytest.skip(row["reason"])
    return s, row, {x["name"]: (x["verdict"], x["detail"]) for x in row["checks"]}


@pytest.mark.slow
@pytest.mark.nightly  # make test: tests/test_idioms.py holds the idiom model to these two Fabric cells' verdicts
@pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="lightning is not installed (the examples extra)")
def test_a_kill_mid_save_is_survived_beside_the_checkpoints_and_torn_across_file_systems(tmp_path, command_golden_root):
    _, row, c = _run(SAME_FS, tmp_path, command_golden_root)
    assert row["verdict"] == "pass", row["reason"]
    assert c["resume_from"][0] == "pass" and "checkpoints/step_4.ckpt" in c["resume_from"][1], c["resume_from"]

    s, row, c = _run(OTHER_FS, tmp_path, command_golden_root)
    assert c["fault_0_fired"][0] == "pass", c["fault_0_fired"]
    assert c["no_torn_read@1"][0] == "fail", c["no_torn_read@1"]
    assert "checkpoints/step_8.ckpt: " in c["no_torn_read@1"][1], c["no_torn_read@1"]
    assert apply_known_failure(row, s.expect.known_failure)["verdict"] == "xfail"
