"""The report of a [command] trainer's run (a user's own script under the automatic probe layer): its
loss plot read from the layer's ``loss_hex``, its per-rank timeline from the layer's points (and the
file-event log when there is one), its trainer named in results.json and results.csv, steps lost never
made up, and ``report --browser`` failing on a plot that should be there and is not.

The unit tests draw from records written here and launch no process; the slow one runs the cheapest
plain-DDP example scenario and opens its report in headless Chromium.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_chaos import cli
from ckpt_chaos.check import trajectory
from ckpt_chaos.check.history import step_loss
from ckpt_chaos.report import results
from ckpt_chaos.report.plots import plot_scenario, wanted
from ckpt_chaos.run.runner import Result
from ckpt_chaos.scenario import load
from tests.helpers import REPO
from tests import test_any_trainer

MID_WRITE = test_any_trainer.MID_WRITE
NAME = MID_WRITE.stem
T0 = 1_800_000_000.0


def _hex(*losses: float) -> str:
    return ",".join(float.hex(x) for x in losses)


def _lines(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def probe(t: float, point: str, rank: int, launch: int, **info) -> dict:
    return {"source": "probe", "kind": point, "t": T0 + t, "rank": rank, "pid": 100 + 10 * launch + rank,
            "launch": launch, "info": info}


def command_run(run_dir: Path, files: bool = True) -> Path:
    """A [command] run as the probe layer leaves it: rank 0 killed half-way through writing step 8's file,
    the relaunch loading step 4 on both ranks; trajectory records with loss_hex and no loss; and, with
    ``files``, the file-event log of the checkpoint folder (plus a file outside it, to be left out)."""
    (run_dir / "golden").mkdir(parents=True)
    golden = [{"step": s, "attempt": 0, "loss_hex": _hex(1.0 / s, 0.5 / s), "lr_hex": float.hex(0.01)}
              for s in range(1, 13)]
    _lines(run_dir / "golden" / "trajectory.jsonl", golden)
    _lines(run_dir / "trajectory.jsonl", [{**r, "attempt": 0} for r in golden[:8]]
           + [{**r, "attempt": 1} for r in golden[4:]])
    (run_dir / "scenario.toml").write_text(f'name = "{NAME}"\n[command]\nargv = ["train.py"]\n'
                                           'ckpt_dir = "checkpoints"\n')
    ckpt = "checkpoints/step_00000008.pt.tmp"
    _lines(run_dir / "history.jsonl", [
        {"source": "harness", "kind": "launch", "t": T0, "launch": 0, "world_size": 2, "pid": 1, "mode": "harness"},
        probe(3.0, "probe.armed", 0, 0, armed=["files"], points=["file.write"]),
        probe(3.1, "ckpt.stage", 0, 0, name="step_00000004.pt.tmp", path="checkpoints/step_00000004.pt.tmp"),
        probe(3.11, "file.write", 0, 0, path="checkpoints/step_00000004.pt.tmp", bytes=10, fraction=0.5),
        probe(3.12, "file.done", 0, 0, path="checkpoints/step_00000004.pt.tmp", bytes=20),
        probe(3.13, "file.rename", 0, 0, path="checkpoints/step_00000004.pt", src="checkpoints/step_00000004.pt.tmp"),
        probe(3.5, "ckpt.stage", 0, 0, name="step_00000008.pt.tmp", path=ckpt),
        probe(3.51, "file.write", 0, 0, path=ckpt, bytes=10, fraction=0.5),
        {"source": "harness", "kind": "fault", "t": T0 + 3.52, "index": 0, "fault": "kill", "target": "rank:0",
         "launch": 0, "at": {"point": "file.write", "rank": 0, "info": {"path": ckpt}}, "pids": [100]},
        {"source": "harness", "kind": "rank_exit", "t": T0 + 3.6, "launch": 0, "rank": 0, "pid": 100},
        {"source": "harness", "kind": "exit", "t": T0 + 3.9, "launch": 0, "rc": 1, "snapshot": {}},
        {"source": "harness", "kind": "launch", "t": T0 + 4.0, "launch": 1, "world_size": 2, "pid": 2,
         "mode": "harness"},
        *(probe(7.0 + r / 100, p, r, 1, path="checkpoints/step_00000004.pt")
          for r in (0, 1) for p in ("load.begin", "load.end")),
        {"source": "harness", "kind": "exit", "t": T0 + 8.0, "launch": 1, "rc": 0, "snapshot": {}},
    ])
    if files:
        where = str(run_dir.absolute())
        _lines(run_dir / "files.jsonl", [
            {"t": T0 + 3.105, "launch": 0, "pid": 100, "rank": 0, "job": "chaos", "op": "open",
             "path": f"{where}/checkpoints/step_00000004.pt.tmp"},
            {"t": T0 + 3.125, "launch": 0, "pid": 100, "rank": 0, "job": "chaos", "op": "close",
             "path": f"{where}/checkpoints/step_00000004.pt.tmp", "wrote": True, "size": 20},
            {"t": T0 + 3.505, "launch": 0, "pid": 100, "rank": 0, "job": "chaos", "op": "open", "path": ckpt},
            {"t": T0 + 3.2, "launch": 0, "pid": 100, "rank": 0, "job": "chaos", "op": "open",
             "path": "/usr/lib/python3/x.py"},
            {"t": T0 + 6.9, "launch": 1, "pid": 110, "rank": 0, "job": "chaos", "op": "open", "path": "checkpoints",
             "dir": True},  # the folder listed, never closed in the log: no file of rank 0's
            {"t": T0 + 7.005, "launch": 1, "pid": 111, "rank": 1, "job": "chaos", "op": "open",
             "path": "checkpoints/step_00000004.pt"},
            {"t": T0 + 7.015, "launch": 1, "pid": 111, "rank": 1, "job": "chaos", "op": "close",
             "path": "checkpoints/step_00000004.pt", "wrote": False, "size": 20},
        ])
    return run_dir


def ids(svg: Path) -> set[str]:
    """The plot elements drawn, by kind and lane: ``save-rank0``, ``file-cut-rank0``, ``loss-launch-1``."""
    found = set(re.findall(r'id="([a-z][\w-]*)"', svg.read_text()))
    return found | {re.sub(r"-\d+$", "", i) for i in found}  # save-rank0-2: the 2nd save on rank 0's lane


def test_a_step_loss_is_its_loss_or_the_sum_of_its_loss_hex():
    assert step_loss({"loss": 2.5, "loss_hex": _hex(9.0)}) == 2.5  # the reference trainer's
    assert step_loss({"loss_hex": _hex(3.0, 0.5)}) == 3.5  # the probe layer's: each backward's loss
    assert step_loss({"loss_hex": float.hex(0.1)}) == 0.1  # bit for bit
    assert trajectory._loss is step_loss  # the trajectory check reads it the same way


def test_a_command_run_gets_its_loss_plot_and_per_rank_timeline(tmp_path):
    run_dir = command_run(tmp_path / NAME)
    assert wanted(run_dir) == {"loss": "a trajectory (trajectory.jsonl)", "timeline": "a history (history.jsonl)"}
    assert plot_scenario(run_dir) == {"loss": "loss.svg", "timeline": "timeline.svg"}
    assert not (run_dir / "plot-error.txt").exists()
    assert {"loss-golden", "loss-launch-0", "loss-launch-1", "loss-fault-0-0"} <= ids(run_dir / "loss.svg")
    timeline = ids(run_dir / "timeline.svg")
    assert {"save-rank0", "write-rank0", "file-op-rank0",  # step 4 saved: stage, write, done, rename
            "save-cut-rank0", "write-cut-rank0",  # step 8's save and its file, cut by the kill
            "load-rank0", "load-rank1", "fault-0-0", "launch-0", "launch-1", "exit-0", "exit-1",
            "life0-rank0", "life0-rank1", "life1-rank0", "life1-rank1",
            "file-rank0", "file-cut-rank0", "file-rank1"} <= timeline, timeline  # files.jsonl's opens
    assert "kill rank:0" in (run_dir / "timeline.svg").read_text()
    assert not any(i.startswith("file-others") for i in timeline)  # x.py is no checkpoint file
    assert sum(i.startswith("file-cut-rank0-") for i in timeline) == 1  # step 8's file; the folder is none


def test_a_command_run_without_a_file_event_log_gets_its_timeline_all_the_same(tmp_path):
    run_dir = command_run(tmp_path / NAME, files=False)
    assert plot_scenario(run_dir) == {"loss": "loss.svg", "timeline": "timeline.svg"}
    timeline = ids(run_dir / "timeline.svg")
    assert {"save-rank0", "save-cut-rank0", "write-cut-rank0", "load-rank1", "fault-0-0"} <= timeline
    assert not {i for i in timeline if i.startswith("file-rank") or i.startswith("file-cut")}


def stored_suite(root: Path, plots: str = "all") -> Path:
    """A stored suite run holding the [command] run above, both plots drawn."""
    command_run(root / NAME)
    assert plot_scenario(root / NAME) == {"loss": "loss.svg", "timeline": "timeline.svg"}
    row = Result(scenario=NAME, verdict="pass", launches=2, run_dir=str(root / NAME)).to_dict()
    (root / "results.json").write_text(json.dumps({"suite": "t", "wall_s": 1.0, "plots": plots, "results": [row]}))
    return root


def clean_browser(*args, **kwargs) -> results.BrowserView:
    """What Chromium makes of the page, had every plot on it loaded: no Chromium is started."""
    html = Path(args[0]).read_text()
    n = html.count('class="plot"')
    return results.BrowserView(sections=1, rows=1, plots=n, broken_plots=0, script_errors=[], screenshot=None)


def test_report_browser_fails_naming_the_scenario_and_the_plot_missing(tmp_path, monkeypatch, capsys):
    root = stored_suite(tmp_path / "suite")
    monkeypatch.setattr(results, "view_in_browser", clean_browser)
    assert results.missing_plots(root) == []
    assert cli.main(["report", str(root), "--no-plots", "--browser"]) == cli.EXIT_OK

    (root / NAME / "loss.svg").unlink()  # as the report of a [command] run was, reading "loss"
    assert cli.main(["report", str(root), "--no-plots", "--browser"]) == cli.EXIT_FAILED
    err = capsys.readouterr().err.splitlines()
    assert err == [f"ckpt-chaos report: {NAME}: no loss plot (loss.svg): its run has a trajectory (trajectory.jsonl)"]

    (root / NAME / "plot-error.txt").write_text("loss: KeyError: 'loss'\n")
    assert cli.main(["report", str(root), "--no-plots", "--browser"]) == cli.EXIT_FAILED
    assert capsys.readouterr().err.splitlines() == [
        f"ckpt-chaos report: {NAME}: no loss plot (loss.svg): drawing it failed: KeyError: 'loss' "
        f"({NAME}/plot-error.txt)"]
    # An error left by an older build counts as well, also with the plot there from before it.
    (root / NAME / "plot-error.txt").write_text("KeyError: 'loss'\n")
    (root / NAME / "timeline.svg").unlink()
    assert results.missing_plots(root) == [
        f"{NAME}: no {p} plot ({p}.svg): drawing it failed: KeyError: 'loss' ({NAME}/plot-error.txt)"
        for p in ("loss", "timeline")]


def test_a_scenario_whose_plots_were_not_asked_for_is_not_missing_them(tmp_path):
    root = stored_suite(tmp_path / "suite", plots="failed")  # run --plots failed: a passing one has none
    for f in ("loss.svg", "timeline.svg"):
        (root / NAME / f).unlink()
    assert results.missing_plots(root) == []
    assert len(results.missing_plots(root, drawn=True)) == 2  # report without --no-plots draws them all


def test_steps_lost_and_resume_point_not_known_are_shown_as_such_never_as_0(tmp_path):
    ran = {"scenario": "a", "verdict": "pass", "launches": 2, "steps_lost": None, "resumed_from": [], "checks": [],
           "families": [], "kinds": [], "tags": [], "reason": "", "run_dir": ""}
    one = {**ran, "scenario": "b", "launches": 1}
    known = {**ran, "scenario": "c", "steps_lost": 0, "resumed_from": ["checkpoints/step_00000004.pt"]}
    assert [results.shown(r, "steps_lost") for r in (ran, one, known)] == ["?", "", "0"]
    assert [results.shown(r, "resumed_from") for r in (ran, one, known)] == ["?", "", "checkpoints/step_00000004.pt"]
    html = results.write(tmp_path, "t", [ran, one, known], 1.0, plots=False).read_text()
    cells = re.findall(r'<td class="num">(\d+)</td><td class="num">([^<]*)</td>', html)
    assert cells == [("2", "?"), ("1", ""), ("2", "0")]  # launches, steps lost
    with (tmp_path / "results.csv").open() as fh:
        assert [r["steps_lost"] for r in csv.DictReader(fh)] == ["", "", "0"]


def test_results_name_a_command_trainer_by_its_command_and_source():
    s = load(MID_WRITE)
    row = results.scenario_row(Result(scenario=s.name, verdict="pass"), s, write=False)
    assert row["trainer"] == {"command": s.command.argv, "launcher": "torchrun", "relaunch_argv": [],
                              "source": "examples/plain_ddp/train.py"}
    assert row["trainer_module"] is None  # not reference_trainer
    assert row["trainer_revision"] is None or re.fullmatch(r"[0-9a-f]{40}", row["trainer_revision"]["commit"])
    assert results.table([row])[0]["trainer"] == ("torchrun: examples/plain_ddp/train.py --ckpt-dir '{ckpt_dir}' "
                                                  "--steps 12 --save-every 4")
    for example in ("lightning", "accelerate"):  # their own launcher: the script, not the launcher's module
        s = next(load(p) for p in sorted((REPO / "examples" / example / "scenarios").glob("*.toml")))
        assert results.describe_trainer(s)["source"] == f"examples/{example}/train.py"
    assert results.command_source(["-m", "ckpt_chaos.cli", "--version"]).endswith("ckpt_chaos/cli.py")  # -m MODULE
    assert results.table([{"trainer_module": "reference_trainer"}])[0]["trainer"] == "reference_trainer"


@pytest.mark.slow
@pytest.mark.skipif(results.chromium() is None,
                    reason="no chromium here (make setup installs Debian's chromium as root)")
def test_the_report_of_a_command_scenario_shows_its_loss_and_timeline_in_chromium(tmp_path, plain_ddp_mid_write):
    out = tmp_path / "suite"  # a copy of the session's run of MID_WRITE (tests/conftest.py), the report written in it
    shutil.copytree(plain_ddp_mid_write.suite, out, symlinks=True)
    row = {**plain_ddp_mid_write.row, "run_dir": str(out / NAME)}
    assert row["verdict"] == "pass", row["reason"]
    html = results.write(out, "examples", [row], wall_s=row["wall_s"], plots=True)
    run_dir = out / NAME
    assert not (run_dir / "plot-error.txt").exists(), (run_dir / "plot-error.txt").read_text()
    text = html.read_text()
    for plot in ("loss.svg", "timeline.svg"):
        assert f'src="{NAME}/{plot}"' in text
    view = results.view_in_browser(html)
    assert not view.script_errors, view.script_errors
    assert (view.sections, view.plots, view.broken_plots) == (1, 2, 0)  # both SVGs of the scenario loaded
    loss, timeline = ids(run_dir / "loss.svg"), ids(run_dir / "timeline.svg")
    assert {"loss-golden", "loss-launch-0", "loss-launch-1", "loss-fault-0-0"} <= loss, loss
    assert {"save-rank0", "write-rank0", "save-cut-rank0", "write-cut-rank0",  # step 4 saved, step 8's cut
            "load-rank0", "load-rank1", "fault-0-0", "launch-1", "exit-1"} <= timeline, timeline
    stored = json.loads((out / "results.json").read_text())["results"][0]
    assert stored["trainer"]["source"] == "examples/plain_ddp/train.py" and stored["trainer_module"] is None
    lost = re.findall(r'<td class="num">2</td><td class="num">([^<]*)</td>', text)
    assert lost == ["?" if row["steps_lost"] is None else str(row["steps_lost"])]  # never a 0 made up
    p = subprocess.run([sys.executable, "-m", "ckpt_chaos.cli", "report", str(out), "--browser"],
                       capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1 scenarios, 2 plots loaded, 0 script errors" in p.stdout
