"""Flakiness hunting built into ``ckpt-chaos run``: ``--repeat N`` compares each scenario's runs and
fails one whose verdict or failing checks differ; ``--load`` keeps the machine busy with stress-ng
for as long as the scenarios run, and stops it with them."""

from __future__ import annotations

import json
import os
import shutil
import time

import psutil
import pytest

from ckpt_chaos.run import load as background
from ckpt_chaos.run.repeat import differences, merged
from ckpt_chaos.subcommands.common import EXIT_CANNOT_RUN
from tests.test_cli import cli
from tests.test_pytest_plugin import QUICK


def check(name: str, verdict: str, detail: str = "") -> dict:
    return {"name": name, "check": name.split("@")[0], "fault": None, "at": None, "verdict": verdict,
            "detail": detail or f"{name} {verdict}"}


def row(verdict: str, *checks: dict, run_dir: str = "") -> dict:
    return {"scenario": "s", "verdict": verdict, "reason": "", "checks": list(checks), "run_dir": run_dir}


def test_runs_that_agree_are_one_row_and_the_last_runs():
    runs = [row("fail", check("fault_0_fired", "pass"), check("lost_work@1", "fail", f"lost {n} steps"),
                run_dir=f"/r{n}") for n in (5, 6)]
    out = merged(runs)
    assert differences(runs) == []  # a detail may differ (a time, a count): the outcome is the same
    assert out["verdict"] == "fail" and out["run_dir"] == "/r6" and not any(c["name"] == "flaky" for c in out["checks"])
    assert out["runs"] == [{"verdict": "fail", "run_dir": "/r5"}, {"verdict": "fail", "run_dir": "/r6"}]


def test_a_scenario_whose_runs_disagree_fails_as_flaky_naming_what_differed():
    quiet = row("pass", check("fault_0_fired", "pass"), check("trajectory", "pass"))
    loaded = row("fail", check("fault_0_fired", "pass"), check("trajectory", "pass"),
                 check("fault_2_fired", "unknown", "stop all never fired: fault 2 (kill) ended launch 0"))
    out = merged([quiet, loaded, quiet])
    assert out["verdict"] == "fail"
    flaky = out["checks"][0]
    assert flaky["name"] == "flaky" and flaky["verdict"] == "fail"
    assert "3 runs disagree" in flaky["detail"]
    assert "verdict pass (run 1), fail (run 2), pass (run 3)" in flaky["detail"]
    assert ("fault_2_fired: run 1: absent; run 2: unknown (stop all never fired: fault 2 (kill) ended launch 0); "
            "run 3: absent") in flaky["detail"]
    assert out["reason"].startswith("flaky: ")
    # the same verdict, another check failing: flaky too
    a = row("fail", check("trajectory", "fail"))
    b = row("fail", check("lost_work@1", "fail"))
    assert [d.split(":")[0] for d in differences([a, b])] == ["lost_work@1", "trajectory"]


@pytest.mark.skipif(shutil.which("stress-ng") is None, reason="stress-ng is not installed (make setup installs it)")
def test_the_load_busies_the_machine_and_is_gone_when_the_block_ends(tmp_path):
    with background.Load("both", tmp_path, cores=1) as load:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            workers = psutil.Process(load.proc.pid).children(recursive=True)
            if len(workers) >= 2:  # a CPU hog and a disk writer
                break
            time.sleep(0.1)
        assert len(workers) >= 2 and load.running
        session = os.getsid(load.proc.pid)
    assert not load.running
    left = [p for p in psutil.process_iter(["name"]) if _session(p) == session]
    assert left == [], left
    assert list(tmp_path.iterdir()) == []  # its files went with it


def _session(p: psutil.Process) -> int | None:
    try:
        return os.getsid(p.pid)
    except (ProcessLookupError, PermissionError):
        return None


def test_load_without_stress_ng_runs_nothing_and_says_why(tmp_path):
    (tmp_path / "quick.toml").write_text(QUICK.format(module="reference_trainer", known=""))
    bare = tmp_path / "bin"
    bare.mkdir()
    out = cli("run", str(tmp_path / "quick.toml"), "--load", "cpu", "--out", str(tmp_path / "out"), cwd=tmp_path,
              PATH=str(bare))
    assert out.returncode == EXIT_CANNOT_RUN, out.stderr
    assert "--load cpu: SKIPPED, nothing run: stress-ng is not installed (Debian package stress-ng" in out.stderr
    assert not (tmp_path / "out").exists()


def test_repeat_and_load_need_a_count_and_a_known_kind(tmp_path):
    for args, said in ((["--repeat", "0"], "argument --repeat: '0': give a whole number of 1 or more"),
                       (["--load", "disk"], "argument --load: invalid choice: 'disk'")):
        out = cli("run", "x", *args, cwd=tmp_path)
        assert out.returncode == 2 and said in out.stderr, out.stderr


# Nightly: two runs of a scenario beside a CPU hog on every core (a minute and more on two cores, which
# slows every test beside it). make test holds the comparison, the load and its refusal above.
@pytest.mark.nightly
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("stress-ng") is None, reason="stress-ng is not installed (make setup installs it)")
def test_run_repeat_twice_under_load_compares_the_runs_and_stops_the_load(tmp_path, golden_root):
    (tmp_path / "quick.toml").write_text(QUICK.format(module="reference_trainer", known=""))
    before = {p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "stress-ng"}
    out = cli("run", str(tmp_path / "quick.toml"), "--repeat", "2", "--load", "cpu", "--json", "--reports",
              str(tmp_path / "r"), "--golden-dir", str(golden_root), cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    said = " ".join(out.stderr.split())  # as the console wrapped it
    assert "background load (cpu): stress-ng --quiet" in said
    assert "run 1 of 2" in said and "run 2 of 2" in said
    assert "--repeat 2: 1 of 1 scenario(s) had the same verdict and failing checks on every run" in said
    data = json.loads(out.stdout)
    (result,) = data["results"]
    assert [r["verdict"] for r in result["runs"]] == ["pass", "pass"]
    first, last = (r["run_dir"] for r in result["runs"])
    assert first.endswith("/repeat/run-1/quick") and last == result["run_dir"] and last.endswith("/quick")
    assert os.path.isfile(os.path.join(first, "history.jsonl")) and os.path.isfile(os.path.join(last, "history.jsonl"))
    after = {p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "stress-ng"}
    assert after <= before  # the load went with the run
