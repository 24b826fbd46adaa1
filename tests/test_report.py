"""The HTML report: built from a real scenario run, with its plots, and rendered in a real browser.

The browser test needs Debian's ``chromium`` (``make setup`` installs it as root); without it the
test is skipped with the reason, never passed.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys

import pytest

from harness import results
from harness.launcher import REPO_ROOT
from harness.runner import Result, run_scenario
from harness.scenario import load

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTEFACTS = REPO_ROOT / "reports" / "artefacts"


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory):
    """A suite run directory holding one real chaos run (rank 1 killed mid-write) and one skipped row."""
    out = tmp_path_factory.mktemp("suite")
    s = load(REPO_ROOT / "scenarios" / "process" / "kill-rank1-mid-shard-write.toml")
    ran = run_scenario(s, out, tmp_path_factory.mktemp("golden"))
    skipped = Result(scenario="needs-what-is-missing", verdict="skipped", families=["storage"], kinds=["disk_full"],
                     reason="cannot inject disk_full on fs=tmpfs: not root")
    failed = dataclasses.replace(ran, scenario="a-failed-one", verdict="fail", run_dir="",
                                 checks=[{"name": "trajectory", "verdict": "fail", "detail": "diverges at step 5"}])
    rows = [ran.to_dict(), skipped.to_dict(), failed.to_dict()]
    html = results.write(out, "test", rows, wall_s=12.0)
    return out, html, ran


@pytest.mark.slow
def test_the_report_shows_each_scenario_with_its_plots_and_diagnosis(suite_run):
    out, html, ran = suite_run
    text = html.read_text()
    assert ran.verdict == "pass"
    assert "1 of 3 scenarios FAILED" in text
    for name in ("kill-rank1-mid-shard-write", "needs-what-is-missing", "a-failed-one"):
        assert f'id="{name}"' in text
    assert "<b>trajectory</b>: diverges at step 5" in text
    assert "cannot inject disk_full on fs=tmpfs: not root" in text
    assert "ckpt-chaos run kill-rank1-mid-shard-write" in text
    for plot in ("loss.svg", "timeline.svg"):
        assert f'src="kill-rank1-mid-shard-write/{plot}"' in text
        svg = (out / "kill-rank1-mid-shard-write" / plot).read_text()
        assert "<svg" in svg
    timeline = (out / "kill-rank1-mid-shard-write" / "timeline.svg").read_text()
    assert "kill rank:1" in timeline  # the fault is marked where it fired
    assert "http://" not in re.sub(r'xmlns(:\w+)?="http://[^"]+"|"http://www\.w3\.org[^"]*"', "", text)


@pytest.mark.slow
def test_report_rebuilds_from_stored_results(suite_run):
    out, html, _ = suite_run
    html.unlink()
    p = subprocess.run([sys.executable, "-m", "harness.cli", "report", str(out), "--no-plots"],
                       capture_output=True, text=True, cwd=REPO_ROOT)
    assert p.returncode == 0, p.stderr
    assert html.is_file() and "kill-rank1-mid-shard-write" in html.read_text()
    bad = subprocess.run([sys.executable, "-m", "harness.cli", "report", str(out / "nowhere")],
                         capture_output=True, text=True, cwd=REPO_ROOT)
    assert bad.returncode == 2 and "holds no results.json" in bad.stderr


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium here (make setup installs Debian's chromium as root)")
def test_the_report_renders_in_headless_chromium_without_script_errors(suite_run):
    out, html, _ = suite_run
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTEFACTS / "report.png"
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
            "--window-size=1300,1800", "--virtual-time-budget=10000"]
    p = subprocess.run(base + [f"--screenshot={shot}", html.as_uri()], capture_output=True, text=True, timeout=120)
    assert shot.is_file() and shot.stat().st_size > 10_000, p.stderr[-2000:]
    dom = subprocess.run(base + ["--dump-dom", html.as_uri()], capture_output=True, text=True, timeout=120)
    errors = [line for line in dom.stderr.splitlines() if "CONSOLE" in line and "Uncaught" in line]
    assert not errors, errors
    assert dom.stdout.count('<section class="scenario"') == 3
    assert dom.stdout.count("<tr class=") == 3
    assert 'id="filter"' in dom.stdout
    assert 'data-plots="2"' in dom.stdout and 'data-broken-plots="0"' in dom.stdout  # both SVGs loaded
