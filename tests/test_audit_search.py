"""The audit's search (``ckpt_chaos/audit/search.py``): two of the audit's faults composed across
launches, from a profile read from plain_ddp's records (fast), and end to end on a planted copy of
the plain DDP example that survives every single fault but not their composition (slow)."""

from __future__ import annotations

import json
import tomllib
from collections import Counter
from pathlib import Path

import pytest

from ckpt_chaos import order
from ckpt_chaos.audit import search
from ckpt_chaos.audit.discover import discover
from ckpt_chaos.audit.generate import generate
from ckpt_chaos.scenario import ScenarioError, from_dict, load
from tests.helpers import REPO
from tests.test_audit import plain_ddp

FAMILIES = ("mid-write", "commit", "power-loss", "term", "disk-full", "errno", "kill", "load")


@pytest.fixture
def profile(tmp_path):
    return discover(plain_ddp(tmp_path))


def sides(p, verdicts=None, families=FAMILIES):
    left = Counter()
    a, b = search.pieces(p, generate(p, families), verdicts, left)
    return a, b, left


def test_a_is_a_launch_ending_fault_and_b_the_others_moved_to_the_relaunch(profile):
    a, b, _ = sides(profile)
    assert sorted(x.family for x in a) == ["commit", "kill", "mid-write", "power-loss", "power-loss", "power-loss",
                                           "term", "term"]
    assert all("attempt" not in x.table for x in a)
    moved = {x.fault: x.table for x in b}
    # every single fault, and the relaunch's load kill as its own scenario aims it
    assert {x.family for x in b} == set(FAMILIES)
    assert all(t["attempt"] == 1 for t in moved.values())
    # a relaunch's write is matched by exact path: the file's names, step_8.pt.tmp and step_8.pt, as one glob
    assert moved["kill at half"]["when"]["path"] == "checkpoints/step_00000008.pt*"
    assert moved["EIO on write"]["path"] == "step_00000008.pt*"
    # the folder's fsync that ends save 2 is its 2nd in launch 0, the 1st of a relaunch resumed from step 4
    alone = next(x for x in b if x.fault == "power loss undo")
    assert alone.alone["when"]["nth"] == 2 and "nth" not in alone.table["when"]


def test_a_single_fault_that_failed_in_the_suite_is_not_composed(profile):
    gen = generate(profile, FAMILIES)
    verdicts = {g.name: "pass" for g in gen}
    failed = next(g for g in gen if g.family == "commit")
    verdicts[failed.name] = "fail"
    a, b, left = sides(profile, verdicts)
    assert failed.name not in {x.source for x in a + b}
    assert left["failed or unknown in the suite (its finding, not the search's)"] == 1
    # unknown results (explore --command on a scenario file): every single fault is composed
    a2, b2, _ = sides(profile, None)
    assert failed.name in {x.source for x in a2} and len(a2) == len(a) + 1


def test_composition_expects_what_a_correct_trainer_guarantees(profile, tmp_path):
    a, b, _ = sides(profile)
    kill = next(x for x in a if x.family == "kill")
    mid = next(x for x in b if x.family == "mid-write")
    disk = next(x for x in b if x.fault == "disk full")
    text, s = search.scenario_text(profile, [(kill, 0), (mid, 1)])
    data = tomllib.loads(text)
    assert data["recovery"] == {"max_restarts": 3}  # both faults relaunched, and a spare
    assert "expect" not in data  # no resume_from; lost work: one interval, the default
    assert s.expect.resume_from is None and s.expect.max_lost_steps is None
    assert [f.attempt for f in s.faults] == [0, 1]
    assert text.startswith("# ckpt-chaos audit: ") and "composed by the audit's search" in text
    # a fault that may fail saves: no bound on lost work, the disk as its scenario sizes it
    text, s = search.scenario_text(profile, [(kill, 0), (disk, 1)])
    assert s.expect.max_lost_steps == profile.steps == 12
    assert s.storage.fs == "tmpfs"
    # the file is an ordinary scenario: it loads back the same
    path = tmp_path / "x.toml"
    path.write_text(text)
    assert load(path).to_dict()["faults"] == s.to_dict()["faults"]


def test_the_load_kill_is_only_composed_after_another_a_than_its_own(profile):
    a, b, _ = sides(profile)
    pairs = search.pairs(a, b, profile)
    load_pairs = [(x.family, y.family) for x, y in pairs if y.family == "load"]
    assert ("kill", "load") not in load_pairs  # that is the load scenario itself
    assert ("mid-write", "load") in load_pairs
    assert all(x.source != y.source for x, y in pairs)


