"""``ckpt-chaos run --executor slurm``: scenarios as Slurm jobs, with a local run's verdicts, in catalogue
order, on a throwaway cluster or an existing one, and nothing left after Ctrl-C.

Real Slurm, no mocks (``make setup`` installs slurm-wlm and munge). The tests that run a cluster are
skipped, with the reason, only where ``ckpt_chaos.env.slurm.missing()`` says this machine cannot run
one; the bad-input tests run everywhere.

Cost: the fan-out test runs a mix of the default suite's process-only scenarios once (two that may
share a node, one kept alone, and the one on the slurm backend, run in the harness after the jobs):
every kind of placement the fan-out makes, not every scenario (the whole family took two and a half
minutes of a CI worker; ``benchmarks/slurm_fanout.py`` runs it whole). It compares each verdict with
the one the scenario declares (``pass``, or ``xfail`` for a known failure), which is what a local run
is held to in CI (``make chaos``), rather than with a second, local run of the same scenarios: that
would double the test's time. ``test_parallel`` already holds local parallel runs to the serial verdicts,
and the fan-out runs the same worker.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

import psutil
import pytest

from ckpt_chaos.config import builtin_scenarios
from ckpt_chaos.env import slurm
from ckpt_chaos.env.launcher import JOB_MARKER
from ckpt_chaos.env.slurm import SlurmCluster, SlurmConfig, leftovers, listening
from ckpt_chaos.run.fanout import SlurmTarget, harness_option, nested, request
from ckpt_chaos.run.parallel import weight
from ckpt_chaos.scenario import load
from tests.test_cli import cli

ROOT = Path(__file__).resolve().parents[1]
CATALOGUE = builtin_scenarios()
NO_SLURM = slurm.missing()
needs_slurm = pytest.mark.skipif(NO_SLURM is not None, reason=f"no Slurm cluster here: {NO_SLURM}")


def default_process_scenarios() -> list:
    """The default suite's scenarios of the process family alone, in catalogue order (by name)."""
    found = [load(p) for p in CATALOGUE.rglob("*.toml")]
    return sorted((s for s in found if "default" in s.suites and s.families == ["process"]), key=lambda s: s.name)


def placement_mix() -> list:
    """Of those, in catalogue order: the first two that may share a node, the first kept alone and
    the first on the slurm backend (nested: the harness runs it itself)."""
    every = default_process_scenarios()
    shared = [s for s in every if not weight(s).alone and not nested(s)][:2]
    alone = [s for s in every if weight(s).alone and not nested(s)][:1]
    inner = [s for s in every if nested(s)][:1]
    chosen = {s.name for s in shared + alone + inner}
    assert len(chosen) == 4, "the default suite lost a kind of process scenario the fan-out places"
    return [s for s in every if s.name in chosen]


def expected(s) -> str:
    return "xfail" if s.expect.known_failure else "pass"


@pytest.fixture(scope="module")
def golden(tmp_path_factory) -> Path:
    """One golden cache for the module: what a shared file system gives the jobs of a real cluster."""
    return tmp_path_factory.mktemp("golden")


