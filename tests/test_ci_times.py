"""``.ci/times.py``'s resumed runs: what ``NIGHTLY_RESUME=1 make nightly`` keeps of a night cut short."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / ".ci").mkdir(parents=True)
    shutil.copy(REPO / ".ci" / "times.py", root / ".ci" / "times.py")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    return root


def _times(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(root / ".ci" / "times.py"), *args], cwd=root, capture_output=True,
                          text=True)


def _phase(root: Path, label: str, ok: bool) -> int:
    """A phase that counts its runs in ``runs-LABEL`` and passes or fails as told."""
    cmd = f"echo x >> runs-{label}; exit {0 if ok else 3}"
    return _times(root, "phase", "night", label, "--no-summary", "--", "sh", "-c", cmd).returncode


def _runs(root: Path, label: str) -> int:
    f = root / f"runs-{label}"
    return len(f.read_text().split()) if f.exists() else 0


def test_a_resumed_run_keeps_the_phases_that_passed_and_runs_the_others_again(tmp_path):
    root = _repo(tmp_path)
    _times(root, "start", "night")
    assert _phase(root, "a", True) == 0
    assert _phase(root, "b", False) == 3  # cut short, or failed: both run again
    resumed = _times(root, "start", "night", "--resume")
    assert resumed.returncode == 0 and "kept, as passed: a" in resumed.stdout
    assert _phase(root, "a", True) == 0 and _phase(root, "b", True) == 0
    assert (_runs(root, "a"), _runs(root, "b")) == (1, 2)
    rec = json.loads((root / "reports" / "timings" / "night.json").read_text())
    assert [p["name"] for p in rec["phases"]] == ["a", "b"] and len(rec["resumed"]) == 1
    assert [(p["name"], p["exit_status"]) for p in rec["dropped"]] == [("b", 3)]
    summary = _times(root, "summary", "night", "--failures", "--finished")
    assert summary.returncode == 0 and "resumed" in summary.stdout
    # a finished run is not gone on with: the next --resume starts afresh and runs every phase
    fresh = _times(root, "start", "night", "--resume")
    assert fresh.returncode == 1 and "nothing to go on with (the run of" in fresh.stdout
    assert _phase(root, "a", True) == 0 and _runs(root, "a") == 2


def test_a_run_of_another_commit_or_of_a_changed_tree_is_not_gone_on_with(tmp_path):
    root = _repo(tmp_path)
    _times(root, "start", "night")
    assert _phase(root, "a", True) == 0
    (root / "f").write_text("two\n")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-qm", "two"], check=True)
    out = _times(root, "start", "night", "--resume").stdout
    assert "this tree is at" in out and "a fresh run" in out
    assert _phase(root, "a", True) == 0 and _runs(root, "a") == 2
    (root / "f").write_text("changed\n")
    out = _times(root, "start", "night", "--resume").stdout
    assert "has uncommitted changes" in out and "a fresh run" in out


def test_a_duration_rounds_before_it_splits_into_minutes():
    import importlib.util

    spec = importlib.util.spec_from_file_location("ci_times", REPO / ".ci" / "times.py")
    times = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(times)
    assert times.fmt(10679.96) == "178 min 0 s"  # the night at 32137cc printed "177 min 60 s"
    assert times.fmt(59.97) == "1 min 0 s"
    assert times.fmt(59.9) == "59.9 s"
    assert times.fmt(7101.9) == "118 min 22 s"