def test_after_is_declared_where_the_race_check_asks_for_it(profile):
    a, b, _ = sides(profile)
    for x, y in search.pairs(a, b, profile)[:20]:  # faults of two launches never race
        _, s = search.scenario_text(profile, [(x, 0), (y, 1)])
        assert order.races(s) == []
    # two faults of one launch on different ranks race; the later one waits for the earlier
    mid = next(x for x in a if x.family == "mid-write")
    term = next(x for x in a if x.fault == "SIGTERM rank 1")
    tables = [dict(mid.alone, when=dict(mid.alone["when"])), dict(term.alone, when=dict(term.alone["when"]))]
    data = {"command": {"argv": ["t.py", "{ckpt_dir}"], "complete": "step_*.pt"}, "world_size": 2, "suites": [],
            "faults": tables}
    with pytest.raises(ScenarioError, match="no order declared"):
        from_dict(data, "t", "t")
    search.declare_order(tables, {k: v for k, v in data.items() if k != "faults"})
    assert tables[1]["when"]["after"] == 0 and "after" not in tables[0]["when"]
    assert order.races(from_dict(data, "t", "t")) == []


def test_the_draw_is_the_seeds_and_tries_the_least_tried_first(profile):
    a, b, _ = sides(profile)
    pairs = search.pairs(a, b, profile)
    first = search.draw(pairs, 7)
    assert first == search.draw(pairs, 7) and first != search.draw(pairs, 8)
    assert sorted(map(id, first)) == sorted(map(id, pairs)) and len(first) == len(pairs)
    late = [search._late(x, y) for x, y in first]
    assert late == sorted(late), "the power cuts after the target save come last"
    early = [(x.key, y.key) for x, y in first if not search._late(x, y)]
    n = len(set(early))
    assert len(set(early[:n])) == n, "no pair of (family, point) twice before every one was tried once"
    # the least tried A and B apart: while pairs of an untried A and an untried B are left, one of them
    four = first[:4]
    assert len({x.key for x, _ in four}) == 4 and len({y.key for _, y in four}) == 4, four


def test_budget_values():
    assert search.parse_budget("90s") == 90 and search.parse_budget("10m") == 600
    assert search.parse_budget("600") == 600 and search.parse_budget(45) == 45 and search.parse_budget("1h") == 3600
    for bad in ("ten", "-5m", "0", "", "1x", "nan", True):
        with pytest.raises(ValueError, match="90s, 10m or 1h"):
            search.parse_budget(bad)


@pytest.fixture
def cli(monkeypatch, capsys):
    from ckpt_chaos.cli import main
    from ckpt_chaos.subcommands.common import project

    def run(*args: str, cwd: Path) -> tuple[int, str]:
        monkeypatch.chdir(cwd)
        project.cache_clear()
        try:
            code = main(list(args))
        finally:
            project.cache_clear()
        return code, capsys.readouterr().err

    return run


def test_cli_bad_budget_names_the_option_and_the_fix(tmp_path, cli):
    code, err = cli("audit", "--budget", "soon", "--", "train.py", "--ckpt-dir", "{ckpt_dir}", cwd=tmp_path)
    assert code == 2 and "--budget soon" in err and "90s, 10m or 1h" in err
    (tmp_path / "pyproject.toml").write_text('[tool.ckpt-chaos.audit]\nargv = ["t.py", "{ckpt_dir}"]\nbudget = "-1m"\n')
    code, err = cli("audit", cwd=tmp_path)
    assert code == 2 and "tool.ckpt-chaos.audit.budget" in err and "90s, 10m or 1h" in err
    (tmp_path / "pyproject.toml").write_text('[tool.ckpt-chaos.audit]\nargv = ["t.py", "{ckpt_dir}"]\nbudget = true\n')
    code, err = cli("audit", cwd=tmp_path)
    assert code == 2 and "tool.ckpt-chaos.audit.budget" in err and 'budget = "10m"' in err