def start(args: list[str], cwd: Path, tag: str) -> subprocess.Popen:
    """``ckpt-chaos ARGS`` in a process of its own, every process under it carrying ``tag``; SIGINT as at a
    terminal (a background process would inherit it ignored)."""
    env = {**os.environ, "CKPT_CHAOS_TEST_TAG": tag, "COLUMNS": "200",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, "-m", "ckpt_chaos.cli", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def tagged(tag: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("CKPT_CHAOS_TEST_TAG") == tag:
                found.append(p)
        except (psutil.Error, OSError):
            pass
    return found


def training(tag: str) -> set[str]:
    """The training jobs (launcher markers) that processes carrying ``tag`` belong to."""
    found = set()
    for p in tagged(tag):
        try:
            if JOB_MARKER in p.environ():
                found.add(p.environ()[JOB_MARKER])
        except (psutil.Error, OSError):
            pass
    return found


def conf_ports(conf: Path) -> list[int]:
    """Every port a generated slurm.conf names (slurmctld's and each node's)."""
    text = conf.read_text()
    return [int(p) for p in re.findall(r"(?:SlurmctldPort|Port)=(\d+)", text)]


def wait_for(what: str, ready, proc: subprocess.Popen | None = None, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"ckpt-chaos ended ({proc.returncode}) before {what}: {proc.communicate()}")
        if result := ready():
            return result
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def finish(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def interval(job: dict) -> tuple[datetime, datetime]:
    return datetime.fromisoformat(job["StartTime"]), datetime.fromisoformat(job["EndTime"])


# ---- what each scenario asks Slurm for (no cluster needed) -----------------------------------------

def test_a_scenario_that_must_run_alone_holds_every_node_of_the_throwaway_cluster():
    by_name = {s.name: s for s in default_process_scenarios()}
    assert len(by_name) >= 5, sorted(by_name)
    throwaway = SlurmTarget(nodes=2)
    # two 2-core nodes' worth of ranks on this 2-core host: 2 ranks take a node, 4 take both
    assert request(by_name["io-error-in-save-is-survived"], throwaway, cores=2) == ["--nodes=1"]
    assert request(by_name["kill-node-resume-on-two-of-four"], throwaway, cores=2) == ["--nodes=2"]
    for name in ("time-cadence-killed-twice", "unprobed-kill-when-shard-file-appears"):
        assert weight(by_name[name]).alone, name
        assert request(by_name[name], throwaway, cores=2) == ["--nodes=2"]
        assert request(by_name[name], SlurmTarget(nodes=5), cores=2) == ["--nodes=5"]
    # an existing cluster's nodes are hosts of their own: cores for the ranks, --exclusive to run alone
    real = SlurmTarget(conf=Path("/etc/slurm/slurm.conf"))
    assert request(by_name["kill-node-resume-on-two-of-four"], real) == ["--nodes=1", "--ntasks=1",
                                                                         "--cpus-per-task=2"]
    assert request(by_name["time-cadence-killed-twice"], real)[-1] == "--exclusive"
    assert "--exclusive" not in request(by_name["io-error-in-save-is-survived"], real)


def test_slurm_backend_scenarios_are_kept_out_of_the_jobs_and_harness_options_out_of_slurm_arg():
    s = load(CATALOGUE / "process" / "io-error-in-save-is-survived.toml")
    assert not nested(s)
    s.cluster.backend = "slurm"  # what [cluster] backend = "slurm" loads as
    assert nested(s)
    assert harness_option("--job-name=x") == "--job-name" and harness_option("-Jx") == "--job-name"
    assert harness_option("--output=/tmp/x") == "--output" and harness_option("--requeue") == "--requeue"
    assert harness_option("--partition=chaos") is None and harness_option("--time=30") is None
    assert harness_option("--exclusive") is None and harness_option("-A") is None


# ---- bad input: the option and the fix named, nothing run ----------------------------------------

def test_bad_slurm_options_name_the_option_and_the_fix(tmp_path):
    cases = [
        (["--executor", "slurm", "--slurm-conf", str(tmp_path / "nope.conf")], {},
         [f"--slurm-conf {tmp_path / 'nope.conf'}: no such file", "leave --slurm-conf out"]),
        (["--executor", "slurm"], {"SLURM_CONF": str(tmp_path / "gone.conf")},
         [f"SLURM_CONF {tmp_path / 'gone.conf'}: no such file", "SLURM_CONF unset"]),
        (["--slurm-nodes", "3"], {}, ["--slurm-nodes is for --executor slurm", "add --executor slurm"]),
        (["--executor", "slurm", "-n", "2"], {}, ["-n: with --executor slurm", "drop -n"]),
        (["--executor", "slurm", "--slurm-arg=--job-name=mine"], {}, ["--slurm-arg --job-name=mine", "drop it"]),
    ]
    for args, env, texts in cases:
        out = cli("run", "io-error-in-save-is-survived", "--reports", "r", *args, cwd=tmp_path, **env)
        assert out.returncode == 2, (args, out.stderr)
        for text in texts:
            assert text in out.stderr, (args, out.stderr)
        assert not (tmp_path / "r").exists(), "bad input must write nothing"
    out = cli("run", "--executor", "slurm", "--slurm-nodes", "0", cwd=tmp_path)
    assert out.returncode == 2 and "argument --slurm-nodes" in out.stderr and "1 or more" in out.stderr


def test_without_slurm_the_error_says_what_to_install(tmp_path):
    args = ["run", "io-error-in-save-is-survived", "--executor", "slurm", "--reports", "r"]
    if NO_SLURM is not None:  # this machine lacks it for real
        out = cli(*args, cwd=tmp_path)
        assert out.returncode == 3, out.stderr
        assert f"--executor slurm: {NO_SLURM}" in out.stderr
        return
    # Slurm is here: hide sbatch in a mount namespace of the command's own, as if it were not installed
    sbatch = slurm._which("sbatch")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=elsewhere\n")
    for extra, install in (([], "make setup"), (["--slurm-conf", str(conf)], "slurm-client")):
        hidden = subprocess.run(
            ["unshare", "-m", "sh", "-c", f'mount --bind /dev/null "{sbatch}" && exec "$@"', "sh", sys.executable,
             "-m", "ckpt_chaos.cli", *args, *extra], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert hidden.returncode == 3, hidden.stderr
        assert "--executor slurm: sbatch is not installed" in hidden.stderr and install in hidden.stderr, hidden.stderr
        assert not (tmp_path / "r").exists()


# ---- on a real cluster ---------------------------------------------------------------------------

# Nightly: make test fans scenarios out to an existing cluster (test_an_existing_cluster_...); placing
# timing-sensitive scenarios alone and nesting slurm-backend ones is what only this reaches.
@pytest.mark.nightly
@needs_slurm
@pytest.mark.slow
def test_scenarios_fanned_out_have_their_verdicts_in_catalogue_order(tmp_path, golden):
    chosen = placement_mix()
    names = [s.name for s in chosen]
    proc = start(["run", *names, "--executor", "slurm", "--slurm-nodes", "2", "--json", "--junitxml", "junit.xml",
                  "--reports", "r", "--golden-dir", str(golden)], tmp_path, uuid.uuid4().hex)
    harness = proc.pid
    stdout, stderr = finish(proc, 900)
    assert proc.returncode == 0, stderr[-4000:]
    here = [s.name for s in chosen if nested(s)]
    if here:
        assert f"{len(here)} scenario(s) on the slurm backend run here afterwards" in stderr
    data = json.loads(stdout)
    # the verdicts each scenario declares, in the order the scenarios were chosen, whatever order they ended in
    assert [(r["scenario"], r["verdict"]) for r in data["results"]] == [(s.name, expected(s)) for s in chosen]
    suite = tmp_path / data["out"]
    stored = json.loads((suite / "results.json").read_text())
    assert [r["scenario"] for r in stored["results"]] == names
    assert re.findall(r'<testcase[^>]* name="([^"]+)"', (tmp_path / "junit.xml").read_text()) == names
    assert all((suite / n / "result.json").is_file() for n in names)
    assert not (suite / ".workers").exists()

    jobs = {j["scenario"]: j for j in json.loads((suite / ".slurm" / "jobs.json").read_text())["jobs"]}
    assert sorted(jobs) == sorted(set(names) - set(here)), "a slurm-backend scenario must not be nested in a job"
    assert {j["JobState"] for j in jobs.values()} == {"COMPLETED"}, jobs
    last_end = max(interval(j)[1] for j in jobs.values()).timestamp()
    for name in here:  # run by the harness itself, after every job had ended
        assert (suite / name / "scenario.toml").stat().st_mtime >= last_end, name
    alone = [s.name for s in chosen if weight(s).alone and s.name in jobs]
    assert alone, "the process scenarios include timing-sensitive ones: they must be kept alone"
    for name in alone:
        assert jobs[name]["NumNodes"] == "2", jobs[name]  # every node of the cluster: nothing beside it
        a0, a1 = interval(jobs[name])
        beside = [o for o, j in jobs.items() if o != name and interval(j)[0] < a1 and a0 < interval(j)[1]]
        assert not beside, f"{beside} ran beside {name}"
    shared = [j for n, j in jobs.items() if j["NumNodes"] == "1"]
    assert any(a is not b and interval(a)[0] < interval(b)[1] and interval(b)[0] < interval(a)[1]
               for a in shared for b in shared), f"no two scenarios ran side by side: {jobs}"
    assert leftovers(owner=harness) == []
    assert listening(conf_ports(suite / ".slurm" / "slurm.conf")) == []


@needs_slurm
@pytest.mark.slow
def test_ctrl_c_cancels_the_jobs_and_stops_the_cluster_leaving_nothing(tmp_path, golden):
    tag = uuid.uuid4().hex
    proc = start(["run", "torchrun-restarts-after-kill", "io-error-in-save-is-survived", "--executor", "slurm",
                  "--reports", "r", "--golden-dir", str(golden)], tmp_path, tag)
    harness = proc.pid
    try:
        wait_for("both scenarios' training jobs", lambda: len(training(tag)) >= 2, proc)
        confs = list((tmp_path / "r").rglob(".slurm/slurm.conf"))
        assert len(confs) == 1
        ports = conf_ports(confs[0])
        assert listening(ports), "the throwaway cluster listens while it runs"
        before = [p.name() for p in tagged(tag)]
        assert {"slurmctld", "slurmd"} <= set(before), before
        proc.send_signal(signal.SIGINT)
        stdout, stderr = finish(proc, 240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (stdout + stderr)[-3000:]
    assert "interrupted: the Slurm jobs were cancelled and have ended, the throwaway cluster is stopped" in stdout
    assert leftovers(owner=harness) == []
    assert listening(ports) == []
    left = tagged(tag)
    assert not left, f"left behind: {[(p.pid, p.name()) for p in left]}"
    assert not [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(tmp_path) in line]
    suite = confs[0].parent.parent
    assert (suite / "results.json").is_file()
    jobs = json.loads((suite / ".slurm" / "jobs.json").read_text())["jobs"]
    assert len(jobs) == 2 and all(j["JobState"] in slurm.TERMINAL for j in jobs), jobs


@pytest.mark.nightly  # make test: the fan-out's Ctrl-C test
@needs_slurm
@pytest.mark.slow
def test_an_existing_cluster_is_only_submitted_to_and_a_lost_node_is_a_failed_row(tmp_path, golden):
    """The harness submits to a cluster it did not start (``--slurm-conf``), passes ``--slurm-arg`` on, never
    touches the daemons; a job killed with its node gives a failed row naming the node failure."""
    with SlurmCluster(tmp_path / "cluster", SlurmConfig(nodes=2)) as c:
        daemons = sorted((p.pid, p.name()) for p in c.processes())
        tag = uuid.uuid4().hex
        lost, kept = "torchrun-restarts-after-kill", "io-error-in-save-is-survived"
        proc = start(["run", lost, kept, "--executor", "slurm", "--slurm-conf", str(c.conf), "--slurm-arg=--time=20",
                      "--json", "--reports", "r", "--golden-dir", str(golden)], tmp_path, tag)
        try:
            def node_of_lost():
                out = c.run("squeue", "-h", "-o", "%i %T %N", check=False).stdout.split("\n")
                running = [line.split() for line in out if " RUNNING " in line]
                return len(running) == 2 and len(training(tag)) >= 2 and running

            running = wait_for("both jobs running with their training jobs", node_of_lost, proc)
            first = min(running, key=lambda r: int(r[0]))  # submitted first: the lost scenario's
            c.scontrol("update", f"nodename={first[2]}", "state=down", "reason=fanout-test")
            stdout, stderr = finish(proc, 300)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 1, stderr[-3000:]
        rows = {r["scenario"]: r for r in json.loads(stdout)["results"]}
        assert list(rows) == [lost, kept]
        assert rows[kept]["verdict"] == "pass", rows[kept]["reason"]
        assert rows[lost]["verdict"] == "fail"
        assert re.search(rf"its Slurm job {first[0]} ended NODE_FAIL.* without a result row", rows[lost]["reason"]), \
            rows[lost]["reason"]
        assert sorted((p.pid, p.name()) for p in c.processes() if p.name() in ("slurmctld", "slurmd")) == \
            [d for d in daemons if d[1] in ("slurmctld", "slurmd")], "the harness touched the cluster's daemons"
        suite = tmp_path / json.loads(stdout)["out"]
        assert not (suite / ".slurm" / "slurm.conf").exists(), "no cluster of its own"
        record = json.loads((suite / ".slurm" / "jobs.json").read_text())
        assert str(c.conf) in record["cluster"]
        assert {j["TimeLimit"] for j in record["jobs"]} == {"00:20:00"}, record  # --slurm-arg reached sbatch
