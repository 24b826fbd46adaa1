"""`make mutation` (python -m ckpt_chaos.mutation): what counts, which scenarios a mutant meets, the pinned
golden key, run -x; and one real mutant killed by its scenario."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from ckpt_chaos import cli, mutation
from ckpt_chaos.mutation import scope, verdict
from ckpt_chaos.mutation.cache import fingerprint
from ckpt_chaos.mutation.driver import annotate, moved, unchanged_since, work_dir
from ckpt_chaos.mutation.equivalence import (annotation_spans, changed_lines, equivalent_reason, in_annotation,
                                             load_equivalent, text_change)
from ckpt_chaos.mutation.results import collect, figures, killer_first, killers, results_name, wilson, write_results
from ckpt_chaos.mutation.scope import (TARGETS, baseline, baseline_scenarios, deadlines, make_baseline, scope_lines,
                                       select, statement_line, target)
from ckpt_chaos.mutation.verdict import cosmic_ray_command, run_mutant
from ckpt_chaos.run import runner
from ckpt_chaos.run.runner import Result
from tests.test_pytest_plugin import QUICK

ROOT = Path(__file__).resolve().parents[1]

CKPT = "reference_trainer/checkpoint.py"


# ---- what counts ----------------------------------------------------------------------------------

def test_the_loop_is_mutated_only_where_it_resumes_saves_or_stops():
    source = (ROOT / "reference_trainer" / "train.py").read_text()
    lines = scope_lines("reference_trainer/train.py", source)
    text = source.split("\n")
    kept = {text[n - 1].strip() for n in lines}
    assert "self.resume()" in kept and "self.ckpt.poll()" in kept
    assert any(t.startswith("return self.save_and_exit(") for t in kept)
    assert not any(t.startswith("loss = self.micro_batch(") or t.startswith("dist.all_reduce(") for t in kept)
    assert scope_lines(CKPT, (ROOT / CKPT).read_text()) is None  # whole files


def test_a_continuation_line_is_recorded_on_its_statement_s_first_line():
    source = "x = (1 +\n     2)\nif x and\\\n   x:\n    y = 3\n"
    assert statement_line(source, 2) == 1
    assert statement_line(source, 4) == 3
    assert statement_line(source, 5) == 5


# ---- equivalent mutants ---------------------------------------------------------------------------

DIFF = ("--- a/reference_trainer/checkpoint.py\n+++ b/reference_trainer/checkpoint.py\n@@ -10,1 +10,1 @@\n"
        "-    for attempt in range(3):\n+    for attempt in range(4):")


def test_an_equivalent_mutant_is_matched_by_its_changed_line_and_operator(tmp_path):
    f = tmp_path / "eq.toml"
    f.write_text(f'[[equivalent]]\nfile = "{CKPT}"\noperator = "core/NumberReplacer"\n'
                 'original = "for attempt in range(3):"\nmutant = "  for attempt in range(4):"\n'
                 'reason = "any number of tries over one passes the same scenarios"\n')
    entries = load_equivalent(f)
    m = {"file": CKPT, "operator": "core/NumberReplacer", "line": 10, "diff": DIFF}
    assert equivalent_reason(entries, m).startswith("any number of tries")
    assert equivalent_reason(entries, {**m, "operator": "core/AddNot"}) is None
    assert equivalent_reason(entries, {**m, "diff": DIFF.replace("range(4)", "range(2)")}) is None
    spaced = DIFF.replace("range(4)", "range( 4)")  # as the mutating library writes some numbers
    assert equivalent_reason(entries, {**m, "diff": spaced}).startswith("any number of tries")


def test_a_mutant_of_an_annotation_that_is_never_evaluated_is_equivalent(tmp_path):
    source = ("from __future__ import annotations\n"
              "from dataclasses import dataclass\n"
              "@dataclass\n"
              "class C:\n"
              "    x: int | None = None\n"
              "def f(a: int | None, *rest: str) -> tuple[int, int] | None:\n"
              "    y: int | None = a\n"
              "    return a | 1\n")
    (tmp_path / "m.py").write_text(source)
    spans = annotation_spans(source)

    def mutant_at(line: int, text: str, nth: int = 0) -> dict:
        col = source.splitlines()[line - 1].replace("|", "#", nth).index(text)
        return {"file": "m.py", "start": [line, col], "end": [line, col + len(text)]}

    assert len(spans) == 4  # a, *rest, the return and y; not the dataclass field
    assert in_annotation(mutant_at(6, "|"), tmp_path)
    assert in_annotation(mutant_at(6, "|", 1), tmp_path)  # the return annotation's
    assert in_annotation(mutant_at(7, "|"), tmp_path)
    assert not in_annotation(mutant_at(5, "|"), tmp_path)  # a field's type is read, as a string
    assert not in_annotation(mutant_at(8, "|"), tmp_path)  # code
    assert annotation_spans(source.replace("from __future__ import annotations\n", "")) == []


@pytest.mark.parametrize("body, says", [
    (f'file = "{CKPT}"\noperator = "x"\noriginal = "a"\nmutant = "b"\n', "no 'reason'"),
    (f'file = "{CKPT}"\noperator = "x"\noriginal = "a"\nmutant = "b"\nreason = "r"\nwhy = 1\n', "unknown key 'why'"),
    ('file = "README.md"\noperator = "x"\noriginal = "a"\nmutant = "b"\nreason = "r"\n', "is not mutated"),
])
def test_a_bad_equivalent_entry_names_the_file_entry_and_key(tmp_path, body, says):
    f = tmp_path / "eq.toml"
    f.write_text("[[equivalent]]\n" + body)
    with pytest.raises(mutation.MutationError, match=f"eq.toml: \\[\\[equivalent\\]\\] #1: .*{says}"):
        load_equivalent(f)


def test_the_committed_equivalent_list_loads_and_each_entry_names_a_line_that_is_still_there():
    for e in load_equivalent():
        lines = [line.strip() for line in (ROOT / e["file"]).read_text().split("\n")]
        # a mutant that moves a statement (a swap) removes several lines: the original joins them
        runs = {" ".join(x for x in lines[i:i + n] if x) for n in (1, 2, 3) for i in range(len(lines))}
        assert e["original"].strip() in runs, f"stale entry: {e['file']} has no line(s) {e['original']!r}"
        if "line" in e:
            assert lines[e["line"] - 1] == e["original"].strip(), e


# ---- which scenarios a mutant meets ------------------------------------------------------------------

def _suite(tmp_path: Path) -> Path:
    suite = tmp_path / "suite"
    (suite / "coverage").mkdir(parents=True)
    rows = [{"scenario": "slow", "verdict": "pass", "wall_s": 40.0, "run_dir": str(suite / "slow")},
            {"scenario": "quick", "verdict": "pass", "wall_s": 5.0, "run_dir": str(suite / "quick")},
            {"scenario": "flaky", "verdict": "fail", "wall_s": 1.0, "run_dir": str(suite / "flaky")}]
    (suite / "results.json").write_text(json.dumps({"results": rows}))
    contexts = {"10": ["slow", "quick", "flaky"], "11": ["slow"], "12": ["flaky"]}
    (suite / "coverage" / "coverage.json").write_text(json.dumps({"files": {
        f"/somewhere/{CKPT}": {"contexts": contexts}, "/somewhere/reference_trainer/model.py": {"contexts": {}}}}))
    return suite


def test_a_mutant_meets_the_passing_scenarios_that_reach_its_line_cheapest_first(tmp_path):
    base = baseline(_suite(tmp_path))
    assert base["not_passing"] == ["flaky"]
    assert select(base, CKPT, [10]) == ["quick", "slow"]
    assert select(base, CKPT, [11, 10]) == ["quick", "slow"]
    assert select(base, CKPT, [12]) == []  # only a scenario that fails unmutated reaches it
    assert select(base, CKPT, [99]) == []  # not reached
    assert select(base, "reference_trainer/state.py", [10]) == []


def test_the_scenario_that_last_killed_a_change_runs_first_and_only_for_that_change(tmp_path):
    """The last results name the scenario that killed each change; a new run of the same change (its
    line moved by an edit above it) tries that one first, and still has to fail it to be killed."""
    import difflib

    pristine = "def f(fd):\n    x = 1\n    os.fsync(fd)\n    return x\n"
    mutated = pristine.replace("    os.fsync(fd)\n", "    try:\n        os.fsync(fd)\n    except Exception:\n        pass\n")
    diff = "\n".join(difflib.unified_diff(pristine.split("\n"), mutated.split("\n"), f"a/{CKPT}", f"b/{CKPT}", n=1,
                                          lineterm=""))
    results = tmp_path / "mutation-checkpoint.json"
    results.write_text(json.dumps({"mutants": [
        {"file": CKPT, "status": "killed", "scenario": "errno-eio-on-each-commit-fsync", "diff": diff},
        {"file": CKPT, "status": "survived", "diff": diff.replace("fsync", "flush")}]}))
    known = killers(results)
    change = text_change("# a line above\n" + pristine, "# a line above\n" + mutated)
    assert known == [[CKPT, *change, "errno-eio-on-each-commit-fsync"]]
    names = ["quick", "errno-eio-on-each-commit-fsync", "slow"]
    assert killer_first(names, known, CKPT, change) == ["errno-eio-on-each-commit-fsync", "quick", "slow"]
    assert killer_first(names, known, "reference_trainer/train.py", change) == names  # another file
    assert killer_first(names[::2], known, CKPT, change) == names[::2]  # it no longer reaches the line
    other = text_change(pristine, pristine.replace("x = 1", "x = 2"))
    assert killer_first(names, known, CKPT, other) == names
    assert killers(tmp_path / "none.json") == []


def test_coverage_without_contexts_or_results_is_refused_with_the_fix(tmp_path):
    suite = _suite(tmp_path)
    (suite / "coverage" / "coverage.json").write_text(json.dumps({"files": {f"/x/{CKPT}": {}}}))
    with pytest.raises(mutation.MutationError, match="contexts"):
        baseline(suite)
    (suite / "results.json").unlink()
    with pytest.raises(mutation.MutationError, match="no results.json"):
        baseline(suite)


# ---- an example's trainer under its own scenarios (--example) ------------------------------------------

EX = "examples/plain_ddp/train.py"
EX_SCENARIOS = "examples/plain_ddp/scenarios"


def test_an_example_is_mutated_whole_under_every_scenario_of_its_folder_in_files_of_its_own(tmp_path, monkeypatch, capsys):
    aim = target("plain_ddp")
    assert aim["targets"] == {EX: None} and aim["scenarios"] == EX_SCENARIOS
    assert scope_lines(EX, (ROOT / EX).read_text(), aim["targets"]) is None  # the whole file
    ref = target(None)
    assert ref["targets"] is TARGETS and ref["scenarios"] is None
    assert results_name("checkpoint", "plain_ddp") == "mutation-checkpoint-plain_ddp"
    assert results_name("core", "plain_ddp") == "mutation-core-plain_ddp"
    assert work_dir("core") == mutation.WORK  # the reference trainer's runs keep their folders
    assert work_dir("checkpoint") == ROOT / "build" / "mutation-checkpoint"
    assert work_dir("checkpoint", "plain_ddp") == ROOT / "build" / "mutation-checkpoint-plain_ddp"
    with pytest.raises(mutation.MutationError, match="--example nope: no examples/nope/train.py.*one of .*plain_ddp"):
        target("nope")
    assert "plain-ddp-term-rank1-only" in deadlines(EX_SCENARIOS)
    ran = []
    monkeypatch.setattr(scope.subprocess, "run", lambda cmd, **kw: ran.append(cmd))
    latest = make_baseline(tmp_path, tmp_path / "golden", EX_SCENARIOS)
    assert latest == tmp_path / "baseline" / "full" / "latest"
    cmd = ran.pop()
    assert cmd[cmd.index("--suite") + 1] == "full"  # every scenario of the folder, whatever its suites
    assert cmd[cmd.index("--scenarios") + 1] == str(ROOT / EX_SCENARIOS) and "--coverage" in cmd
    assert make_baseline(tmp_path, tmp_path / "golden") == tmp_path / "baseline" / "custom" / "latest"
    cmd = ran.pop()
    assert "--scenarios" not in cmd and "--suite" not in cmd
    # the reference trainer's baseline: the default suite and the scenarios aimed at one I/O call each
    named = set(baseline_scenarios())
    capsys.readouterr()
    assert cli.main(["list", "--json", "--builtin", "--suite", "default"]) == cli.EXIT_OK
    default = json.loads(capsys.readouterr().out)
    assert {s["name"] for s in default} < named and set(cmd) >= named
    assert {"errno-eio-on-each-commit-fsync", "remote-download-fsync-eio-then-older-restored"} <= named
    assert "hang-rank1-sigstop" not in named  # a full-only scenario is not in it


def _example_suite(tmp_path: Path, line: int) -> Path:
    """A baseline of the example's folder: two scenarios pass, its known failure shows (xfail), one fails."""
    suite = tmp_path / "suite"
    (suite / "coverage").mkdir(parents=True)
    rows = [{"scenario": "slow", "verdict": "pass", "wall_s": 40.0, "run_dir": str(suite / "slow")},
            {"scenario": "quick", "verdict": "pass", "wall_s": 5.0, "run_dir": str(suite / "quick")},
            {"scenario": "refused", "verdict": "xfail", "wall_s": 1.0, "run_dir": str(suite / "refused")},
            {"scenario": "broken", "verdict": "fail", "wall_s": 2.0, "run_dir": str(suite / "broken")}]
    (suite / "results.json").write_text(json.dumps({"results": rows}))
    (suite / "coverage" / "coverage.json").write_text(json.dumps({"files": {
        f"/somewhere/{EX}": {"contexts": {str(line): ["slow", "quick", "refused", "broken"], "99": ["refused"]}},
        f"/somewhere/{CKPT}": {"contexts": {"10": ["quick"]}}}}))
    return suite


