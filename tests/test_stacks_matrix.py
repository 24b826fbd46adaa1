"""benchmarks/stacks_matrix.py over a small stored run written here: columns read from each scenario's
faults, cells from the verdicts, links to the analyses that exist (no training)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("stacks_matrix", REPO / "benchmarks" / "stacks_matrix.py")
matrix = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(matrix)

COMMAND = """[command]
argv = ["examples/{stack}/train.py", "--ckpt-dir", "{{ckpt_dir}}"]
complete = "step_*.ckpt"
save_every = 4
"""
FAULTS = {
    "kill-mid-write": '[[faults]]\nkind = "kill"\ntarget = "rank:0"\n'
                      'when = { point = "file.write", rank = 0, path = "checkpoints/step_8.ckpt", min_fraction = 0.5 }\n',
    "kill-mid-epoch": '[[faults]]\nkind = "kill"\ntarget = "all"\nwhen = { point = "step.begin", rank = 0, step = 7 }\n',
    "kill-at-rename": '[[faults]]\nkind = "kill"\ntarget = "all"\n'
                      'when = { point = "file.rename", rank = 0, path = "checkpoints/step_8.ckpt" }\n',
    "load": '[[faults]]\nkind = "kill"\ntarget = "all"\nwhen = { point = "step.begin", rank = 0, step = 7 }\n\n'
            '[[faults]]\nkind = "kill"\ntarget = "rank:0"\nattempt = 1\n'
            'when = { point = "load.begin", rank = 0, path = "checkpoints/step_4.ckpt" }\n\n[recovery]\nmax_restarts = 2\n',
    "power-undo": '[[faults]]\nkind = "power_loss"\nwhen = { point = "step.begin", rank = 0, step = 9 }\n',
    "power-kept": '[[faults]]\nkind = "power_loss"\nmode = "entries-kept"\nwhen = { point = "step.begin", rank = 0, step = 9 }\n',
    "term": '[[faults]]\nkind = "term"\ntarget = "rank:1"\nwhen = { point = "step.begin", rank = 1, step = 7 }\n',
}


def row(stack: str, name: str, verdict: str, run: Path, **more) -> dict:
    checks = more.pop("checks", [])
    return {"scenario": name, "verdict": verdict, "reason": more.pop("reason", ""), "checks": checks,
            "trainer": {"source": f"examples/{stack}/train.py"}, "run_dir": str(run / name), **more}


def stored_run(folder: Path, rows: list[tuple[str, str, str, dict]]) -> Path:
    """A suite run as `ckpt-chaos run` leaves it: results.json and each scenario's scenario.toml."""
    out = []
    for stack, name, verdict, more in rows:
        (folder / name).mkdir(parents=True)
        fault = FAULTS[name.split(".", 1)[1]]
        (folder / name / "scenario.toml").write_text(
            f'description = "x"\nworld_size = 2\n\n{COMMAND.format(stack=stack)}\n{fault}')
        out.append(row(stack, name, verdict, folder, **more))
    (folder / "results.json").write_text(json.dumps({"suite": "compat", "wall_s": 1.0, "results": out}))
    return folder


@pytest.fixture
def analyses(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "analyses"
    folder.mkdir()
    (folder / "alpha.md").write_text("# alpha\n")
    monkeypatch.setattr(matrix, "ANALYSES", folder)
    return folder


def test_matrix_from_a_stored_run(tmp_path, analyses):
    lost = {"known_failure": "lost_work@1", "reason": "known failure: lost_work@1: 8 step(s) trained again"}
    torn = {"checks": [{"name": "job_completed", "check": "job_completed", "verdict": "fail", "detail": "exit 1"},
                       {"name": "no_torn_read@1", "check": "no_torn_read", "verdict": "fail", "detail": "torn"}],
            "reason": "no_torn_read@1: it loaded the torn step_8.ckpt"}
    run = stored_run(tmp_path / "run", [
        ("alpha", "a.kill-mid-write", "pass", {}), ("alpha", "b.kill-at-rename", "pass", {}),
        ("alpha", "c.kill-mid-epoch", "pass", {}), ("alpha", "d.load", "pass", {}),
        ("alpha", "e.power-undo", "xfail", lost), ("alpha", "f.power-kept", "pass", {}),
        ("alpha", "g.term", "pass", {}), ("beta", "h.kill-mid-write", "fail", torn),
        ("beta", "i.kill-mid-write", "pass", {}), ("delta", "j.term", "pass", {}),
    ])
    rows = matrix.read_runs([run])
    assert {name: r["column"] for (_, name), r in rows.items()} == {
        "a.kill-mid-write": "kill mid-write", "b.kill-at-rename": "kill at the commit",
        "c.kill-mid-epoch": "kill between saves", "d.load": "kill in the relaunch's load",
        "e.power-undo": "power loss", "f.power-kept": "power loss, entries kept", "g.term": "SIGTERM",
        "h.kill-mid-write": "kill mid-write", "i.kill-mid-write": "kill mid-write", "j.term": "SIGTERM"}
    out = tmp_path / "stacks.md"
    assert matrix.main([str(run), "--stack", "beta", "--stack", "gamma", "--out", str(out)]) == 0
    text = out.read_text()
    head = text.split("## Each scenario")[0]
    table = {line.split(" | ")[0].strip("| "): line for line in head.splitlines() if line.startswith("| ")}
    alpha = table["[alpha](analyses/alpha.md)"]
    assert "[xfail: lost_work@1](analyses/alpha.md)" in alpha
    assert alpha.count("[pass](analyses/alpha.md)") == 6
    # no analysis: no link; the job's own failure comes after the check that says what failed
    assert "| pass · fail: no_torn_read@1 |" in table["beta"]
    assert "gamma (no stored run)" in table
    assert "delta" not in text  # in the run, but neither analysed nor named: another example's trainer
    assert "benchmarks/stacks_matrix.py " + str(run) in text
    assert f"* `{run}`: suite `compat`, 10 scenario(s) in 1 s" in text
    assert "no_torn_read@1: it loaded the torn step_8.ckpt" in text


def test_the_run_given_last_wins(tmp_path, analyses):
    first = stored_run(tmp_path / "one", [("alpha", "a.term", "fail", {"reason": "hung"})])
    second = stored_run(tmp_path / "two", [("alpha", "a.term", "pass", {})])
    rows = matrix.read_runs([first, second])
    assert [r["verdict"] for r in rows.values()] == ["pass"]


def test_a_folder_without_results_is_named(tmp_path):
    with pytest.raises(SystemExit, match="nothing: no results.json"):
        matrix.read_runs([tmp_path / "nothing"])