def test_cli_trainer_and_command_are_exclusive(tmp_path, cli):
    code, err = cli("explore", "--trainer", "tests.planted.rng_not_saved", "--command", "x.toml", cwd=tmp_path)
    assert code == 2 and "--trainer tests.planted.rng_not_saved and --command x.toml: give one" in err
    code, err = cli("explore", "--command", "x.toml", "--shrink-budget", "60s", cwd=tmp_path)
    assert code == 2 and "--shrink-budget is --trainer's" in err
    code, err = cli("explore", "--command", "missing.toml", cwd=tmp_path)
    assert code == 2 and "--command missing.toml: no such file" in err
    (tmp_path / "s.toml").write_text('world_size = 2\n[[faults]]\nkind = "kill"\nwhen = { point = "step.begin" }\n')
    code, err = cli("explore", "--command", "s.toml", cwd=tmp_path)
    assert code == 2 and "no [command] table" in err and "--trainer MODULE" in err


# ---- end to end ----------------------------------------------------------------------------------------------

ARGV = ["--ckpt-dir", "{ckpt_dir}", "--steps", "12", "--save-every", "4"]
IN_PLACE_AFTER_RESUME = [
    ("def save(path: Path, state: dict) -> None:\n    tmp = path.with_name(path.name + \".tmp\")",
     "RESUMED = False\n\n\ndef save(path: Path, state: dict) -> None:\n"
     "    tmp = path if RESUMED else path.with_name(path.name + \".tmp\")"),
    ("        state = torch.load(last, weights_only=False)\n",
     "        global RESUMED\n        RESUMED = True\n        state = torch.load(last, weights_only=False)\n"),
]


def scenario_file(folder: Path, trainer: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "trainer.toml"
    path.write_text("world_size = 2\n\n[command]\n"
                    f"argv = {json.dumps([trainer, *ARGV])}\nkey = {json.dumps([trainer])}\n"
                    'complete = "step_*.pt"\nsave_every = 4\n')
    return path


def explore(file: Path, out: Path, golden: Path):
    from ckpt_chaos.cli import main

    code = main(["explore", "--command", str(file), "--families", "kill,mid-write", "--budget", "300s", "--seed", "0",
                 "--out", str(out), "--golden-dir", str(golden)])
    summary = json.loads(next(out.glob("reports/explore/*/summary.json")).read_text())
    return code, summary


@pytest.mark.slow
@pytest.mark.nightly  # make test: the composition, order and expectation units above, from plain_ddp's records
def test_the_search_finds_a_trainer_that_writes_in_place_after_a_resume(tmp_path, command_golden_root, monkeypatch):
    """The copy saves as the example does (a temporary name, fsynced, renamed) until it has resumed once,
    then straight to the final name. Alone, each fault of the two families passes: a kill between saves
    or at half of step_8.pt.tmp leaves step_4, and the relaunch's saves meet no fault. Composed, the kill
    between saves (step 7) makes the relaunch resume from step_4 and write step_8.pt in place, the kill
    at half of it leaves it torn under the name step_*.pt counts complete, and the third launch takes
    it: the root check names step_00000008.pt. Of the two pairs the families give, one is that."""
    monkeypatch.chdir(REPO)
    text = (REPO / "examples" / "plain_ddp" / "train.py").read_text()
    for old, new in IN_PLACE_AFTER_RESUME:
        assert text.count(old) == 1, f"the example no longer has {old!r}: update the planted bug"
        text = text.replace(old, new)
    planted = tmp_path / "planted" / "train.py"
    planted.parent.mkdir()
    planted.write_text(text)
    code, sm = explore(scenario_file(tmp_path / "planted", str(planted)), tmp_path / "out", command_golden_root)
    assert code == 1, sm
    assert sm["pairs"] == 2 and len(sm["findings"]) == 1, sm
    f = sm["findings"][0]
    assert f["reproduced"] and f["identity"] in ("committed_valid", "no_torn_read", "resumed_newest"), f
    assert "step_00000008.pt" in f["detail"], f
    assert [c.split("--", 1)[1] for c in f["composed"]] == ["kill--sigkill-all-step-7",
                                                             "mid-write--kill-at-half-step-pt"], f
    s = load(f["file"])
    assert [(x.kind, x.attempt) for x in s.faults] == [("kill", 0), ("kill", 1)]
    assert s.faults[1].when.path == "checkpoints/step_00000008.pt*"

    # the example itself: the same pairs, nothing found
    code, sm = explore(scenario_file(tmp_path / "example", "examples/plain_ddp/train.py"), tmp_path / "out2",
                       command_golden_root)
    assert code == 0 and sm["pairs"] == 2 and sm["schedules"] == 2 and sm["findings"] == [], sm
