"""The planted-bug matrix: every planted trainer (``tests/planted/``) and the one scenario that catches
it in ``make test``; nightly (``make test-full``) each runs against the scenarios of the default suite
that run a trainer module, to show which of them catch it.

Nightly, a planted trainer runs only where it can differ from the reference: on the scenarios whose
coverage-measured run of the reference reaches a function it replaces (``tests/planted_selection.py``),
and on every scenario that does not pass on the reference. Elsewhere it would run exactly as the
reference does; ``matrix.json`` lists those scenarios as not run, with the reason. Likewise its golden
run is the reference's where the reference's measured golden run reaches no function it replaces. The
coverage of both is made by ``python -m tests.planted_selection DIR`` (make test-full's first step) and
found through ``$CKPT_CHAOS_MATRIX_COVERAGE``; without it the first worker makes it, and the others wait.

``make test`` runs each planted trainer once, against the scenario named here, in the test named here
(which asserts the diagnosis); the unit tests below hold that table to the tests and the catalogue
without launching anything, so a planted trainer without a test that catches it fails ``make test``.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import warnings
from pathlib import Path

import pytest

from ckpt_chaos.config import builtin_scenarios
from ckpt_chaos.scenario import load
from tests import planted_selection as selection
from tests.helpers import REPO

PLANTED = REPO / "tests" / "planted"

# planted trainer -> (the scenario that catches it, or None where a test drives the trainer itself;
#                     the make-test test that runs it there)
CATCHES: dict[str, tuple[str | None, str]] = {
    "accepts_any_config": ("process/relaunch-with-changed-lr-is-refused.toml",
                           "test_harness_planted_bugs.py::test_a_resume_that_accepts_a_changed_learning_rate_is_caught"),
    "async_commit_not_uploaded": ("remote/async-saves-then-disk-lost.toml",
                                  "test_harness_planted_bugs.py::test_async_checkpoints_never_handed_to_the_uploader_are_caught"),
    "async_stage_time_lost": ("process/kill-async-save-mid-write.toml",
                              "test_harness_planted_bugs.py::test_an_async_save_whose_copy_went_untimed_is_caught"),
    "async_write_error_ignored": ("storage/errno-in-async-save-then-shard-cut-on-load.toml",
                                  "test_harness_planted_bugs.py::test_an_async_save_committed_although_its_write_failed_is_caught"),
    "best_in_memory": ("process/retention-milestones-and-best-across-a-crash.toml",
                       "test_harness_planted_bugs.py::test_retention_that_forgets_the_best_checkpoint_on_a_relaunch_is_caught"),
    "ckpt_dir_per_restart": ("slurm/slurm-kill-rank1-mid-shard-write.toml",
                             "test_slurm_scenarios.py::test_a_checkpoint_folder_keyed_on_the_restart_count_is_caught_resuming_from_scratch"),
    "commit_hashes_files_on_disk": ("storage/stray-bytes-in-a-shard-before-its-commit.toml",
                                    "test_harness_planted_bugs.py::test_a_commit_that_hashes_its_files_as_they_are_on_disk_is_caught"),
    # not a checkpoint bug: a trainer that crashes natively, for the harness's retry of such a run
    "crashes_natively": ("process/kill-rank1-mid-shard-write.toml",
                         "test_harness_planted_bugs.py::test_a_native_crash_where_no_fault_fired_or_a_segfault_is_run_again_once_and_said"),
    "deletes_previous_before_commit": ("process/kill-rank1-mid-shard-write.toml",
                                       "test_harness_planted_bugs.py::test_previous_deleted_before_commit_is_caught_and_named"),
    "deletes_rejected": ("storage/corrupt-bitflip-in-shard.toml",
                         "test_harness_planted_bugs.py::test_a_checkpoint_rejected_on_load_and_deleted_instead_of_kept_aside_is_caught"),
    "drain_ignores_grace": ("remote/remote-unreachable-across-preemption.toml",
                            "test_harness_planted_bugs.py::test_a_drain_after_sigterm_that_ignores_the_grace_period_is_caught"),
    "drain_without_respawn": ("remote/uploader-killed-during-final-drain.toml",
                              "test_harness_planted_bugs.py::test_a_drain_that_never_replaces_a_dead_uploader_is_caught"),
    "emergency_save_mid_step_only": ("process/preempt-on-the-last-micro-batch-of-a-step.toml",
                                     "test_harness_planted_bugs.py::test_an_emergency_save_skipped_at_a_step_boundary_is_caught"),
    "exits_0_after_a_failed_emergency_save": ("process/preempt-on-a-full-disk-stops-with-the-error.toml",
                                              "test_harness_planted_bugs.py::test_a_failed_emergency_save_swallowed_into_a_clean_exit_is_caught"),
    "fresh_start_keeps_failed_load": ("storage/flip-in-the-only-checkpoint-as-its-load-begins.toml",
                                      "test_harness_planted_bugs.py::test_a_fresh_start_on_the_tensors_of_a_failed_load_is_caught"),
    "gives_up_an_upload_early": ("remote/upload-reset-mid-manifest.toml",
                                 "test_harness_planted_bugs.py::test_an_uploader_that_gives_up_an_attempt_early_is_caught"),
    "grads_left_out_of_digests": ("process/preempt-before-first-optimizer-step.toml",
                                  "test_harness_planted_bugs.py::test_digests_that_leave_out_a_mid_step_checkpoints_gradients_are_caught"),
    "ignores_manifest_step": ("storage/corrupt-manifests-then-eio-on-load.toml",
                              "test_harness_planted_bugs.py::test_a_resume_that_ignores_the_step_a_manifest_records_is_caught"),
    "ignores_sigterm": ("slurm/slurm-preempt-mid-shard-write-grace-honoured.toml",
                        "test_slurm_scenarios.py::test_a_trainer_that_ignores_sigterm_wastes_the_grace_period_and_is_caught"),
    "keeps_one_fewer": ("process/kill-rank1-mid-shard-write.toml",
                        "test_harness_planted_bugs.py::test_retention_that_keeps_one_fewer_than_keep_last_is_caught"),
    "latest_before_durable": ("process/kill-after-manifest-before-rename.toml",
                              "test_harness_planted_bugs.py::test_latest_moved_before_durable_is_caught_and_named"),
    "load_error_rejects_checkpoint": ("storage/corrupt-manifests-then-eio-on-load.toml",
                                      "test_harness_planted_bugs.py::test_a_load_that_takes_an_io_error_for_a_corrupt_checkpoint_is_caught"),
    "loader_drops_ranks": ("process/kill-node-resume-on-two-of-four.toml",
                           "test_harness_planted_bugs.py::test_loader_state_of_dropped_ranks_discarded_is_caught_and_named"),
    "loader_not_restored": ("process/kill-node-mid-training.toml",
                            "test_harness_planted_bugs.py::test_loader_position_not_restored_is_caught_and_named"),
    "loader_trusts_newest": ("storage/corrupt-bitflip-in-shard.toml",
                             "test_storage_faults.py::test_loader_trusting_the_newest_directory_is_caught"),
    "makes_room_on_full_disk": ("storage/retention-best-on-full-disk.toml",
                                "test_harness_planted_bugs.py::test_making_room_on_a_full_disk_by_deleting_the_best_checkpoint_is_caught"),
    "old_format_unchecked": ("process/relaunch-after-a-manifest-format-upgrade.toml",
                             "test_harness_planted_bugs.py::test_an_upgrade_that_loads_an_older_format_unchecked_is_caught"),
    "optimizer_not_restored": (None, "test_trainer_resume.py::test_bit_exact_check_catches_planted_bug"),
    "progress_of_tensors_only": ("process/kill-rank1-mid-shard-write.toml",
                                 "test_harness_planted_bugs.py::test_shard_progress_reported_ahead_of_the_file_is_caught_where_the_kill_landed"),
    "progress_planned_too_large": ("process/kill-rank1-mid-shard-write.toml",
                                   "test_harness_planted_bugs.py::test_shard_progress_reported_late_is_caught_where_the_kill_landed"),
    "reads_only_its_own_format": ("process/relaunch-after-a-manifest-format-upgrade.toml",
                                  "test_harness_planted_bugs.py::test_an_upgrade_that_reads_only_its_own_manifest_format_is_caught"),
    "refuses_any_config_change": ("process/relaunch-with-changed-cadence-resumes.toml",
                                  "test_harness_planted_bugs.py::test_a_resume_that_refuses_a_change_of_cadence_is_caught"),
    "refuses_only_lr": ("process/relaunch-with-changed-seed-is-refused.toml",
                        "test_harness_planted_bugs.py::test_a_resume_that_refuses_only_a_changed_learning_rate_is_caught"),
    "refuses_restored_copy": ("remote/local-rot-then-durable-copy-restored.toml",
                              "test_harness_planted_bugs.py::test_a_resume_that_refuses_the_remote_copy_of_a_checkpoint_found_corrupt_is_caught"),
    "remote_delete_keeps_data": ("remote/upload-reset-mid-manifest.toml",
                                 "test_harness_planted_bugs.py::test_remote_retention_that_leaves_data_objects_behind_is_caught"),
    "rename_without_fsync": ("storage/power-loss-after-latest.toml",
                             "test_storage_faults.py::test_rename_without_fsync_is_caught_by_power_loss"),
    "restore_needs_remote": ("remote/remote-unreachable-across-restart.toml",
                             "test_harness_planted_bugs.py::test_a_restore_that_an_unreachable_remote_tier_stops_is_caught"),
    "restore_tries_newest_only": ("remote/remote-download-cut-then-older-restored.toml",
                                  "test_harness_planted_bugs.py::test_a_restore_that_gives_up_after_one_failed_download_is_caught"),
    "restore_trusts_download": ("remote/remote-bit-rot-then-disk-lost.toml",
                                "test_harness_planted_bugs.py::test_a_restore_that_trusts_what_it_downloaded_is_caught"),
    "retries_without_waiting": ("remote/upload-reset-mid-manifest.toml",
                                "test_harness_planted_bugs.py::test_an_uploader_that_retries_without_its_backoff_is_caught"),
    "rng_of_rank_modulo_old_world": ("process/kill-node-resume-on-two-of-four.toml",
                                     "test_resize_rng.py::test_rank_r_restoring_saved_rank_r_mod_old_world_s_rng_is_caught"),
    "rng_not_restored": (None, "test_trainer_resume.py::test_bit_exact_check_catches_planted_bug"),
    "rng_not_saved": ("process/kill-rank1-mid-shard-write.toml",
                      "test_harness_planted_bugs.py::test_rng_not_saved_is_caught_and_named"),
    "save_swallows_enospc": ("storage/errno-enospc-mid-shard-write.toml",
                             "test_storage_faults.py::test_save_swallowing_enospc_is_caught"),
    "staging_needs_hard_links": ("remote/upload-read-eio-on-a-staged-copy.toml",
                                 "test_harness_planted_bugs.py::test_an_uploader_that_stages_by_hard_links_only_is_caught"),
    "stall_in_milliseconds": ("process/kill-rank1-mid-shard-write.toml",
                              "test_harness_planted_bugs.py::test_a_stall_reported_in_milliseconds_is_caught"),
    "time_cadence_in_milliseconds": ("process/time-cadence-killed-twice.toml",
                                     "test_harness_planted_bugs.py::test_a_time_cadence_that_saves_at_every_step_is_caught"),
    "time_cadence_lost_on_resume": ("process/time-cadence-killed-twice.toml",
                                    "test_harness_planted_bugs.py::test_a_time_cadence_lost_on_resume_is_caught_by_a_second_crash"),
    "upload_progress_in_percent": ("remote/uploader-killed-mid-object.toml",
                                   "test_harness_planted_bugs.py::test_an_uploader_that_reports_its_progress_in_percent_is_caught"),
    "uploader_keeps_stale_staging": ("remote/uploader-killed-mid-object.toml",
                                     "test_harness_planted_bugs.py::test_an_uploader_staging_that_nobody_sweeps_is_caught"),
    "uploader_marks_durable_early": ("remote/uploader-killed-mid-object.toml",
                                     "test_remote_tier.py::test_an_uploader_that_marks_durable_before_its_objects_is_caught"),
    "uploader_trusts_its_puts": ("remote/shard-truncated-before-upload.toml",
                                 "test_harness_planted_bugs.py::test_an_uploader_that_trusts_its_puts_is_caught"),
    "validates_sizes_only": ("storage/corrupt-four-newest-four-ways.toml",
                             "test_harness_planted_bugs.py::test_a_resume_that_checks_sizes_but_not_checksums_is_caught"),
}


def _functions(test_file: Path) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(test_file.read_text())
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _marks(fn: ast.FunctionDef) -> set[str]:
    return {ast.unparse(d).split("(")[0].removeprefix("pytest.mark.") for d in fn.decorator_list}


def test_every_planted_trainer_has_the_one_scenario_that_catches_it_in_make_test():
    planted = sorted(p.stem for p in PLANTED.glob("*.py") if p.stem != "__init__")
    assert sorted(CATCHES) == planted, ("a planted trainer without its row in CATCHES (its scenario and the make-test "
                                        f"test that catches it), or a row without its trainer: "
                                        f"{sorted(set(CATCHES) ^ set(planted))}")
    for module, (scenario, test) in CATCHES.items():
        file, name = test.split("::")
        functions = _functions(REPO / "tests" / file)
        assert name in functions, f"{module}: no test {test}"
        source = ast.unparse(functions[name])
        assert f"tests.planted.{module}" in source or module in (REPO / "tests" / file).read_text(), (module, test)
        assert "nightly" not in _marks(functions[name]), f"{test} catches {module}: it must run in make test"
        if scenario is not None:
            assert (builtin_scenarios() / scenario).is_file(), f"{module}: no scenario {scenario}"
            assert Path(scenario).name in source, f"{test} does not run {scenario}"


# ---- nightly: each planted trainer against the default suite ------------------------------------------

_module_scenarios = selection.module_scenarios


MATRIX = sorted(m for m, (scenario, _) in CATCHES.items() if scenario is not None and m != "crashes_natively")
COVERAGE_ENV = "CKPT_CHAOS_MATRIX_COVERAGE"  # a folder `python -m tests.planted_selection DIR` made


@pytest.fixture(scope="session")
def matrix_coverage(tmp_path_factory) -> dict:
    """Which lines of the reference trainer each of the matrix's scenarios reaches, and each of their golden
    runs, measured on this tree (``planted_selection.prepare``): in the folder ``$CKPT_CHAOS_MATRIX_COVERAGE``
    names (make test-full makes it first, with the scenarios side by side), else made here by the first
    worker that asks (minutes), under a lock, one scenario at a time, and shared with the others."""
    from filelock import FileLock

    scenarios = _module_scenarios()
    files = [str(s.source) for s in scenarios]
    root, note = None, None
    if given := os.environ.get(COVERAGE_ENV):
        why = selection.usable((Path(given) / "reports" / "custom" / "latest").resolve(), files)
        if why is None and not set(selection.golden_configs(scenarios)) <= selection.measured_goldens(
                Path(given) / "goldens"):
            why = f"{Path(given) / 'goldens'} lacks a measured golden run of the reference"
        if why is None:
            root, note = Path(given), f"reused ${COVERAGE_ENV}"
        else:
            note = f"${COVERAGE_ENV} not used: {why}"
            warnings.warn(note)
    if root is None:
        base = tmp_path_factory.getbasetemp()
        uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
        root = base.parent / f"matrix-coverage-{uid}" if uid else base / "matrix-coverage"
        root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(root / ".lock")):
            selection.prepare(root, jobs="1")
    suite = (root / "reports" / "custom" / "latest").resolve()
    return {"dir": str(suite), "base": selection.baseline(suite), "note": note, "goldens": root / "goldens",
            "golden_reach": selection.golden_reach(root / "goldens")}


def _golden_for(module: str, patches: selection.Patches, s, golden_root: Path, coverage: dict) -> str:
    """Put the reference's golden run of ``s`` under the planted trainer's key where the planted trainer's
    own would be the same run (``selection.golden_differs``); which one the scenario is checked against."""
    from ckpt_chaos.run.runner import golden_key

    ref = golden_key("reference_trainer", s.trainer, s.world_size)
    why = selection.golden_differs(patches, coverage["golden_reach"], ref)
    if why is not None:
        return f"its own: {why}"
    from filelock import FileLock

    mine = golden_key(f"tests.planted.{module}", s.trainer, s.world_size)
    with FileLock(str(golden_root / f"{mine}.lock")):  # golden_run's: another test may be making it
        if not (golden_root / mine).exists():
            (golden_root / mine).symlink_to(coverage["goldens"] / "runs" / ref)
    return "the reference's: its golden run reaches no function the module replaces"


@pytest.mark.nightly
@pytest.mark.slow
# past the suite's 600 s: a module may run on all 38 scenarios (up to 20 min on 4 workers), and without
# $CKPT_CHAOS_MATRIX_COVERAGE the first to ask makes the coverage run, one scenario at a time
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("module", MATRIX)
def test_each_planted_trainer_against_the_default_suite(module, tmp_path, golden_root, matrix_coverage):
    """Every scenario it runs on gives a verdict (the harness does not break on a buggy trainer), the one
    that catches it in make test is among them and fails when it is in the suite, and which ones catch it
    is kept beside the run (``matrix.json``) for the catalogue's maintainers, with those not run and why."""
    from ckpt_chaos.run.runner import run_scenario

    scenarios = _module_scenarios()
    patches = selection.patches(module)
    chosen = selection.selection(patches, matrix_coverage["base"], [s.name for s in scenarios])
    catcher = load(builtin_scenarios() / CATCHES[module][0]).name
    if catcher in chosen:
        assert chosen[catcher] is None, (f"the selection leaves out {catcher}, which catches {module} in make test "
                                         f"({chosen[catcher]}): the coverage ({matrix_coverage['dir']}) or the "
                                         "resolver of its patches is wrong")
    verdicts, not_run, goldens = {}, {}, {}
    for s in scenarios:
        if chosen[s.name] is not None:
            not_run[s.name] = chosen[s.name]
            continue
        goldens[s.name] = _golden_for(module, patches, s, golden_root, matrix_coverage)
        r = run_scenario(dataclasses.replace(s, trainer_module=f"tests.planted.{module}"), tmp_path / "runs",
                         golden_root)
        verdicts[s.name] = r.verdict
    (tmp_path / "matrix.json").write_text(json.dumps({
        "module": module, "verdicts": verdicts, "not_run": not_run, "golden": goldens,
        "replaces": {t: [f, min(lines), max(lines)] for t, (f, lines) in patches.functions.items()},
        "everywhere": patches.fallback, "coverage": matrix_coverage["dir"], "coverage_note": matrix_coverage["note"],
    }, indent=1))
    assert set(verdicts.values()) <= {"pass", "fail", "xfail", "xpass", "skipped"}, verdicts
    if catcher in verdicts:
        assert verdicts[catcher] == "fail", f"{catcher} no longer catches {module}: {verdicts}"


