"""Any trainer, unmodified: the plain DDP example passes a kill in the middle of writing its
checkpoint, and copies of it with a bug planted are caught, with the broken part named."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ckpt_chaos.config import ENV_GOLDEN_TREE
from ckpt_chaos.run.runner import run_scenario
from ckpt_chaos.scenario import load
from tests.helpers import REPO

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "plain_ddp"
MID_WRITE = EXAMPLE / "scenarios" / "plain-ddp-kill-rank0-mid-file-write.toml"
DISK_FULL = EXAMPLE / "scenarios" / "plain-ddp-disk-full-during-save.toml"


@pytest.fixture(scope="module")
def golden_root(command_golden_root):
    return command_golden_root


def planted(*edits: tuple[str, str]) -> str:
    """The example trainer's code with ``edits`` (old, new) made: a bug planted in it."""
    text = (EXAMPLE / "train.py").read_text()
    for old, new in edits:
        assert text.count(old) == 1, f"the example no longer has {old!r}: update the planted bug"
        text = text.replace(old, new)
    return text


def plant(tmp_path: Path, *edits: tuple[str, str]) -> Path:
    """A copy of the example trainer with a bug planted, beside the repository's: its own golden run."""
    copy = tmp_path / "train.py"
    copy.write_text(planted(*edits))
    return copy


def run_against_the_example(tmp_path: Path, golden_root: Path, monkeypatch, *edits: tuple[str, str],
                            scenario: Path = MID_WRITE):
    """The mid-write scenario (or ``scenario``) on the example with a bug planted in its resume only, judged against the
    unmodified example's golden run, as mutation testing judges a mutant (``$CKPT_CHAOS_GOLDEN_TREE``):
    the planted copy takes the example's place in a copy of its folder, and the golden run the session
    made from the repository (``plain_ddp_mid_write``, a fixture of each caller) is the oracle. A bug
    confined to the resume leaves the fault-free run as it was, so this is the golden run the copy
    would make (twice, for determinism): one made per session instead of two per test."""
    from ckpt_chaos.run.command import golden_run

    golden_run(load(scenario), golden_root)  # from the repository, once per session (another scenario's key)
    project = tmp_path / "project"
    copy = project / "examples" / "plain_ddp" / "train.py"
    copy.parent.mkdir(parents=True)
    copy.write_text(planted(*edits))
    monkeypatch.chdir(project)
    monkeypatch.setenv(ENV_GOLDEN_TREE, str(REPO))
    return run_scenario(load(scenario), tmp_path / "out", golden_root)


def run(tmp_path: Path, golden_root: Path, trainer: Path | None = None):
    s = load(MID_WRITE)
    if trainer is not None:
        argv = [str(trainer) if a == "examples/plain_ddp/train.py" else a for a in s.command.argv]
        s = dataclasses.replace(s, command=dataclasses.replace(s.command, argv=argv, key=[str(trainer)]))
    return run_scenario(s, tmp_path / "out", golden_root)


def checks(result) -> dict[str, tuple[str, str]]:
    return {c["name"]: (c["verdict"], c["detail"]) for c in result.checks}


def test_the_unmodified_example_survives_a_kill_half_way_through_its_checkpoint(plain_ddp_mid_write):
    row = plain_ddp_mid_write.row  # the session's run of MID_WRITE (tests/conftest.py)
    assert row["verdict"] == "pass", row["reason"]
    c = {c["name"]: (c["verdict"], c["detail"]) for c in row["checks"]}
    assert c["resumed_newest@1"] == ("pass", "it loaded checkpoints/step_00000004.pt, the newest complete checkpoint "
                                             "(its torch.load)")
    assert c["trajectory"] == ("pass", "12 steps identical to the golden run, bit for bit, and the state the job "
                                       "ended with")
    assert c["lost_work@1"][0] == "pass"


def test_a_save_straight_to_the_final_name_is_caught_loading_a_torn_file(tmp_path, golden_root):
    # its own golden run: the bug changes what the fault-free run writes too (no temporary name)
    trainer = plant(tmp_path, ('    tmp = path.with_name(path.name + ".tmp")\n', "    tmp = path\n"),
                    ("    os.replace(tmp, path)\n", ""))
    r = run(tmp_path, golden_root, trainer)
    assert r.verdict == "fail"
    c = checks(r)
    verdict, detail = c["no_torn_read@1"]
    assert verdict == "fail"
    assert detail.startswith("it resumed from checkpoints/step_00000008.pt (its torch.load), which launch 0 "
                             "left torn or incomplete: checkpoints/step_00000008.pt: 11575 of 23149 bytes written "
                             "(the golden run's size), never completed"), detail
    assert c["job_completed"][0] == "fail"  # torch.load cannot read the torn file


@pytest.mark.nightly  # make test: the reference's rng_not_saved names the RNG
def test_a_resume_that_does_not_restore_the_rng_is_caught_and_named(tmp_path, golden_root, monkeypatch,
                                                                    plain_ddp_mid_write):
    r = run_against_the_example(tmp_path, golden_root, monkeypatch,
                                ('        torch.set_rng_state(state["rng"][rank])\n', ""))
    assert r.verdict == "fail"
    verdict, detail = checks(r)["trajectory"]
    assert verdict == "fail", r.checks
    assert detail.startswith("trajectory diverges at step 5 (loss_hex"), r.checks
    assert "it is the first step after resuming from checkpoints/step_00000004.pt (launch 1)" in detail, detail
    assert "the torch RNG state it resumed with differs from the golden run's at step 5 (model, optimizer" in detail


