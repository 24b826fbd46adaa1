"""``ckpt-chaos audit --resize N=resumes|refused``: a relaunch on another number of ranks, generated from a
profile as declared (``changes.with_resize``), left out saying what to declare where nothing is; the
harness's side (the first relaunch alone on N ranks when it must refuse, ``resize_refused``, the
trajectory and ``resize_rng`` of a ``[command]`` trainer after a world-size change); end to end on the
plain DDP example and a planted copy of it (slow)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from ckpt_chaos.audit.changes import RESIZE_REL_TOL, Resize, parse_resize
from ckpt_chaos.audit.discover import discover
from ckpt_chaos.audit.generate import generate
from ckpt_chaos.check.trajectory import _resized_samples
from ckpt_chaos.check.verdict import Run
from ckpt_chaos.config import builtin_scenarios
from ckpt_chaos.scenario import ScenarioError, from_dict, load
from tests.helpers import REPO
from tests.test_audit import ARGV, cli, plain_ddp  # noqa: F401 (cli: the fixture)

KILL = [{"kind": "kill", "target": "all", "when": {"point": "step.begin", "rank": 0, "step": 7}}]


def _tables(g) -> dict:
    return tomllib.loads(g.text)


def _resizes(p, *texts: str, families=("kill",)) -> dict:
    return {g.name: g for g in generate(p, families, (), tuple(parse_resize(t, p.world_size) for t in texts))
            if g.family == "resize"}


# ---- the declaration ------------------------------------------------------------------------------------

def test_a_resize_is_parsed_with_its_rule_and_bad_values_say_the_fix():
    assert parse_resize("1=resumes", 2) == Resize(1, True, "keep")
    assert parse_resize("4=refused", 2) == Resize(4, False)
    assert parse_resize("4=resumes:shared", 2).rng == "shared"
    for bad, says in (("one=resumes", "one is not a number of ranks; write --resize N=resumes"),
                      ("0=resumes", "--resize 0=resumes: write --resize N=resumes or --resize N=refused"),
                      ("1", "--resize 1: write --resize N=resumes"),
                      ("2=resumes", "2 ranks is the trainer's own size (--nproc 2); give another number, e.g. "
                                    "--resize 1=resumes"),
                      ("1=maybe", "'maybe' is neither resumes nor refused"),
                      ("1=refused:keep", "goes after resumes, one of keep, reseed, shared"),
                      ("1=resumes:mine", "goes after resumes")):
        with pytest.raises(ValueError, match=None) as e:
            parse_resize(bad, 2)
        assert says in str(e.value), (bad, str(e.value))


def test_resumes_relaunches_on_n_ranks_within_the_catalogues_tolerance(tmp_path):
    p = discover(plain_ddp(tmp_path))
    g = _resizes(p, "1=resumes")["plain-ddp-train--resize--1-ranks-resumes"]
    assert (g.family, g.point, g.fault, g.left_out) == ("resize", "relaunch", "1 ranks resumes", None)
    t = _tables(g)
    assert t["faults"] == KILL  # between the saves of steps 4 and 8, as the kill family
    assert t["world_size"] == 2 and t["recovery"] == {"world_size": 1}
    # the tolerance is the catalogue's resize scenarios'; bit for bit is not promised across sizes
    catalogue = load(builtin_scenarios() / "process" / "kill-all-resume-on-four-of-two.toml")
    assert t["expect"] == {"trajectory": "tolerance", "rel_tol": RESIZE_REL_TOL} and \
        RESIZE_REL_TOL == catalogue.expect.rel_tol
    assert t["command"]["resize_rng"] == "keep" and t["command"]["argv"] == ARGV
    assert "relaunched on 1 rank(s) instead of 2" in t["description"] and "resume from step_00000004.pt" in \
        t["description"] and g.text.startswith("# ckpt-chaos audit: ")
    s = from_dict(t, "r.toml", "r")  # ckpt-chaos run's own checks
    assert [s.launch_world_size(n) for n in (0, 1)] == [2, 1] and s.command.resize_rng == "keep"
    shared = _tables(_resizes(p, "4=resumes:shared")["plain-ddp-train--resize--4-ranks-resumes"])
    assert shared["recovery"] == {"world_size": 4} and shared["command"]["resize_rng"] == "shared"


def test_refused_relaunches_on_n_ranks_once_then_at_the_old_size(tmp_path):
    from ckpt_chaos.run.command import argv

    p = discover(plain_ddp(tmp_path))
    g = _resizes(p, "1=refused")["plain-ddp-train--resize--1-ranks-refused"]
    t = _tables(g)
    assert t["faults"] == KILL and t["recovery"] == {"world_size": 1, "max_restarts": 2}
    assert t["expect"] == {"refused": ["world_size"]} and "resize_rng" not in t["command"]
    assert "must exit non-zero, train no step and leave its checkpoints as they were" in t["description"]
    assert "on 2 rank(s) again, resume from step_00000004.pt" in t["description"]
    s = from_dict(t, "r.toml", "r")
    # the refused relaunch alone is on 1 rank; the operator relaunches at the old size, bit for bit
    assert [s.launch_world_size(n) for n in (0, 1, 2)] == [2, 1, 2] and s.expect.trajectory == "bit-exact"
    assert argv(s, Path("/r"), 1, 1) == argv(s, Path("/r"), 2, 2)  # ranks are no option of its command line


def test_undeclared_or_self_launched_the_row_is_left_out_saying_what_to_declare(tmp_path):
    p = discover(plain_ddp(tmp_path))
    (row,) = _resizes(p, families=("kill", "resize")).values()
    assert (row.fault, row.point, row.text) == ("world size change", "relaunch", "")
    assert row.left_out == ("declare --resize 1=resumes or 1=refused: whether a trainer may resume on another "
                            "number of ranks is its own promise")
    assert _resizes(p, families=("kill",)) == {}  # as the other families: only where asked
    assert "resize" in {g.family for g in generate(p)}  # in the default families
    p.command = {**p.command, "launcher": "self"}
    (row,) = _resizes(p, families=("resize",)).values()
    assert "the trainer starts its own ranks (--launcher self)" in row.left_out
    (row,) = _resizes(p, "1=resumes").values()  # declared, still not the harness's to change
    assert row.fault == "1 ranks" and "--launcher self" in row.left_out
    p.command = {**p.command, "launcher": "torchrun"}
    p.saves = p.saves[:1]
    (row,) = _resizes(p, "1=refused").values()
    assert "no checkpoint to resume or to refuse" in row.left_out


# ---- the command line and the pyproject.toml ------------------------------------------------------------

def test_cli_bad_resizes_name_the_option_and_the_fix(tmp_path, cli):  # noqa: F811
    code, err = cli("--resize", "1=maybe", "--", "train.py", "{ckpt_dir}", cwd=tmp_path)
    assert code == 2 and "--resize 1=maybe: 'maybe' is neither resumes nor refused" in err
    code, err = cli("--nproc", "4", "--resize", "4=resumes", "--", "train.py", "{ckpt_dir}", cwd=tmp_path)
    assert code == 2 and "the trainer's own size (--nproc 4)" in err
    code, err = cli("--resize", "1=resumes", "--resize", "1=refused", "--", "train.py", "{ckpt_dir}", cwd=tmp_path)
    assert code == 2 and "--resize 1: declared more than once" in err


def test_the_pyproject_key_is_read_as_the_option(tmp_path, cli):  # noqa: F811
    table = '[tool.ckpt-chaos.audit]\nargv = ["train.py", "{ckpt_dir}"]\n'
    (tmp_path / "pyproject.toml").write_text(table + 'resize = ["2=resumes"]\n')
    code, err = cli(cwd=tmp_path)
    assert code == 2 and "--resize 2=resumes: 2 ranks is the trainer's own size" in err
    (tmp_path / "pyproject.toml").write_text(table + 'resize = "1=resumes 3=sometimes"\n')  # a string: its words
    code, err = cli(cwd=tmp_path)
    assert code == 2 and "--resize 3=sometimes: 'sometimes' is neither" in err
    (tmp_path / "pyproject.toml").write_text(table + "resize = 1\n")
    code, err = cli(cwd=tmp_path)
    assert code == 2 and "tool.ckpt-chaos.audit.resize: found 1; write e.g. resize = [\"1=resumes\"]" in err


# ---- the harness's side ----------------------------------------------------------------------------------

def _command(**recovery_expect) -> dict:
    return {"world_size": 2, "command": {"argv": ["train.py"]}, "faults": KILL, **recovery_expect}


def test_a_refused_world_size_is_a_command_trainers_and_needs_the_change():
    s = from_dict(_command(recovery={"world_size": 3, "max_restarts": 2}, expect={"refused": ["world_size"]}), "x", "x")
    assert [s.launch_world_size(n) for n in range(3)] == [2, 3, 2]
    with pytest.raises(ScenarioError, match="expect.refused: world_size is refused only where"):
        from_dict(_command(expect={"refused": ["world_size"]}), "x", "x")
    with pytest.raises(ScenarioError, match=r"world_size is refused only where a \[command\]"):  # not the reference
        from_dict({"world_size": 2, "faults": KILL, "recovery": {"world_size": 1, "relaunch": "harness"},
                   "expect": {"refused": ["world_size"]}}, "x", "x")
    with pytest.raises(ScenarioError, match="command.resize_rng: 'mine'; use keep, reseed or shared"):
        from_dict({"world_size": 2, "command": {"argv": ["train.py"], "resize_rng": "mine"}}, "x", "x")
    # resumed at another size, never bit for bit
    with pytest.raises(ScenarioError, match="bit-exact across a world-size change"):
        from_dict(_command(recovery={"world_size": 1}), "x", "x")


def _step(step: int, attempt: int, samples: list) -> dict:
    return {"step": step, "attempt": attempt, "samples": samples}


def test_other_samples_after_a_resize_fail_only_where_one_rank_holds_them_all(tmp_path):
    """The trajectory holds rank 0's samples; its share of a step follows the world size."""
    gold = {5: _step(5, 0, [[87, 8, 92, 60]])}

    def verdict(world: int, samples: list):
        s = from_dict(_command(recovery={"world_size": world}, expect={"trajectory": "tolerance"}), "x", "x")
        return _resized_samples(Run(s, tmp_path, tmp_path, [], []), gold, {5: _step(5, 1, samples)}, 5)

    v, detail = verdict(1, [[27, 66, 93, 18]])  # one rank: its samples are the job's, none golden rank 0's
    assert v == "fail" and detail.startswith("trajectory diverges at step 5, trained by launch 1 on 1 rank(s) where "
                                             "the golden run had 2: its one rank trained on 0 of the 4 samples")
    v, detail = verdict(1, [[87, 8, 92, 60, 1, 2, 3, 4]])  # the whole step, rank 1's share too: not known
    assert v == "unknown" and "records rank 0's samples and loss only" in detail
    assert verdict(4, [[87, 92]])[0] == "unknown"
    s = from_dict(_command(), "x", "x")
    assert _resized_samples(Run(s, tmp_path, tmp_path, [], []), gold, {5: _step(5, 1, [[1]])}, 5) is None