# ---- the selection: what each planted module replaces (no process launched) --------------------------

# Planted modules whose patches do not all resolve to functions of the measured trainer: they run on every
# scenario. Each reason says what the resolver cannot follow.
EVERYWHERE = {
    "rename_without_fsync": "rebinds ck.FileSystemWriter, which no function reads at call time (ProbedWriter "
                            "subclassed it at import): a rebinding with no reader is not trusted",
    "save_swallows_enospc": "patches torch's dcp.save, which the coverage does not measure",
}


@pytest.fixture(scope="module")
def resolved() -> dict[str, selection.Patches]:
    return {m: selection.patches(m) for m in MATRIX}


def test_every_planted_module_s_patches_resolve_to_reference_functions_or_it_runs_everywhere(resolved):
    everywhere = {m for m, p in resolved.items() if p.everywhere}
    assert everywhere == set(EVERYWHERE), (
        "planted modules that run on every scenario, and those listed so in EVERYWHERE, differ: "
        f"{ {m: resolved[m].fallback for m in everywhere - set(EVERYWHERE)} } {sorted(set(EVERYWHERE) - everywhere)}")
    for m, p in resolved.items():
        assert p.everywhere or p.functions, m
        for file, lines in p.functions.values():
            assert file in selection.measured_files() and lines, (m, file)