def test_an_example_s_known_failure_never_meets_a_mutant_and_its_mutant_runs_from_its_folder(tmp_path, monkeypatch):
    source = (ROOT / EX).read_text()
    line = next(n for n, t in enumerate(source.split("\n"), 1) if t.strip() == "os.replace(tmp, path)")
    base = baseline(_example_suite(tmp_path, line), target("plain_ddp")["targets"])
    assert list(base["reached"]) == [EX] and base["not_passing"] == ["broken", "refused"]
    assert select(base, EX, [line]) == ["quick", "slow"]
    assert select(base, EX, [99]) == []  # only the xfail reaches it: not reached
    assert list(baseline(_example_suite(tmp_path / "ref", line))["reached"]) == [CKPT]
    tree = tmp_path / "tree"
    (tree / EX).parent.mkdir(parents=True)
    (tree / EX).write_text(source.replace("    os.replace(tmp, path)\n", "    pass\n"))
    launched = []

    class Launched:
        returncode = 0

        def __init__(self, cmd, **kw):
            launched.append((cmd, kw["env"]))

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(verdict.subprocess, "Popen", Launched)
    monkeypatch.chdir(tree)
    (tmp_path / "work").mkdir()
    state = {"pristine": str(ROOT), "work": str(tmp_path / "work"), "files": [EX], "golden": str(tmp_path / "golden"),
             "base": base, "deadlines": {}, "scenarios": str(ROOT / EX_SCENARIOS)}
    out = run_mutant(state)
    assert out["lines"] == [line] and out["planned"] == ["quick", "slow"]
    (cmd, env), = launched
    assert cmd[cmd.index("--scenarios") + 1] == str(ROOT / EX_SCENARIOS) and cmd[-2:] == ["quick", "slow"]
    assert env["CKPT_CHAOS_GOLDEN_TREE"] == str(ROOT)  # golden runs keyed by the pristine script
    assert out["status"] == "error"  # the stand-in harness wrote no results


