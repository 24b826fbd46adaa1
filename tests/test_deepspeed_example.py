"""DeepSpeed's own save_checkpoint / load_checkpoint (examples/deepspeed, docs/analyses/deepspeed.md).

End to end (slow, nightly; needs deepspeed, `make stacks`): the scenario that shows DeepSpeed moving
`latest` to global_step8 while rank 1's optimizer shard there is half written. Expected, from
deepspeed/runtime/engine.py 0.19.8 (no collective between the tag check, :4912, and the barrier
after `latest`, :4964; each rank of a relaunch reads its own shard, :4815-4819): the relaunch's
rank 1 fails to load the torn shard while rank 0 loaded its own files of global_step8, so
no_torn_read@1 fails naming that shard, the known failure the scenario declares.

Fast: the evidence a relaunch like that leaves, one rank's load raising on a torn file and another
rank's load of another file succeeding, is a torn read, not a fall back: the rank that raised went on
to nothing.
"""

from __future__ import annotations

import importlib.util

import pytest

from ckpt_chaos.report.results import apply_known_failure
from ckpt_chaos.run.runner import run_scenario
from ckpt_chaos.scenario import load
from tests.helpers import REPO

SCENARIOS = REPO / "examples" / "deepspeed" / "scenarios"
LATEST_FIRST = SCENARIOS / "deepspeed-latest-moves-before-rank1-shard-is-written.toml"
SHARD = "checkpoints/global_step8/zero_pp_rank_1_mp_rank_00_optim_states.pt"


@pytest.mark.slow
@pytest.mark.nightly  # make test: the fast test below judges the evidence such a relaunch leaves
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                    reason="deepspeed is not installed (make stacks: pip install -c constraints.txt -e '.[deepspeed]')")
def test_latest_moved_before_rank1_wrote_its_shard_is_a_torn_read_of_that_shard(tmp_path, command_golden_root):
    s = load(LATEST_FIRST)
    result = run_scenario(s, tmp_path / "out", command_golden_root)
    row = result.to_dict()
    c = {x["name"]: (x["verdict"], x["detail"]) for x in row["checks"]}
    for name in ("fault_0_fired", "fault_1_fired", "fault_0_landed"):
        assert c[name][0] == "pass", (name, c[name][1])
    assert c["no_torn_read@1"][0] == "fail", c["no_torn_read@1"]
    assert f"{SHARD}: " in c["no_torn_read@1"][1] and "never completed" in c["no_torn_read@1"][1], c["no_torn_read@1"]
    assert "checkpoints/global_step8" in c["resumed_newest@1"][1], c["resumed_newest@1"]
    assert c["job_completed"][0] == "fail", c["job_completed"]
    assert apply_known_failure(row, s.expect.known_failure)["verdict"] == "xfail"


def test_a_load_that_raised_on_a_rank_that_went_on_to_nothing_is_a_torn_read_not_a_fall_back(tmp_path):
    """Rank 1's torch.load of the torn step_8.pt raises and rank 1 loads nothing more (it dies); rank 0
    loads step_4.pt. The relaunch read the torn file: no_torn_read@1 fails naming it. Rank 1 tried
    nothing and went on from nothing, whatever rank 0 loaded."""
    from ckpt_chaos.check.resume import resumes
    from ckpt_chaos.check.verdict import Report
    from tests.test_save_idioms_evidence import _fallback_events, _stored_fallback_run

    stuck, whole = _fallback_events(tmp_path, "step_8.pt", "step_4.pt")
    events = [{**e, "rank": 1, "pid": 5} for e in stuck] + [{**e, "rank": 0, "pid": 6} for e in whole]
    run = _stored_fallback_run(tmp_path / "two-ranks", events)
    r = run.evidence.resumed_from(1)
    assert (r.checkpoint, r.tried) == ("checkpoints/step_4.pt", []), r
    assert "checkpoints/step_8.pt" in r.files, r
    report = Report(launches=2)
    resumes(run, report)
    got = {c.name: (c.verdict, c.detail) for c in report.checks}
    assert got["no_torn_read@1"][0] == "fail" and "checkpoints/step_8.pt: 9592 of 19184" in got["no_torn_read@1"][1], got
