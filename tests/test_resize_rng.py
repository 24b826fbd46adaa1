"""Whose random stream each rank goes on with after a resume at another world size (``resize_rng``,
ckpt_chaos/check/trajectory.py): the rule the trainer declares, held to the digests the probe took of
each rank's streams at the save (``ckpt.stage``) and after the load (``load.end``), over recorded
histories; then the planted trainer whose rank r restores saved rank r % old world's streams, caught
by the catalogue's resize scenario (slow)."""

from __future__ import annotations

import dataclasses

import pytest

from ckpt_chaos.check.history import ProbeEvent
from ckpt_chaos.check.judge import REFERENCE
from ckpt_chaos.check.trajectory import resize_rng, resize_verdict
from ckpt_chaos.check.verdict import Report, Run
from ckpt_chaos.config import builtin_scenarios
from ckpt_chaos.scenario import load
from ckpt_chaos.scenario_model import Recovery, Scenario

SHRINK = builtin_scenarios() / "process" / "kill-node-resume-on-two-of-four.toml"
N4 = "step_00000004"
SAVED = {r: f"saved{r}" for r in range(4)}  # four ranks' streams, each its own


def test_keep_holds_a_surviving_rank_to_its_own_stream_and_a_new_rank_to_a_fresh_one():
    assert resize_verdict("keep", 4, 2, SAVED, {0: "saved0", 1: "saved1"})[0] == "pass"
    v, detail = resize_verdict("keep", 2, 4, {0: "a", 1: "b"}, {0: "a", 1: "b", 2: "c", 3: "d"})
    assert v == "pass" and "rank(s) 0, 1 with their own saved streams and rank(s) 2, 3 with fresh streams" in detail
    # rank r restored saved rank r % 2's on a grow: the new ranks are copies
    v, detail = resize_verdict("keep", 2, 4, {0: "a", 1: "b"}, {0: "a", 1: "b", 2: "a", 3: "b"})
    assert v == "fail"
    assert detail.startswith("new rank 2 went on with a copy of saved rank 0's stream, not a fresh one; new rank 3 "
                             "went on with a copy of saved rank 1's stream"), detail
    v, detail = resize_verdict("keep", 4, 2, SAVED, {0: "x", 1: "saved0"})
    assert v == "fail" and "rank 0, there before the change, went on with a stream of its own instead of its own " \
                           "saved stream" in detail and "rank 1, there before the change, went on with saved rank " \
                           "0's stream" in detail, detail


def test_reseed_wants_every_rank_fresh_and_no_two_ranks_alike():
    assert resize_verdict("reseed", 4, 2, SAVED, {0: "x", 1: "y"}) == (
        "pass", "rank(s) 0, 1 with fresh streams, none a copy of a saved rank's or of another rank's, as the trainer "
        "declares (reseed)")
    v, detail = resize_verdict("reseed", 4, 2, SAVED, {0: "saved0", 1: "saved1"})  # r % 4 on a shrink
    assert v == "fail" and "rank 0 went on with its own saved stream, not a fresh one" in detail
    assert "(the trainer declares reseed: every rank goes on with a fresh stream of its own)" in detail
    v, detail = resize_verdict("reseed", 2, 4, {0: "a", 1: "b"}, {0: "x", 1: "y", 2: "x", 3: "z"})
    assert v == "fail" and "rank 0 went on with the same stream as rank 2" in detail, detail


def test_shared_wants_the_one_stream_the_saved_ranks_shared():
    assert resize_verdict("shared", 2, 4, {0: "s", 1: "s"}, dict.fromkeys(range(4), "s"))[0] == "pass"
    v, detail = resize_verdict("shared", 2, 4, {0: "s", 1: "s"}, {0: "s", 1: "s", 2: "s", 3: "t"})
    assert v == "fail" and "rank 3 went on with a stream of its own, not the stream the saved ranks shared" in detail


def test_missing_evidence_or_rule_is_unknown_naming_what_is_missing():
    v, detail = resize_verdict("keep", 2, 4, {0: "a", 1: None}, {0: "a", 1: "b", 2: "c"})
    assert v == "unknown" and "of saved rank 1, rank 3 after the load (ckpt.stage" in detail, detail
    v, detail = resize_verdict(None, 2, 4, {0: "a", 1: "b"}, {0: "a", 1: "b", 2: "c", 3: "d"})
    assert v == "unknown" and "resize_rng in its profile" in detail


def test_the_probe_digests_every_stream_without_drawing_from_any():
    import random

    import numpy as np
    import torch

    from ckpt_chaos.probe import rng_digest

    torch.manual_seed(1)
    first = rng_digest()
    assert rng_digest() == first  # taking it draws nothing
    digests = {first}
    for draw in (lambda: torch.rand(1), random.random, np.random.rand):
        draw()
        digests.add(rng_digest())
    assert len(digests) == 4  # each stream is in it


def test_the_probe_takes_the_digest_where_a_save_captures_the_streams_and_a_load_restored_them(monkeypatch):
    from ckpt_chaos import probe

    seen = []

    class Controller:  # the socket's end: what the rank reports
        def report(self, name, info):
            seen.append((name, set(info)))

    monkeypatch.setattr(probe, "_this_process", Controller)
    for name in ("ckpt.stage", "load.end", "step.begin"):
        probe.point(name, step=1)
    assert seen == [("ckpt.stage", {"step", "rng"}), ("load.end", {"step", "rng"}), ("step.begin", {"step"})]