def test_an_example_s_cached_verdicts_depend_on_its_trainer_and_scenarios_not_another_example_s(tmp_path):
    repo = tmp_path / "repo"
    for name in ("reference_trainer/checkpoint.py", "ckpt_chaos/check.py", EX, f"{EX_SCENARIOS}/a.toml",
                 "examples/other/train.py"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("x = 1\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    aim = target("plain_ddp")
    base = {"reached": {EX: {"5": ["quick"]}, CKPT: {"5": ["quick"]}}}

    def prints() -> tuple[str, str]:
        return (fingerprint(base, [EX], repo, aim["fingerprinted"]), fingerprint(base, [CKPT], repo))

    first = prints()
    (repo / "examples/other/train.py").write_text("x = 2\n")
    assert prints() == first
    (repo / EX_SCENARIOS / "a.toml").write_text("x = 2\n")  # a scenario of the example changed
    example, ref = prints()
    assert example != first[0] and ref == first[1]
    (repo / "ckpt_chaos/check.py").write_text("x = 2\n")  # the harness changed: both
    assert all(a != b for a, b in zip(prints(), (example, ref)))


def test_an_equivalent_entry_may_name_an_example_s_trainer(tmp_path):
    f = tmp_path / "eq.toml"
    f.write_text(f'[[equivalent]]\nfile = "{EX}"\noperator = "core/NumberReplacer"\noriginal = "a"\nmutant = "b"\n'
                 'reason = "r"\n')
    assert [e["file"] for e in load_equivalent(f)] == [EX]
    f.write_text(f.read_text().replace(EX, "examples/plain_ddp/scenarios/x.toml"))
    with pytest.raises(mutation.MutationError, match="is not mutated; one of .*examples/plain_ddp/train.py"):
        load_equivalent(f)


def test_an_example_s_results_get_a_file_and_a_table_of_their_own(tmp_path):
    sample = {"limit": 3, "seed": 0, "files": [EX], "named": None, "operators": "checkpoint", "to run": 1,
              "not reached": 0, "equivalent": 0, "not sampled": 5, "cached": 0, "example": "plain_ddp",
              "scenarios": EX_SCENARIOS}
    killed = {"file": EX, "line": 57, "operator": "checkpoint/DropDurabilityCall", "occurrence": 0,
              "diff": "-    os.replace(tmp, path)\n+    pass", "status": "killed", "scenario": "quick",
              "checks": ["latest_valid"], "wall_s": 9.0}
    path = write_results([killed], "python -m ckpt_chaos.mutation --example plain_ddp",
                                  {"sample": sample, "exec_wall_s": 9.0}, results=tmp_path)
    assert path == tmp_path / "mutation-checkpoint-plain_ddp.json"
    md = (tmp_path / "mutation-checkpoint-plain_ddp.md").read_text()
    assert "plain_ddp example's trainer" in md and f"`{EX}` (the whole file)" in md and f"`{EX_SCENARIOS}`" in md
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mutation-checkpoint-plain_ddp.json",
                                                          "mutation-checkpoint-plain_ddp.md"]


# ---- the pinned golden key ----------------------------------------------------------------------

def _copy(dest: Path) -> None:
    for part in ("reference_trainer", "ckpt_chaos/probe"):
        shutil.copytree(ROOT / part, dest / part, ignore=shutil.ignore_patterns("__pycache__"))


def test_a_pinned_golden_key_ignores_the_mutant_and_is_never_made_from_it(tmp_path, monkeypatch):
    pristine, mutant = tmp_path / "pristine", tmp_path / "mutant"
    _copy(pristine)
    _copy(mutant)
    (mutant / CKPT).write_text((mutant / CKPT).read_text() + "\n# a mutant\n")
    monkeypatch.delenv("CKPT_CHAOS_GOLDEN_TREE", raising=False)
    monkeypatch.chdir(pristine)
    key = runner.golden_key("reference_trainer", {}, 2)
    monkeypatch.chdir(mutant)
    assert runner.golden_key("reference_trainer", {}, 2) != key  # unpinned: the mutant's own code
    monkeypatch.setenv("CKPT_CHAOS_GOLDEN_TREE", str(pristine))
    assert runner.golden_key("reference_trainer", {}, 2) == key
    with pytest.raises(RuntimeError, match=f"not in .*golden.*pins golden runs to {pristine}"):
        runner.golden_run("reference_trainer", {}, 2, root=tmp_path / "golden")


def test_a_pinned_command_golden_key_reads_the_key_files_in_the_pinned_tree(tmp_path, monkeypatch):
    from ckpt_chaos.run import command
    from ckpt_chaos.scenario import load

    s = load(sorted((ROOT / "examples" / "plain_ddp" / "scenarios").glob("*.toml"))[0])
    monkeypatch.delenv("CKPT_CHAOS_GOLDEN_TREE", raising=False)
    monkeypatch.chdir(ROOT)
    key = command.golden_key(s)
    monkeypatch.chdir(tmp_path)  # the trainer's script is not here: another key
    assert command.golden_key(s) != key
    monkeypatch.setenv("CKPT_CHAOS_GOLDEN_TREE", str(ROOT))
    assert command.golden_key(s) == key


# ---- run -x ---------------------------------------------------------------------------------------

@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "chaos").mkdir()
    for name in ("a-first", "b-fails", "c-last"):
        (tmp_path / "chaos" / f"{name}.toml").write_text(QUICK.format(module="reference_trainer", known=""))
    (tmp_path / "pyproject.toml").write_text('[tool.ckpt-chaos]\nscenarios = ["chaos"]\nbuiltin = false\n')
    monkeypatch.chdir(tmp_path)
    cli._project.cache_clear()
    yield tmp_path
    cli._project.cache_clear()