def _body(file: str, qualname: str) -> set[int]:
    tree = ast.parse((REPO / file).read_text())
    *classes, name = qualname.split(".")
    scope = tree.body
    for c in classes:
        scope = next(n for n in scope if isinstance(n, ast.ClassDef) and n.name == c).body
    fn = next(n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name)
    return set(range(fn.body[0].lineno, fn.end_lineno + 1))


def test_the_resolver_finds_the_body_of_the_function_a_planted_module_replaces(resolved):
    keeps = resolved["keeps_one_fewer"]
    assert not keeps.everywhere
    assert keeps.functions == {"ck.CheckpointManager.apply_retention": (
        "reference_trainer/checkpoint.py", frozenset(_body("reference_trainer/checkpoint.py",
                                                           "CheckpointManager.apply_retention")))}
    # a function imported into two modules under its own name: the original is state's
    grads = resolved["grads_left_out_of_digests"].functions
    assert {f for f, _ in grads.values()} == {"reference_trainer/state.py"}
    assert set(grads["train.component_digests"][1]) == _body("reference_trainer/state.py", "component_digests")
    # a property replaced: its getter; a constant rebound: the functions that read it (the uploader's spawn)
    ckpt_dir = resolved["ckpt_dir_per_restart"].functions["TrainConfig.checkpoint_dir"]
    assert set(ckpt_dir[1]) == _body("reference_trainer/config.py", "TrainConfig.checkpoint_dir")
    spawn = [v for k, v in resolved["uploader_trusts_its_puts"].functions.items() if "UPLOADER_MODULE" in k]
    assert spawn == [("reference_trainer/remote.py",
                      frozenset(_body("reference_trainer/remote.py", "UploadQueue._spawn")))]