def _probe(point, rank, launch, t, rng, name=N4):
    return ProbeEvent(t=t, point=point, rank=rank, pid=100 + rank, launch=launch, info={"name": name, "rng": rng})


def _run(tmp_path, restored: dict[int, str], saved_by_launch: dict[int, dict[int, str]], old=4, new=2,
         module="reference_trainer"):
    history = [_probe("ckpt.stage", r, launch, 1.0 + launch, d) for launch, by in saved_by_launch.items()
               for r, d in by.items()]
    history += [_probe("load.end", r, 2, 5.0, d) for r, d in restored.items()]
    events = [{"event": "committed", "name": N4, "attempt": 0, "t": 1.5},
              {"event": "loaded", "name": N4, "attempt": 2, "step": 4, "t": 5.1, "world_size": new,
               "saved_world_size": old}]
    s = Scenario(name="x", world_size=old, trainer_module=module, recovery=Recovery(world_size=new))
    return Run(s, tmp_path, tmp_path, history, events)


def _check(run):
    report = Report()
    resize_rng(run, report)
    return {c.name: (c.verdict, c.detail) for c in report.checks}


def test_the_check_reads_the_probe_s_digests_of_the_launch_that_committed_the_checkpoint(tmp_path):
    """Launch 1 staged step 4 again and was killed before committing it: the streams saved are launch 0's."""
    saved = {0: {r: f"saved{r}" for r in range(4)}, 1: {r: f"torn{r}" for r in range(4)}}
    assert _check(_run(tmp_path, {0: "fresh0", 1: "fresh1"}, saved))[f"resize_rng@{N4}"][0] == "pass"
    v, detail = _check(_run(tmp_path, {0: "saved0", 1: "saved1"}, saved))[f"resize_rng@{N4}"]
    assert v == "fail" and detail.startswith(f"launch 2 resumed from {N4}, saved by 4 rank(s), on 2: rank 0 went on "
                                             "with its own saved stream, not a fresh one"), detail


def test_the_check_says_unknown_where_the_probe_took_no_digest(tmp_path):
    run = _run(tmp_path, {0: "fresh0"}, {0: {r: f"saved{r}" for r in range(4)}})
    v, detail = _check(run)[f"resize_rng@{N4}"]
    assert v == "unknown" and "rank 1 after the load" in detail


def test_the_judge_makes_the_check_only_where_a_relaunch_resumes_at_another_world_size():
    spec = next(c for c in REFERENCE if c.name == "resize_rng")
    s = load(SHRINK)
    assert spec.applies(s)
    assert not spec.applies(dataclasses.replace(s, recovery=dataclasses.replace(s.recovery, world_size=None)))
    assert not spec.applies(dataclasses.replace(s, expect=dataclasses.replace(s.expect, resume_from=None)))


# ---- the planted trainer, on the catalogue's resize scenario (make test: the one that catches it) ------

@pytest.mark.slow  # in make test: the one run that catches this planted trainer (tests/test_planted_matrix.py)
def test_rank_r_restoring_saved_rank_r_mod_old_world_s_rng_is_caught(tmp_path, golden_root):
    """4 ranks shrink to 2: rank r % 4 is rank r, so each rank goes on with its own saved stream, where the
    reference declares a fresh one (reseed); the loss stays inside the resize tolerance."""
    from ckpt_chaos.run.runner import run_scenario
    from tests.helpers import golden_of_the_reference

    s = dataclasses.replace(load(builtin_scenarios() / "process" / "kill-node-resume-on-two-of-four.toml"),
                            trainer_module="tests.planted.rng_of_rank_modulo_old_world")
    golden_of_the_reference(s, golden_root)
    r = run_scenario(s, tmp_path, golden_root)
    assert r.verdict == "fail"
    bad = {c["name"]: c["detail"] for c in r.checks if c["verdict"] == "fail"}
    assert list(bad) == [f"resize_rng@{N4}"], bad  # the trajectory stays within tolerance: nothing else notices
    assert bad[f"resize_rng@{N4}"] == (
        f"launch 1 resumed from {N4}, saved by 4 rank(s), on 2: rank 0 went on with its own saved stream, not a "
        "fresh one; rank 1 went on with its own saved stream, not a fresh one (the trainer declares reseed: every "
        "rank goes on with a fresh stream of its own)"), bad


@pytest.mark.slow
@pytest.mark.nightly  # make test: the shrink above catches the same trainer
def test_on_a_grow_the_new_ranks_of_that_trainer_are_caught_going_on_with_copies(tmp_path, golden_root):
    from ckpt_chaos.run.runner import run_scenario
    from tests.helpers import golden_of_the_reference

    s = dataclasses.replace(load(builtin_scenarios() / "process" / "kill-all-resume-on-four-of-two.toml"),
                            trainer_module="tests.planted.rng_of_rank_modulo_old_world")
    golden_of_the_reference(s, golden_root)
    r = run_scenario(s, tmp_path, golden_root)
    bad = {c["name"]: c["detail"] for c in r.checks if c["verdict"] == "fail"}
    assert list(bad) == [f"resize_rng@{N4}"], bad
    # ranks 0 and 1 went on with their own saved streams (the reference reseeds them), the new ones with copies
    assert "rank 1 went on with its own saved stream, not a fresh one; new rank 2 went on with a copy of saved rank " \
           "0's stream, not a fresh one (and 1 more)" in bad[f"resize_rng@{N4}"], bad