@pytest.mark.nightly  # make test: the reference's loader_not_restored names the loader
def test_a_data_loader_that_restarts_the_epoch_is_caught_and_named(tmp_path, golden_root, monkeypatch,
                                                                    plain_ddp_mid_write):
    r = run_against_the_example(tmp_path, golden_root, monkeypatch,
                                ('state["epoch"], state["batch_in_epoch"]', 'state["epoch"], 0'))
    assert r.verdict == "fail"
    verdict, detail = checks(r)["trajectory"]
    assert verdict == "fail", r.checks
    assert "trajectory diverges at step 5" in detail, r.checks
    assert ("the job trained on different samples than the golden run: its batch is the golden run's step 1, so "
            "the data loader resumed 4 step(s) too early and 4 step(s) of samples are seen twice") in detail


@pytest.mark.nightly  # make test: the save-straight test judges a command trainer's resume
def test_a_resume_that_does_not_restore_the_step_counter_is_caught_and_named(tmp_path, golden_root, monkeypatch,
                                                                             plain_ddp_mid_write):
    # the optimizer, schedule, data position and RNG come back; the loop's own counter starts again
    r = run_against_the_example(
        tmp_path, golden_root, monkeypatch,
        ('        step, epoch, skip = state["step"], state["epoch"], state["batch_in_epoch"]\n',
         '        step, epoch, skip = 0, state["epoch"], state["batch_in_epoch"]\n'))
    assert r.verdict == "fail"
    verdict, detail = checks(r)["trajectory"]
    assert verdict == "fail", r.checks
    assert detail.startswith("steps 13..16 were trained, past the golden run's last step 12"), detail
    assert "its step counter was not restored" in detail, detail


def test_a_save_that_swallows_its_write_error_is_caught_although_no_relaunch_came(tmp_path, golden_root, monkeypatch):
    # torch.save's ENOSPC ignored: the empty temporary file is fsynced and renamed over the name the loop
    # resumes from, training goes on, and retention deletes the last whole checkpoint. The job ends with
    # exit status 0 and the trajectory of the golden run, so only what it left, and the stop and relaunch
    # the scenario promises, show the bug
    r = run_against_the_example(tmp_path, golden_root, monkeypatch,
                                ("    torch.save(state, tmp)\n",
                                 "    try:\n        torch.save(state, tmp)\n    except OSError:\n        pass\n"),
                                scenario=DISK_FULL)
    assert r.verdict == "fail"
    c = checks(r)
    assert c["job_completed"][0] == "pass" and c["trajectory"][0] == "pass", r.checks
    verdict, detail = c["committed_valid"]
    assert verdict == "fail", r.checks
    assert detail.startswith("the job ended (launch 0, exit status 0) counting checkpoints/step_00000008.pt, "
                             "checkpoints/step_00000012.pt complete (command.complete), but "
                             "checkpoints/step_00000008.pt: "), detail
    assert detail.endswith("a relaunch would resume from a torn checkpoint; no whole checkpoint is left"), detail
    assert c["fault_0_job_failed"] == ("fail", "launch 0 exited with status 0, where the scenario expects it to "
                                               "fail (expect.job_fails)"), r.checks
    verdict, detail = c["resume_from"]
    assert verdict == "fail" and "no relaunch came" in detail, r.checks


@pytest.mark.nightly
def test_a_fault_that_never_fires_because_the_trainer_died_first_names_the_trainers_error(tmp_path, golden_root):
    # dies in the faulted run only: the golden run, under golden_root, must finish
    golden = str(golden_root)
    trainer = plant(tmp_path, ("            step += 1\n",
                               "            step += 1\n"
                               f"            if step == 6 and not str(args.ckpt_dir).startswith({golden!r}):\n"
                               "                raise ValueError(f'planted: rank {rank} gives up at step {step}')\n"))
    r = run(tmp_path, golden_root, trainer)
    assert r.verdict == "fail"
    verdict, detail = checks(r)["fault_0_fired"]
    assert verdict == "unknown"
    assert "never fired" in detail and "launch 0 ended first, with exit status 1" in detail, detail
    assert "(ValueError: planted: rank " in detail and "gives up at step 6)" in detail, detail


# Nightly: the retry of a natively crashed run is held in make test by the reference trainer's
# (test_harness_planted_bugs); this is the [command] trainer's golden run's own retry loop.
@pytest.mark.nightly
def test_a_golden_run_that_crashes_natively_once_is_run_again_and_one_that_always_does_is_an_error(
        tmp_path, golden_root, capfd):
    from ckpt_chaos.run import command
    from ckpt_chaos.scenario import ScenarioError

    # rank 1 aborts at exit as gloo now and then does, the first time only (a file remembers)
    once = tmp_path / "crashed-once"
    end = '    dist.destroy_process_group()\n'
    trainer = plant(tmp_path, (end, end + f'    if rank == 1 and not os.path.exists({str(once)!r}):\n'
                                          f'        open({str(once)!r}, "w").close()\n'
                                          '        os.abort()\n'))
    s = load(MID_WRITE)
    argv = [str(trainer) if a == "examples/plain_ddp/train.py" else a for a in s.command.argv]
    s = dataclasses.replace(s, command=dataclasses.replace(s.command, argv=argv, key=[str(trainer)]))
    golden = command.golden_run(s, tmp_path / "golden")
    assert (golden / "golden.json").is_file() and once.exists()
    assert "crashed natively (SIGABRT in a rank), running it once more" in capfd.readouterr().err

    plant(tmp_path, (end, end + '    if rank == 1:\n        os.abort()\n'))  # the same file, now always
    with pytest.raises(ScenarioError, match="the trainer's fault-free run failed"):
        command.golden_run(s, tmp_path / "golden")