def test_an_object_the_module_makes_acts_where_it_is_installed_and_only_the_module_s_readers_count(resolved):
    # remote.time = SimpleNamespace(...); remote.time.sleep = ...: the namespace's insides are no patch;
    # remote.time's readers are remote.py's functions, not the probe's own `time.time()`
    retries = resolved["retries_without_waiting"]
    assert not retries.everywhere and {f for f, _ in retries.functions.values()} == {"reference_trainer/remote.py"}
    assert any("reads reference_trainer.remote.time" in k for k in retries.functions)
    # shim = SimpleNamespace(...); shim.validate = ...; remote.ck = shim: the readers of remote.ck
    shim = resolved["restore_trusts_download"]
    assert not shim.everywhere and any("reads reference_trainer.remote.ck" in k for k in shim.functions)
    tree = ast.parse("import time\nfrom reference_trainer import remote as r\n"
                     "def a(): return time.time()\ndef b(x): return x.time\ndef c(): return r.time\n")
    ours, others = selection._module_aliases(tree, "reference_trainer.remote")
    fns = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    reads = {name: selection._reads(fn, "time", False, ours, others) for name, fn in fns.items()}
    assert reads == {"a": False, "b": True, "c": True}


def test_a_patch_the_resolver_cannot_follow_sends_the_module_to_every_scenario(tmp_path, monkeypatch):
    base = {"walls": {"a": 1.0, "b": 2.0}, "reached": {"reference_trainer/checkpoint.py": {}}}
    keeps = selection.patches("keeps_one_fewer")
    assert set(selection.selection(keeps, base, ["a", "b"]).values()) != {None}  # reaches nothing: not run
    planted = tmp_path / "planted"
    planted.mkdir()
    for name, line in {"torch_too": "import torch\ntorch.manual_seed = lambda s: None",
                       "constant": "from reference_trainer import checkpoint as ck\nck.CheckpointManager.keep = 1",
                       "at_import": "import os\nos.environ.pop('X', None)",
                       "computed": "from reference_trainer import checkpoint as ck\nsetattr(ck, NAME, None)"}.items():
        (planted / f"{name}.py").write_text(
            "from reference_trainer import checkpoint as ck\n"
            "ck.CheckpointManager.apply_retention = lambda self: None\n" + line + "\n")
    monkeypatch.setattr(selection, "PLANTED", planted)
    for name in ("torch_too", "constant", "at_import", "computed"):
        p = selection.patches(name)
        assert p.everywhere, name
        assert "ck.CheckpointManager.apply_retention" in p.functions, name
        assert set(selection.selection(p, base, ["a", "b"]).values()) == {None}, name


