"""``run --coverage``: coverage.py follows every process of the job, the killed ones included, and
the suite's report links an HTML coverage report of the trainer."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ckpt_chaos.check.history import FaultFired, of, read_history
from ckpt_chaos.config import builtin_scenarios
from ckpt_chaos.report import trainer_coverage
from ckpt_chaos.run.runner import run_scenario
from ckpt_chaos.scenario import load
from tests.helpers import REPO

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(trainer_coverage.missing() is not None, reason="needs the 'coverage' extra")]


@pytest.mark.nightly  # make test: the other coverage test
def test_a_rank_killed_by_the_nemesis_keeps_the_lines_it_ran(tmp_path, monkeypatch, golden_root):
    s = load(builtin_scenarios() / "process" / "kill-rank1-mid-shard-write.toml")
    folder = tmp_path / "coverage"
    monkeypatch.delenv(trainer_coverage.ENV, raising=False)
    trainer_coverage.start(folder, trainer_coverage.default_sources([s]))
    try:
        # the session's golden run: a golden run is never measured (trainer_coverage.measuring wraps the chaos run)
        r = run_scenario(s, tmp_path / "runs", golden_root)
    finally:
        monkeypatch.delenv(trainer_coverage.ENV, raising=False)
    assert r.verdict == "pass", r.reason
    killed = next(pid for h in of(read_history(r.run_dir), FaultFired) for pid in h.pids)
    data = [p.name for p in folder.glob(".coverage.*")]
    # coverage.py names a process's data file .coverage.HOST.pidPID.RANDOM...
    assert any(f".pid{killed}." in name for name in data), (killed, data)
    summary = trainer_coverage.report(folder)
    cp = summary["checkpoint_path"]
    assert 0 < cp["line_percent"] < 100 and cp["branches"] > 0
    assert "reference_trainer/checkpoint.py" in summary["missing"]  # one scenario leaves lines unreached
    measured = json.loads((folder / "coverage.json").read_text())["files"]
    ckpt = next(f for path, f in measured.items() if path.endswith("reference_trainer/checkpoint.py"))
    assert {c for names in ckpt["contexts"].values() for c in names} == {s.name}
    assert (folder / "index.html").is_file()


@pytest.mark.nightly
def test_run_coverage_links_the_html_report_and_prints_the_checkpoint_path(tmp_path):
    out = subprocess.run([sys.executable, "-m", "ckpt_chaos.cli", "run", "--suite", "full", "--coverage",
                          "-k", "kill-before-retention", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "checkpoint path: lines" in out.stdout + out.stderr
    latest = tmp_path / "reports" / "full" / "latest"
    assert 'href="coverage/index.html"' in (latest / "index.html").read_text()
    assert (latest / "coverage" / "index.html").is_file()


def test_cov_source_without_coverage_is_refused(tmp_path):
    out = subprocess.run([sys.executable, "-m", "ckpt_chaos.cli", "run", "--suite", "full", "--cov-source", "x",
                          "-k", "kill-before-retention", "--out", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode != 0 and "--cov-source needs --coverage" in out.stderr


@pytest.mark.nightly
def test_coverage_follows_a_trainer_of_its_own(tmp_path):
    out = subprocess.run([sys.executable, "-m", "ckpt_chaos.cli", "run", "--suite", "full", "--coverage",
                          "--scenarios", str(REPO / "examples" / "plain_ddp" / "scenarios"),
                          "-k", "plain-ddp-kill-rank0-mid-file-write", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads((tmp_path / "reports" / "full" / "latest" / "coverage" / "summary.json").read_text())
    assert list(summary["files"]) == ["examples/plain_ddp/train.py"]
    assert summary["files"]["examples/plain_ddp/train.py"]["percent"] > 80  # its save and resume ran
    assert "examples/plain_ddp/train.py: lines" in out.stdout + out.stderr