def _verdict(s, *_args, **_kw) -> Result:
    return Result(scenario=s.name, verdict="fail" if s.name == "b-fails" else "pass", wall_s=0.1)


def test_exitfirst_stops_a_serial_run_at_its_first_failure(project, monkeypatch):
    ran = []
    monkeypatch.setattr(runner, "run_scenario", lambda s, *a, **k: ran.append(s.name) or _verdict(s))
    assert cli.main(["run", "-x", "--plots", "none", "--out", str(project)]) == cli.EXIT_FAILED
    assert ran == ["a-first", "b-fails"]
    rows = json.loads((project / "reports" / "project" / "latest" / "results.json").read_text())["results"]
    assert [r["scenario"] for r in rows] == ["a-first", "b-fails"]
    ran.clear()
    assert cli.main(["run", "--plots", "none", "--out", str(project)]) == cli.EXIT_FAILED
    assert ran == ["a-first", "b-fails", "c-last"]


def test_exitfirst_stops_the_running_scenarios_of_a_parallel_run(project, monkeypatch):
    from ckpt_chaos.report import results
    from ckpt_chaos.run import parallel

    stopped = []

    class Parallel:  # ParallelRun's contract: on_done per row; an interrupt stops the rest and goes on
        def __init__(self, chosen, out, golden, jobs, on_start, on_done):
            self.chosen, self.on_start, self.on_done = chosen, on_start, on_done

        def run(self):
            try:
                for i, s in enumerate(self.chosen):
                    self.on_start(i, s)
                    self.on_done(i, s, results.scenario_row(_verdict(s), s, write=False), "")
            except KeyboardInterrupt:
                stopped.append(True)
                raise

    monkeypatch.setattr(parallel, "ParallelRun", Parallel)
    assert cli.main(["run", "-x", "-n", "2", "--plots", "none", "--out", str(project)]) == cli.EXIT_FAILED
    assert stopped == [True]
    rows = json.loads((project / "reports" / "project" / "latest" / "results.json").read_text())["results"]
    assert [r["scenario"] for r in rows] == ["a-first", "b-fails"]


