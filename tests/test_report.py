"""The HTML report: built from a real scenario run, with its plots, and rendered in a real browser.

The browser test needs Debian's ``chromium`` (``make setup`` installs it as root); without it the
test is skipped with the reason, never passed.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest

from ckpt_chaos import __version__
from ckpt_chaos.report import results
from ckpt_chaos.run.runner import Result
from tests.helpers import REPO

ARTEFACTS = REPO / "reports" / "artefacts"


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory, reference_mid_write):
    """A suite run directory holding one real chaos run (rank 1 killed mid-write: a copy of the session's,
    tests/conftest.py) and one skipped row."""
    out = tmp_path_factory.mktemp("suite")
    shutil.copytree(reference_mid_write.suite, out, symlinks=True, dirs_exist_ok=True)
    ran = dataclasses.replace(reference_mid_write.result, run_dir=str(out / reference_mid_write.scenario.name))
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
    assert ran.resumed_from == ["step_00000004"] and ran.save_stall_s > 0  # from the run's events, not its text
    assert "<td>step_00000004</td>" in text
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
    stored = json.loads((out / "results.json").read_text())
    assert stored["schema_version"] == results.SCHEMA_VERSION and stored["tool_version"] == __version__
    with (out / "results.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert [r["scenario"] for r in table] == ["kill-rank1-mid-shard-write", "needs-what-is-missing", "a-failed-one"]
    assert table[0]["resumed_from"] == "step_00000004" and table[1]["steps_lost"] == ""


def test_any_verdict_renders_and_a_known_failure_passes_the_suite(tmp_path):
    """xfail and xpass from expect.known_failure, and a verdict this version does not know (a newer
    checker's): each is shown; only xfail counts as passed."""
    def row(name, verdict, checks):
        return {"scenario": name, "verdict": verdict, "reason": f"why {name}", "families": ["process"],
                "kinds": ["kill"], "tags": [], "checks": checks, "launches": 2, "wall_s": 3.0, "run_dir": ""}

    rows = [row("documented-bug", "fail", [{"name": "no_hang", "verdict": "fail", "detail": "hung at exit"},
                                           {"name": "job_completed", "verdict": "fail", "detail": "did not finish"}]),
            row("bug-fixed", "pass", [{"name": "no_hang", "verdict": "pass", "detail": "ended in time"}]),
            row("odd", "unknown", [{"name": "remote_durable", "verdict": "n/a", "detail": "no remote tier"}])]
    rows[0] = results.apply_known_failure(rows[0], "no_hang", "a.toml")
    rows[1] = results.apply_known_failure(rows[1], "no_hang", "b.toml")
    assert rows[0]["verdict"] == "xfail" and rows[0]["reason"] == ("known failure: no_hang: hung at exit "
                                                                   "(also failing: job_completed)")
    assert rows[1]["verdict"] == "xpass" and "remove expect.known_failure from b.toml" in rows[1]["reason"]
    # an unknown the scenario allows (expect.may_be_unknown, carried on its row) fails nothing
    rows.append({**row("timing", "unknown", []), "may_be_unknown": "the uploader may skip step 8"})
    assert [results.failed(r) for r in rows] == [False, True, True, False]
    text = results.write(tmp_path, "mixed", rows, wall_s=9.0, plots=False).read_text()
    assert "2 of 4 scenarios FAILED" in text and ", 2 unknown, 1 xfail, 1 xpass" in text
    assert '<tr class="xfail"' in text and "<li class=\"n/a\">remote_durable: no remote tier</li>" in text
    junit = ET.parse(results.write_junit(tmp_path / "j" / "junit.xml", "mixed", rows, 9.0)).getroot()
    suite = junit.find("testsuite")
    # unknown apart from the failures: a JUnit error; allowed, a skip
    assert [suite.get(k) for k in ("tests", "failures", "errors", "skipped")] == ["4", "1", "1", "2"]
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["documented-bug"].find("skipped").get("type") == "pytest.xfail"
    assert cases["bug-fixed"].find("failure").get("message").startswith("[XPASS(strict)] known failure passed")
    assert "n/a   remote_durable: no remote tier" in cases["odd"].find("error").text
    assert cases["odd"].find("error").get("message") == "could not tell: why odd"
    assert "as the scenario allows (the uploader may skip step 8)" in cases["timing"].find("skipped").get("message")


@pytest.mark.slow
def test_report_rebuilds_from_stored_results(suite_run):
    out, html, _ = suite_run
    html.unlink()
    p = subprocess.run([sys.executable, "-m", "ckpt_chaos.cli", "report", str(out), "--no-plots"],
                       capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0, p.stderr
    assert html.is_file() and "kill-rank1-mid-shard-write" in html.read_text()
    bad = subprocess.run([sys.executable, "-m", "ckpt_chaos.cli", "report", str(out / "nowhere")],
                         capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2 and "holds no results.json" in bad.stderr


@pytest.mark.slow
@pytest.mark.skipif(results.chromium() is None, reason="no chromium here (make setup installs Debian's chromium as root)")
def test_the_report_renders_in_headless_chromium_without_script_errors(suite_run):
    out, html, _ = suite_run
    view = results.view_in_browser(html, screenshot=ARTEFACTS / "report.png")
    assert view.screenshot is not None and view.screenshot.stat().st_size > 10_000
    assert not view.script_errors, view.script_errors
    assert view.sections == 3 and view.rows == 3
    assert view.plots == 2 and view.broken_plots == 0  # both SVGs loaded
    assert view.problems(expected_plots=results.expected_plots(out)) == []
    assert 'id="filter"' in html.read_text()


@pytest.mark.slow
@pytest.mark.skipif(results.chromium() is None, reason="no chromium here (make setup installs Debian's chromium as root)")
def test_a_plot_that_does_not_load_is_reported_by_the_browser_check(suite_run, tmp_path):
    out, html, _ = suite_run
    broken = tmp_path / "suite"
    shutil.copytree(out, broken, symlinks=True)
    (broken / "kill-rank1-mid-shard-write" / "loss.svg").write_text("not an svg")
    p = subprocess.run([sys.executable, "-m", "ckpt_chaos.cli", "report", str(broken), "--no-plots", "--browser"],
                       capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 1 and "1 of 2 plots did not load" in p.stderr, p.stdout + p.stderr

def test_the_benchmark_report_shows_the_soak_against_the_model(tmp_path):
    """benchmarks/report.py over the committed figures: the soak's measured goodput beside the
    model's, the cadence advice for the measured costs, every plot inline (no training is run)."""
    if not (REPO / "benchmarks" / "results" / "soak_goodput.json").exists():
        pytest.fail("benchmarks/results/soak_goodput.json is missing: run `make bench` and commit its figures")
    p = subprocess.run([sys.executable, "benchmarks/report.py", "--out", str(tmp_path)], capture_output=True,
                       text=True, cwd=REPO)
    assert p.returncode == 0, p.stderr
    text = (tmp_path / "index.html").read_text()
    for heading in ("Goodput under failures: measured against the model", "Cadence for these costs",
                    "Why measured and predicted differ", "Monte Carlo 5-95 %"):
        assert heading in text
    if (REPO / "benchmarks" / "results" / "explore_planted.json").exists():
        assert "Fault-schedule search against planted bugs" in text and "tests.planted.rng_not_saved" in text
    assert text.count("<svg") >= 2 and "src=" not in text  # plots inline: the page is one file


def test_suite_runs_started_in_the_same_second_get_their_own_directories(tmp_path, monkeypatch):
    frozen = time.gmtime()
    monkeypatch.setattr(results.time, "gmtime", lambda *a: frozen)
    first = results.suite_dir(tmp_path, "custom")
    second = results.suite_dir(tmp_path, "custom")
    assert first != second and first.is_dir() and second.is_dir()
    assert second.name == first.name + "-2"
    assert (tmp_path / "custom" / "latest").resolve() == second.resolve()