def test_a_scenario_that_reaches_a_replaced_line_or_does_not_pass_on_the_reference_is_run():
    keeps = selection.patches("keeps_one_fewer")
    file, lines = keeps.functions["ck.CheckpointManager.apply_retention"]
    inside = str(sorted(lines)[len(lines) // 2])
    base = {"walls": {"reaches": 1.0, "misses": 1.0},
            "reached": {file: {inside: ["reaches"], str(min(lines) - 1): ["misses"]}}}
    chosen = selection.selection(keeps, base, ["reaches", "misses", "failed on the reference"])
    assert chosen["reaches"] is None and chosen["failed on the reference"] is None
    assert chosen["misses"] == "never reaches ck.CheckpointManager.apply_retention; same run as the reference"


def test_a_planted_trainer_takes_the_reference_s_golden_run_only_where_that_run_misses_its_patches():
    keeps = selection.patches("keeps_one_fewer")
    file, lines = keeps.functions["ck.CheckpointManager.apply_retention"]
    inside, outside = str(sorted(lines)[1]), str(min(lines) - 1)
    reach = {file: {inside: {"saves-and-prunes"}, outside: {"saves-and-prunes", "never-prunes"}}}
    assert selection.golden_differs(keeps, reach, "never-prunes") is None
    assert "reaches ck.CheckpointManager.apply_retention" in selection.golden_differs(keeps, reach, "saves-and-prunes")
    assert "no measured golden run" in selection.golden_differs(keeps, reach, "not-measured")
    assert "do not all resolve" in selection.golden_differs(selection.patches("save_swallows_enospc"), reach,
                                                            "never-prunes")
