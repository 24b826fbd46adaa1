"""Helpers for tests that run the real trainer under torchrun."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from ckpt_chaos.check.history import final_state, trainer_events, trajectory
from ckpt_chaos.env.launcher import run_to_end
from ckpt_chaos.run.runner import trainer_args as as_flags

# Small enough for a 2-core machine, big enough to cross epochs (96 samples = 6 steps per epoch)
# and to accumulate gradients (2 micro-batches per step).
BASE = {"max_steps": 12, "ckpt_every_steps": 4, "dataset_size": 96, "global_batch": 16, "grad_accum": 2}
# The checkout the tests run from: the CLI and pytest run there, as a developer would run them.
REPO = Path(__file__).resolve().parents[1]
EXACT_KEYS = ("loss_hex", "grad_norm_hex", "lr_hex", "batch_digest", "tokens_seen", "state_digest")


def trainer_args(run_dir: Path, **overrides) -> list[str]:
    return as_flags({**BASE, "run_dir": str(run_dir), **overrides})


def train(run_dir: Path, nproc: int = 2, module: str = "reference_trainer", timeout: float = 240,
          **overrides) -> int:
    return run_to_end(run_dir, nproc, trainer_args(run_dir, **overrides), module=module, timeout=timeout)


def mismatches(golden: Path, run: Path) -> list[tuple[int, str]]:
    """(step, field) pairs where the run's trajectory differs bit for bit from the golden one."""
    a, b = trajectory(golden), trajectory(run)
    assert sorted(a) == sorted(b), f"steps differ: golden {sorted(a)}, run {sorted(b)}"
    return [(s, k) for s in sorted(a) for k in EXACT_KEYS if a[s].get(k) != b[s].get(k)]


def log_tail(run_dir: Path, n: int = 40) -> str:
    path = Path(run_dir) / "torchrun.log"
    return "\n".join(path.read_text().splitlines()[-n:]) if path.exists() else "(no log)"


def _ctrl_c_as_in_a_terminal() -> None:
    # A job started in the background by a shell without job control (CI often is) inherits SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler: the CLI under test is meant to be
    # the foreground program a user presses Ctrl-C in.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


TOKEN = "CKPT_CHAOS_TEST_TOKEN"  # in the environment of a CLI under test, so of everything it starts


def start_cli(tmp_path: Path, scenario: str, reports: Path | None = None,
              golden: Path | None = None) -> subprocess.Popen:
    """``ckpt-chaos run SCENARIO`` as a child process (to interrupt or SIGKILL it), output piped; every
    process it starts inherits ``TOKEN=str(tmp_path)`` (``processes_started_by``). ``golden``: the
    golden-run cache (the session's ``golden_root``, to share its runs; default: one of its own)."""
    return subprocess.Popen([sys.executable, "-m", "ckpt_chaos.cli", "run", scenario, "--reports",
                             str(reports or tmp_path / "r"), "--golden-dir", str(golden or tmp_path / "golden")],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, TOKEN: str(tmp_path)}, preexec_fn=_ctrl_c_as_in_a_terminal)


def processes_started_by(tmp_path: Path) -> list:
    """Live processes that carry the token of ``start_cli(tmp_path, ...)``: the CLI, its launchers and
    their ranks, whatever their command line (a rank forked by the launcher agent shows the agent's)."""
    import psutil

    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(TOKEN) == str(tmp_path) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


# Planted trainers whose fault-free run is the reference trainer's, line for line: their patches replace
# only code a fault-free run never reaches, so the golden run they would make is the reference's (the same
# trajectory, digests and final state; two golden runs of the reference differ as much in times, pids and
# DCP's pickled bytes). Measured on the configurations their tests run (tests/planted_selection.py's
# golden_differs over coverage-measured golden runs of the reference, as the nightly matrix decides it).
GOLDEN_OF_THE_REFERENCE = frozenset({
    # the resume: what it compares, validates, loads, keeps aside or restores (a fresh start finds nothing)
    "accepts_any_config", "refuses_any_config_change", "refuses_only_lr", "deletes_rejected",
    "ignores_manifest_step", "load_error_rejects_checkpoint", "loader_not_restored", "old_format_unchecked",
    "reads_only_its_own_format", "restore_needs_remote", "restore_tries_newest_only", "rng_of_rank_modulo_old_world",
    # the uploader and the remote tier, which the golden run leaves out
    "drain_ignores_grace", "drain_without_respawn", "gives_up_an_upload_early", "remote_delete_keeps_data",
    "retries_without_waiting", "staging_needs_hard_links", "upload_progress_in_percent",
    "uploader_keeps_stale_staging", "uploader_trusts_its_puts", "uploader_marks_durable_early",
    # the emergency save after SIGTERM, which no fault-free run receives
    "emergency_save_mid_step_only", "exits_0_after_a_failed_emergency_save", "ignores_sigterm",
})


def golden_of_the_reference(s, golden_root: Path) -> None:
    """Where ``s`` trains a planted trainer of ``GOLDEN_OF_THE_REFERENCE``, give it the reference's golden run
    of its configuration (made once per session, shared by every test on that configuration) instead of a
    golden run of its own; otherwise nothing."""
    from filelock import FileLock

    from ckpt_chaos.run.runner import golden_key, golden_run

    if s.trainer_module.removeprefix("tests.planted.") not in GOLDEN_OF_THE_REFERENCE:
        return
    reference = golden_run("reference_trainer", s.trainer, s.world_size, golden_root)
    mine = Path(golden_root) / golden_key(s.trainer_module, s.trainer, s.world_size)
    with FileLock(f"{mine}.lock"):  # golden_run's own lock for that key
        if not mine.exists():
            mine.symlink_to(reference.name)
