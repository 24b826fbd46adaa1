"""What a scenario promises of a ``[command]`` trainer is held to, and what the checks measure of it is
said: one stored run of the plain DDP example (rank 0 killed half-way through its 2nd checkpoint file,
the session's ``plain_ddp_mid_write``) checked again under other declarations of the same trainer."""

from __future__ import annotations

import dataclasses

import pytest

from ckpt_chaos.check import any_trainer
from ckpt_chaos.scenario import ScenarioError, from_dict

pytestmark = pytest.mark.slow


def recheck(stored, expect: dict | None = None, command: dict | None = None) -> dict[str, tuple[str, str]]:
    """The stored run's checks under the scenario with ``expect`` and ``command`` keys changed (the
    files are read only)."""
    s = stored.scenario
    s = dataclasses.replace(s, expect=dataclasses.replace(s.expect, **(expect or {})),
                            command=dataclasses.replace(s.command, **(command or {})))
    report = any_trainer.check_run(s, stored.run_dir, stored.golden)
    return {c.name: (c.verdict, c.detail) for c in report.checks}


# ---- lost work: expect.max_lost_steps and command.saves_in_flight ----------------------------------

def test_max_lost_steps_is_the_bound_for_a_command_trainer(plain_ddp_mid_write):
    # the example saves every 4 steps, each save whole before the next step: killed half-way through
    # the save of step 8, it resumes from step 4 and trains steps 5..8 again, more than a promise of 3
    c = recheck(plain_ddp_mid_write, expect={"max_lost_steps": 3})
    assert c["lost_work@1"] == ("fail", "4 step(s) trained again, at most 3 allowed (expect.max_lost_steps): it "
                                        "went back to step 4 from 8"), c["lost_work@1"]
    assert recheck(plain_ddp_mid_write, expect={"max_lost_steps": 4})["lost_work@1"][0] == "pass"


def test_saves_in_flight_allows_a_save_more_to_be_lost(plain_ddp_mid_write):
    # a save of the example's is whole before the next step, so at most one is ever in flight
    c = recheck(plain_ddp_mid_write, command={"saves_in_flight": 1})
    assert c["lost_work@1"] == ("pass", "4 step(s) trained again, at most 8 allowed (2 × command.save_every: "
                                        "command.saves_in_flight = 1)"), c["lost_work@1"]


def test_without_a_bound_lost_work_says_what_to_declare(plain_ddp_mid_write):
    c = recheck(plain_ddp_mid_write, command={"save_every": None})
    assert c["lost_work@1"] == ("n/a", "neither command.save_every nor expect.max_lost_steps is given")
    c = recheck(plain_ddp_mid_write, command={"save_every": None}, expect={"max_lost_steps": 4})
    assert c["lost_work@1"][0] == "pass", c["lost_work@1"]


COMMAND = {"argv": ["train.py"], "save_every": 4}


@pytest.mark.parametrize("command, expect, key, message", [
    ({"saves_in_flight": 1, "save_every": None}, {}, "command.saves_in_flight",
     "counts saves of command.save_every steps, which is not given; give command.save_every"),
    ({"saves_in_flight": -1}, {}, "command.saves_in_flight", "-1; use how many saves may still be writing"),
    ({}, {"max_lost_steps": -2}, "expect.max_lost_steps", "-2; use the steps a relaunch may train again"),
])
def test_a_bound_that_cannot_hold_is_refused_naming_the_key(command, expect, key, message):
    table = {"command": {k: v for k, v in {**COMMAND, **command}.items() if v is not None}, "expect": expect}
    with pytest.raises(ScenarioError, match=rf"^s\.toml: {key}: ") as e:
        from_dict(table, "s.toml", "s")
    assert message in str(e.value), e.value