# ---- one real mutant --------------------------------------------------------------------------------

QUICKEST = "preempt-before-first-optimizer-step"  # the default suite's cheapest scenario: one save, one resume


@pytest.mark.slow
@pytest.mark.nightly
@pytest.mark.parametrize("jobs", [None, pytest.param("2", marks=pytest.mark.nightly)])
def test_a_real_mutant_is_killed_by_the_scenario_that_reaches_it(tmp_path, jobs):
    """The whole chain on one hand-picked mutant: a coverage run of one scenario from this tree, then
    cosmic-ray applies `if not final.exists():` before the commit rename (it quarantines a folder that
    is not there, so the save fails) in a copy, and the scenario kills it with the pristine checker;
    with ``--jobs``, from a worker of a parallel run, which imports the pristine harness too."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("CKPT_CHAOS_GOLDEN_TREE", None)
    golden, reports = tmp_path / "golden", tmp_path / "reports"
    cov = subprocess.run([sys.executable, "-m", "ckpt_chaos.cli", "run", "--coverage", "--plots", "none",
                          "--golden-dir", str(golden), "--reports", str(reports), QUICKEST],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert cov.returncode == 0, cov.stderr[-3000:]
    line = next(n for n, text in enumerate((ROOT / CKPT).read_text().split("\n"), 1)
                if text.strip().startswith("if final.exists():"))
    run = subprocess.run([sys.executable, "-m", "ckpt_chaos.mutation", "--files", CKPT,
                          "--mutant", f"{CKPT}:{line}:core/AddNot", "--coverage-from", str(reports / "custom" / "latest"),
                          "--work", str(tmp_path / "work"), "--results", str(tmp_path / "results"),
                          *(["--jobs", jobs] if jobs else [])],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert json.loads((tmp_path / "work" / "state.json").read_text())["run_args"] == (["-n", jobs] if jobs else [])
    data = json.loads((tmp_path / "results" / "mutation.json").read_text())
    assert data["totals"]["total"] == 1 and data["totals"]["killed"] == 1, data["mutants"]
    m = data["mutants"][0]
    assert m["scenario"] == QUICKEST and m["checks"] and "+        if not final.exists():" in m["diff"]
    assert (tmp_path / "results" / "mutation.md").read_text().count(QUICKEST) == 1
    assert (ROOT / CKPT).read_text().count("if final.exists():") == 1  # the repository was never mutated


def _occurrence(operator: str, line: int) -> int:
    """cosmic-ray's occurrence number of ``operator``'s first mutation on ``line`` of CKPT."""
    from cosmic_ray.ast import ast_nodes, get_ast_from_path
    from cosmic_ray.plugins import get_operator

    op = get_operator(operator)()
    starts = [start for node in ast_nodes(get_ast_from_path(ROOT / CKPT)) for start, _ in op.mutation_positions(node)]
    return next(i for i, start in enumerate(starts) if start[0] == line)


def test_the_session_s_outcomes_become_statuses_and_a_later_equivalent_mark_wins(tmp_path):
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import MutationSpec, TestOutcome, WorkerOutcome, WorkItem, WorkResult

    line = next(n for n, text in enumerate((ROOT / CKPT).read_text().split("\n"), 1)
                if text.strip().startswith("if final.exists():"))
    occurrence = _occurrence("core/AddNot", line)
    outcomes = {"killed": (TestOutcome.KILLED, {"status": "killed", "scenario": "s", "checks": ["c"], "wall_s": 3}),
                "survived": (TestOutcome.SURVIVED, {"status": "survived", "ran": ["s"], "wall_s": 9}),
                "cut": (TestOutcome.KILLED, "timeout"), "pending": None}
    session = tmp_path / "s.sqlite"
    with use_db(str(session), WorkDB.Mode.create) as db:
        for n, (job, outcome) in enumerate(outcomes.items()):
            db.add_work_item(WorkItem(job_id=job, mutations=[MutationSpec(
                CKPT, "core/AddNot" if job != "survived" else "core/ReplaceTrueWithFalse",
                n if job != "killed" else occurrence,
                (line, 8), (line, 9))]))
            if outcome is not None:
                out = outcome[1] if isinstance(outcome[1], str) else mutation.OUTCOME + json.dumps(outcome[1])
                db.set_result(job, WorkResult(output=out, worker_outcome=WorkerOutcome.NORMAL, test_outcome=outcome[0]))
    got = {m["job"]: m for m in collect(session)}
    assert {j: m["status"] for j, m in got.items()} == {"killed": "killed", "survived": "survived", "cut": "timeout",
                                                         "pending": "pending"}
    assert got["killed"]["checks"] == ["c"] and "+        if not final.exists():" in got["killed"]["diff"]
    f = figures(list(got.values()))["totals"]
    assert f["score"] == round(1 / 3, 4) and f["pending"] == 1  # pending: left out; a timeout without a verdict: not killed
    old, new = changed_lines(got["killed"]["diff"])
    marked = [{"file": CKPT, "operator": "core/AddNot", "original": old, "mutant": new, "reason": "r"}]
    again = {m["job"]: m for m in collect(session, equivalent=marked)}
    assert again["killed"]["status"] == "equivalent" and again["killed"]["run_status"] == "killed"


def test_a_sample_s_score_carries_a_wilson_interval_that_holds_it_and_narrows_with_size():
    assert wilson(0, 0) is None
    lo, hi = wilson(10, 14)
    assert (lo, hi) == (0.4535, 0.8828)  # the Wilson interval of 10 in 14, as published tables give it
    assert wilson(20, 20)[1] == 1.0 and wilson(20, 20)[0] < 1.0
    assert wilson(0, 20)[0] == 0.0
    big = wilson(100, 140)
    assert big[0] > lo and big[1] < hi
    ms = [{"status": s, "file": CKPT} for s in ("killed", "killed", "survived", "equivalent", "pending")]
    assert figures(ms)["totals"].get("score_ci95") is None  # every mutant run: no interval
    assert figures(ms, sampled=True)["totals"]["score_ci95"] == wilson(2, 3)


def test_a_mutant_no_scenario_reaches_is_left_to_exec_so_a_cut_run_stays_a_random_sample(tmp_path):
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import MutationSpec, WorkItem

    lines = [n for n, text in enumerate((ROOT / CKPT).read_text().split("\n"), 1) if text.strip().startswith("if ")][:2]
    session = tmp_path / "s.sqlite"
    with use_db(str(session), WorkDB.Mode.create) as db:
        for line in lines:
            db.add_work_item(WorkItem(job_id=str(line), mutations=[MutationSpec(
                CKPT, "core/AddNot", _occurrence("core/AddNot", line), (line, 8), (line, 9))]))
    base = {"walls": {"quick": 1.0}, "reached": {CKPT: {str(lines[0]): ["quick"]}}}
    counts = annotate(session, base, [CKPT], None, 0, [])
    assert (counts["to run"], counts["not reached"]) == (1, 1)
    with use_db(str(session), WorkDB.Mode.open) as db:
        assert sorted(i.job_id for i in db.pending_work_items) == sorted(map(str, lines))


def test_a_run_is_resumed_only_with_the_code_it_began_with(tmp_path):
    files = ["reference_trainer/checkpoint.py"]
    base = {"reached": {"reference_trainer/checkpoint.py": {"10": ["quick"]}}}
    (tmp_path / "state.json").write_text(json.dumps({"base": base, "files": files}))
    began = fingerprint(base, files)
    run = {"extra": {"sample": {"files": files}, "cache": {"dir": None, "fingerprint": began}}}
    unchanged_since(tmp_path, run)  # the same tree: it goes on
    run["extra"]["cache"]["fingerprint"] = "0" * 64  # as if a scenario or the trainer had changed since
    with pytest.raises(mutation.MutationError, match="--resume: reference_trainer, ckpt_chaos changed since"):
        unchanged_since(tmp_path, run)


def test_a_run_that_outlived_its_code_says_how_to_go_on_at_its_commit_and_goes_on_there(tmp_path):
    files = ["reference_trainer/checkpoint.py"]
    base = {"reached": {"reference_trainer/checkpoint.py": {"10": ["quick"]}}}
    elsewhere = tmp_path / "at-1234567"
    (tmp_path / "state.json").write_text(json.dumps({"base": base, "files": files, "pristine": str(elsewhere),
                                                     "scenarios": str(elsewhere / "examples/x/scenarios")}))
    (tmp_path / "cosmic-ray.toml").write_text(f'test-command = "python {elsewhere}/benchmarks/mutation.py test"\n')
    run = {"extra": {"sample": {"files": files}, "commit": "1234567" + "0" * 33, "flags": ["--operators", "checkpoint"],
                     "cache": {"dir": None, "fingerprint": "0" * 64}}}
    with pytest.raises(mutation.MutationError) as e:
        unchanged_since(tmp_path, run)
    assert f"git worktree add ../at-1234567 {'1234567' + '0' * 33} && cd ../at-1234567 && python " \
           f"-m ckpt_chaos.mutation --operators checkpoint --resume --work {tmp_path}" in str(e.value)
    # resumed in that worktree: the mutants are compared with it, and cosmic-ray runs its package
    moved(tmp_path)
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["pristine"] == str(mutation.ROOT)
    assert state["scenarios"] == str(mutation.ROOT / "examples/x/scenarios")
    command = tomllib.loads((tmp_path / "cosmic-ray.toml").read_text())["test-command"]
    assert shlex.split(command) == [sys.executable, "-P", "-m", "ckpt_chaos.mutation", "test", "--state",
                                    str(tmp_path / "state.json")]


def test_the_test_command_imports_the_checkout_on_pythonpath_not_the_copy_it_runs_in(tmp_path):
    """cosmic-ray runs the test command in the copy that holds the mutant, which has a ckpt_chaos of
    its own: the checker must come from the pristine checkout that $PYTHONPATH names."""
    copy = tmp_path / "tree"
    (copy / "ckpt_chaos" / "mutation").mkdir(parents=True)
    (copy / "ckpt_chaos" / "__init__.py").write_text('raise SystemExit("the copy\'s ckpt_chaos was imported")\n')
    (copy / "ckpt_chaos" / "mutation" / "__init__.py").write_text("")
    argv = shlex.split(cosmic_ray_command(tmp_path))
    env = {**os.environ, "PYTHONPATH": str(mutation.ROOT)}
    env.pop("PYTHONSAFEPATH", None)
    run = subprocess.run([*argv[:argv.index("test") + 1], "--help"], cwd=copy, env=env, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0 and "--state" in run.stdout, run.stderr