# ---- end to end: the plain DDP example, and a copy that refuses a resize ----------------------------------

def _generated(tmp_path: Path, golden_root: Path, script: str, resize: str):
    """The audit's resize scenario for ``script`` (its fault-free run made, nothing run), loaded."""
    out = tmp_path / "scenarios"
    p = subprocess.run([sys.executable, "-m", "ckpt_chaos.cli", "audit", "--no-run", "--families", "kill",
                        "--resize", resize, "--golden-dir", str(golden_root), "--out", str(tmp_path / "audit"),
                        "--write-scenarios", str(out), "--", script, *ARGV[1:]],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    (path,) = out.glob("*--resize--*.toml")
    return load(path)


def _checks(result) -> dict[str, tuple[str, str]]:
    return {c["name"]: (c["verdict"], c["detail"]) for c in result.checks}


@pytest.mark.slow
@pytest.mark.nightly  # make test: the generation and check units above; the run is an ordinary scenario's
def test_plain_ddp_resumed_on_one_rank_trains_other_samples(tmp_path, command_golden_root):
    """examples/plain_ddp/train.py on a relaunch at 1 rank instead of 2: rank 0 loads the newest
    step_*.pt (step_00000004.pt), restores state["rng"][0], its own stream, and skips batch_in_epoch = 4
    batches of its new sampler, which at one rank deals the epoch's 96 samples 8 at a time instead of
    48 a rank; so step 5 trains perm[32:40], where the golden run's rank 0 trained 8 of perm[64:80] (and
    the job 16 samples a step, not 8). Declared 1=resumes, the resize scenario fails on the trajectory,
    not on where it resumed; resize_rng cannot tell (its streams are set after torch.load returns)."""
    from ckpt_chaos.run.runner import run_scenario

    s = _generated(tmp_path, command_golden_root, ARGV[0], "1=resumes")
    r = run_scenario(s, tmp_path / "runs", command_golden_root)
    c = _checks(r)
    assert r.verdict == "fail", r.checks
    assert c["trajectory"][0] == "fail" and "its one rank trained on 0 of the 8 samples golden rank 0 trained" in \
        c["trajectory"][1], c["trajectory"]
    v, detail = c["resumed_newest@1"]
    assert v == "pass" and "step_00000004.pt, the newest complete checkpoint" in detail, detail
    v, detail = c["resize_rng@step_00000004.pt"]
    assert v == "unknown" and "taken as torch.load returned" in detail, detail
    assert "resize_refused@1" not in c
    log = (Path(r.run_dir) / "torchrun.log").read_text()  # the trainer's own word on the relaunch
    assert "--nproc_per_node=1" in log and "rank 0: resumed from step_00000004.pt at step 4" in log


@pytest.mark.slow
@pytest.mark.nightly  # make test: the generation and check units above; the run is an ordinary scenario's
def test_a_copy_that_refuses_a_resize_passes_and_plain_ddp_is_caught_resuming(tmp_path, command_golden_root):
    """A copy of examples/plain_ddp/train.py that exits non-zero where the checkpoint's RNG list
    (one per saving rank) is not its world size, before training: declared 1=refused, launch 1 on one
    rank exits without a step or a write, launch 2 on two resumes from step_00000004.pt bit for bit
    (as the kill family's scenario does): pass. plain_ddp itself resumes on one rank and trains on
    (exit 0): the same scenario fails on resize_refused@1."""
    from ckpt_chaos.run.runner import run_scenario

    text = (REPO / ARGV[0]).read_text()
    old = "        state = torch.load(last, weights_only=False)\n"
    assert text.count(old) == 1, "the example changed: update the copy"
    copy = tmp_path / "train.py"
    copy.write_text(text.replace(old, old + '        if len(state["rng"]) != world:\n'
                                            '            raise SystemExit(f"{last.name} was saved by '
                                            '{len(state[\'rng\'])} ranks, not {world}: not resuming")\n'))
    s = _generated(tmp_path / "copy", command_golden_root, str(copy), "1=refused")
    r = run_scenario(s, tmp_path / "runs", command_golden_root)
    c = _checks(r)
    assert r.verdict == "pass", r.checks
    assert c["resize_refused@1"][0] == "pass" and "without training a step" in c["resize_refused@1"][1]
    assert c["trajectory"][0] == "pass" and "bit for bit" in c["trajectory"][1]
    log = (Path(r.run_dir) / "torchrun.log").read_text()
    assert "step_00000004.pt was saved by 2 ranks, not 1: not resuming" in log and \
        log.count("resumed from step_00000004.pt at step 4") == 2  # launch 2's two ranks

    s = dataclasses.replace(s, command=dataclasses.replace(s.command, argv=[ARGV[0], *s.command.argv[1:]],
                                                           key=[ARGV[0]]))
    r = run_scenario(s, tmp_path / "runs-plain", command_golden_root)
    v, detail = _checks(r)["resize_refused@1"]
    assert r.verdict == "fail" and v == "fail", r.checks
    assert "but it exited with status 0; it trained steps 5 to 12" in detail, detail
