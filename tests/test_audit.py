"""``ckpt-chaos audit``: the profile read from a golden run's records, the scenarios generated from it,
the command line's bad input; end to end on the plain DDP example (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from ckpt_chaos.audit.discover import DiscoveryError, Profile, describe, discover
from ckpt_chaos.audit import DEFAULT_FAMILIES, FAMILIES
from ckpt_chaos.audit.generate import _reports_at_half, check, generate, write
from ckpt_chaos.probe.run_files import FILES, GOLDEN, LISTING, PROBE_LOG, TRAJECTORY
from ckpt_chaos.scenario import from_dict
from tests.helpers import REPO

# what the probe layer arms in a torch trainer (its probe.armed event)
POINTS = ["ckpt.metadata", "ckpt.shard.done", "ckpt.shard.write", "ckpt.stage", "file.copy", "file.done", "file.fsync",
          "file.read", "file.remove", "file.rename", "file.rmtree", "file.write", "load.begin", "load.end",
          "microstep.end", "step.begin", "step.end"]
ARGV = ["examples/plain_ddp/train.py", "--ckpt-dir", "{ckpt_dir}", "--steps", "12", "--save-every", "4"]


class Records:
    """A golden run's records in the format run/command.py keeps them: probe events of two ranks
    (steps, and the file points of the probe layer), fanotify's file events, the final listing."""

    def __init__(self, steps: int = 12):
        self.events: list[dict] = []
        self.files: list[dict] = []
        self.steps = steps
        self.t = 1000.0
        self.seq = {0: 0, 1: 0}

    def point(self, rank: int, point: str, **info) -> None:
        self.t += 0.01
        self.seq[rank] += 1
        self.events.append({"rank": rank, "role": "rank", "pid": 100 + rank, "seq": self.seq[rank], "attempt": 0,
                            "restart": 0, "point": point, "t": self.t, "info": info, "received": self.t})

    def fanotify(self, rank: int, op: str, path: str, **more) -> None:
        self.t += 0.01
        self.files.append({"t": self.t, "launch": 0, "pid": 100 + rank, "rank": rank, "job": True, "op": op,
                           "path": path, "dir": False, "source": "fanotify", **more})

    def step(self, s: int) -> None:
        for r in (0, 1):
            self.point(r, "step.begin", step=s)
            self.point(r, "step.end", step=s)

    def write(self, folder: Path, listing: dict[str, int], world: int = 2) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        armed = {"armed": ["files", "torch.optim", "torch.save", "torch.load"], "points": POINTS}
        head = [{"rank": r, "point": "probe.armed", "t": 999.0, "info": armed} for r in range(world)]
        (folder / PROBE_LOG).write_text("".join(json.dumps(e) + "\n" for e in head + self.events))
        (folder / FILES).write_text("".join(json.dumps(e) + "\n" for e in self.files))
        (folder / LISTING).write_text(json.dumps(listing))
        (folder / TRAJECTORY).write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, self.steps + 1)))
        command = {"argv": ARGV, "launcher": "torchrun", "relaunch_argv": [], "ckpt_dir": "checkpoints",
                   "key": ["examples/plain_ddp/train.py"], "env": {}, "complete": "*"}
        (folder / GOLDEN).write_text(json.dumps({"command": command, "world_size": world}))
        return folder


def plain_ddp(tmp_path: Path) -> Path:
    """plain_ddp/train.py's saves, as its golden run records them: rank 0 torch.saves step_N.pt.tmp,
    fsyncs it, renames it, fsyncs the folder; the newest 2 kept."""
    r = Records()
    for s in range(1, 13):
        r.step(s)
        if s % 4 == 0:
            tmp, final = f"checkpoints/step_{s:08d}.pt.tmp", f"checkpoints/step_{s:08d}.pt"
            r.point(0, "ckpt.stage", name=tmp.split("/")[1], path=tmp, via="torch.save")
            r.fanotify(0, "create", tmp)
            r.fanotify(0, "close", tmp, wrote=True, size=23149)
            r.point(0, "file.done", path=tmp, bytes=23149, via="torch.save")
            r.point(0, "file.fsync", path=tmp, call="fsync")
            r.point(0, "file.rename", path=final, src=tmp, call="replace")
            r.fanotify(0, "rename", final, src=tmp)
            r.point(0, "file.fsync", path="checkpoints", call="fsync")
            if s == 12:
                r.point(0, "file.remove", path="checkpoints/step_00000004.pt", call="remove")
    return r.write(tmp_path / "golden", {"checkpoints/step_00000008.pt": 23149, "checkpoints/step_00000012.pt": 23149})


def pointer_trainer(tmp_path: Path) -> Path:
    """A DeepSpeed-style save: global_stepN/ with a native writer's model.safetensors (fanotify only:
    Python never sees its bytes) and Python's state.json, then latest.tmp renamed to latest."""
    r = Records()
    for s in range(1, 13):
        r.step(s)
        if s % 4 == 0:
            d = f"checkpoints/global_step{s}"
            r.fanotify(0, "create", f"{d}/.tmpAbCdEf")
            r.fanotify(0, "rename", f"{d}/model.safetensors", src=f"{d}/.tmpAbCdEf")
            r.fanotify(0, "close", f"{d}/model.safetensors", wrote=True, size=75692)
            r.point(0, "file.done", path=f"{d}/state.json", bytes=43411, via="open")
            r.point(0, "file.fsync", path=d, call="fsync")
            r.point(0, "file.fsync", path="checkpoints", call="fsync")
            name = f"global_step{s}"
            r.point(0, "file.done", path="checkpoints/latest.tmp", bytes=len(name), via="open")
            r.point(0, "file.rename", path="checkpoints/latest", src="checkpoints/latest.tmp", call="replace")
            r.point(0, "file.fsync", path="checkpoints", call="fsync")
    return r.write(tmp_path / "golden", {"checkpoints/latest": 13, "checkpoints/global_step4/state.json": 1,
                                         "checkpoints/global_step8/state.json": 1,
                                         "checkpoints/global_step12/state.json": 1})


# ---- discovery ------------------------------------------------------------------------------------

def test_profile_of_a_rename_and_fsync_trainer(tmp_path):
    p = discover(plain_ddp(tmp_path))
    assert [s.step for s in p.saves] == [4, 8, 12]
    assert p.save_every == 4 and p.complete == "step_*.pt" and p.keep_last == 2
    f = p.saves[1].files[0]
    assert f.names == ["checkpoints/step_00000008.pt.tmp", "checkpoints/step_00000008.pt"]
    assert (f.writer, f.commit, f.fsynced, f.point) == ("torch.save", "rename", True, "file.write")
    assert p.saves[1].commit == "rename" and p.saves[1].ranks == [0]
    assert p.saves[1].fsynced == ["checkpoints/step_00000008.pt.tmp", "checkpoints"]
    # the last event before the rename is the temporary file's fsync; the save ends with the folder's 2nd fsync
    assert p.saves[1].marks["before_commit"] == {"point": "file.fsync", "rank": 0,
                                                 "path": "checkpoints/step_00000008.pt.tmp"}
    assert p.saves[1].marks["end"] == {"point": "file.fsync", "rank": 0, "path": "checkpoints", "nth": 2}
    assert "glob" in p.why["complete"] and "2 left" in p.why["retention"]
    assert Profile.from_dict(json.loads(p.to_json())) == p


def test_profile_of_a_pointer_and_native_writer(tmp_path):
    p = discover(pointer_trainer(tmp_path))
    assert p.complete == {"pointer": "latest"}
    s = p.saves[1]
    assert s.entry == "global_step8" and s.pointer == "checkpoints/latest"
    native = next(f for f in s.files if f.final.endswith("model.safetensors"))
    assert (native.writer, native.point) == ("native", "faultfs.write")
    # renamed before it was closed, as safetensors' writer does: followed from the name it was opened under
    assert native.names == ["checkpoints/global_step8/.tmpAbCdEf", "checkpoints/global_step8/model.safetensors"]
    assert native.commit == "rename"
    # between the data and the pointer: the checkpoint folder's fsync that precedes latest.tmp
    assert s.marks["before_commit"] == {"point": "file.fsync", "rank": 0, "path": "checkpoints", "nth": 3}
    assert s.marks["commit"] == {"point": "file.rename", "rank": 0, "path": "checkpoints/latest", "nth": 2}


def test_a_pointer_holding_the_step_number_gets_its_format(tmp_path):
    r = Records()
    for s in range(1, 9):
        r.step(s)
        if s % 4 == 0:
            r.point(0, "file.done", path=f"checkpoints/iter_{s:07d}/model.pt", bytes=100, via="torch.save")
            r.point(0, "file.done", path="checkpoints/latest_checkpointed_iteration.txt", bytes=len(str(s)), via="open")
    p = discover(r.write(tmp_path / "g", {}))
    assert p.complete == {"pointer": "latest_checkpointed_iteration.txt", "format": "iter_{:07d}"}


def test_no_complete_rule_names_what_it_saw_and_the_key(tmp_path):
    r = Records()
    for s in range(1, 9):
        r.step(s)
        if s % 4 == 0:
            r.point(0, "file.done", path=f"checkpoints/ckpt-{'ab'[s // 4 - 1]}.pt", bytes=100, via="torch.save")
    p = discover(r.write(tmp_path / "g", {}))
    assert p.complete is None
    assert "ckpt-a.pt" in p.problems[0] and "declare complete" in p.problems[0]
    with pytest.raises(ValueError, match="no complete rule"):
        generate(p)
    # declared, it is taken as given
    assert discover(tmp_path / "g", {"complete": "ckpt-*.pt"}).complete == "ckpt-*.pt"


def test_a_trainer_that_writes_nothing_under_ckpt_dir(tmp_path):
    r = Records()
    for s in range(1, 5):
        r.step(s)
    r.point(0, "file.done", path="/tmp/elsewhere.pt", bytes=10, via="torch.save")
    with pytest.raises(DiscoveryError, match=r"wrote nothing under \{ckpt_dir\}.*--ckpt-dir \{ckpt_dir\}"):
        discover(r.write(tmp_path / "g", {}))


# ---- generation -------------------------------------------------------------------------------------

def _tables(g) -> dict:
    return tomllib.loads(g.text)


def test_generated_scenarios_aim_at_the_discovered_points(tmp_path):
    p = discover(plain_ddp(tmp_path))
    gen = {g.name: g for g in generate(p, FAMILIES)}
    assert {g.family for g in gen.values()} == set(FAMILIES)
    assert "corrupt" not in {g.family for g in generate(p)} and set(DEFAULT_FAMILIES) < set(FAMILIES)
    mid = _tables(gen["plain-ddp-train--mid-write--kill-at-half-step-pt"])
    assert mid["faults"] == [{"kind": "kill", "target": "rank:0", "when": {
        "point": "file.write", "rank": 0, "path": "checkpoints/step_00000008.pt", "min_fraction": 0.5}}]
    assert mid["command"]["complete"] == "step_*.pt" and mid["command"]["save_every"] == 4
    assert mid["command"]["keep_last"] == 2
    commit = _tables(gen["plain-ddp-train--commit--kill-before-commit"])["faults"][0]
    assert commit["when"] == {"point": "file.fsync", "rank": 0, "path": "checkpoints/step_00000008.pt.tmp"}
    modes = [_tables(g)["faults"][0] for g in gen.values() if g.family == "power-loss"]
    assert [(f["mode"], f["when"].get("nth")) for f in modes] == [("undo", 2), ("entries-kept", 2),
                                                                   ("entries-kept", None)]
    assert modes[2]["when"] == {"point": "file.rename", "rank": 0, "path": "checkpoints/step_00000008.pt"}
    load = _tables(gen["plain-ddp-train--load--kill-relaunch-load"])
    assert load["faults"][1] == {"kind": "kill", "target": "rank:0", "attempt": 1,
                                 "when": {"point": "load.begin", "rank": 0}}
    assert load["recovery"] == {"max_restarts": 2}
    fsync = _tables(gen["plain-ddp-train--errno--eio-on-fsync-step-00000008-pt"])["faults"][0]
    assert (fsync["call"], fsync["path"]) == ("fsync", "step_00000008.pt.*")
    disk = _tables(gen["plain-ddp-train--disk-full--disk-full-save-start"])
    assert disk["storage"] == {"fs": "tmpfs", "size_mb": 16}
    inodes = _tables(gen["plain-ddp-train--disk-full--inodes-full-save-start"])
    assert inodes["faults"] == [{"kind": "inodes_full", "when": {"point": "step.end", "rank": 0, "step": 8}}]
    assert inodes["storage"] == disk["storage"]
    # a checkpoint that is one file has no folder for corrupt to damage: left out, saying why
    assert "single files" in gen["plain-ddp-train--corrupt--truncate-newest-checkpoint"].left_out
    # between saves 1 and 2, so that the resume is from save 1
    kill = _tables(gen["plain-ddp-train--kill--sigkill-all-step-7"])["faults"][0]
    assert kill["when"] == {"point": "step.begin", "rank": 0, "step": 7}
    for g in gen.values():
        assert g.left_out or g.text.startswith("# ckpt-chaos audit: ")


def test_a_file_staged_outside_the_checkpoint_folder_is_aimed_at_by_its_name_inside(tmp_path):
    # fsspec's way (Lightning Fabric's fabric.save): the bytes go to a mkstemp file in TMPDIR, moved into
    # the checkpoint folder by a rename (a copy across file systems); nothing is fsynced
    r = Records()
    for s in range(1, 13):
        r.step(s)
        if s % 4 == 0:
            tmp, final = f"tmp/tmpq{s}x7f", f"checkpoints/step_{s}.ckpt"
            r.point(0, "file.done", path=tmp, bytes=22704, via="open")
            r.point(0, "file.rename", path=final, src=tmp, call="move")
    p = discover(r.write(tmp_path / "golden", {f"checkpoints/step_{s}.ckpt": 22704 for s in (4, 8, 12)}))
    assert p.saves[1].commit == "rename" and p.complete == "step_*.ckpt"
    gen = {g.name: g for g in generate(p, FAMILIES)}
    write = _tables(gen["plain-ddp-train--errno--eio-on-write-step-8-ckpt"])["faults"][0]
    assert write["path"] == "step_8.ckpt", write
    assert "never fsynced" in gen["plain-ddp-train--errno--eio-on-fsync-step-8-ckpt"].left_out
    commit = gen["plain-ddp-train--commit--kill-before-commit"].left_out
    assert commit.startswith("save 2 (after step 8, step_8.ckpt) commits by rename, but no event of its data in the "
                             "checkpoint folder") and "written elsewhere, tmp, and moved in" in commit, commit
    # power loss mounts faultfs on the folder, which makes the move a copy: aimed at the next step's start
    cuts = [_tables(g)["faults"][0] for g in gen.values() if g.family == "power-loss" and not g.left_out]
    assert [(f["mode"], f["when"]) for f in cuts] == [(m, {"point": "step.begin", "rank": 0, "step": 9})
                                                      for m in ("undo", "entries-kept")]
    assert "the move is a copy" in gen["plain-ddp-train--power-loss--power-loss-entries-kept-commit"].left_out


def test_generated_scenarios_load_and_are_the_same_each_time(tmp_path):
    golden = plain_ddp(tmp_path)
    first = check(generate(discover(golden)), tmp_path / "s")
    again = generate(discover(golden))
    assert [(g.name, g.text) for g in first] == [(g.name, g.text) for g in again]
    for g in first:
        if g.text:
            s = from_dict(tomllib.loads(g.text), g.name, g.name)  # ckpt-chaos run's own checks
            assert s.command.argv == ARGV and s.suites[0] == "audit"
    written = write(first, tmp_path / "s")
    assert sorted(p.stem for p in written) == sorted(g.name for g in first if not g.left_out)
    # an earlier audit's file that is no longer generated goes; a file of the user's stays
    (tmp_path / "s" / "mine.toml").write_text("description = 'mine'\n")
    (tmp_path / "s" / "stale.toml").write_text("# ckpt-chaos audit: old\n")
    write(first, tmp_path / "s")
    assert (tmp_path / "s" / "mine.toml").exists() and not (tmp_path / "s" / "stale.toml").exists()


def test_native_and_pointer_files_get_their_own_points(tmp_path):
    gen = {g.name: _tables(g) for g in generate(discover(pointer_trainer(tmp_path)), FAMILIES)}
    native = gen["plain-ddp-train--mid-write--kill-at-half-global-step-model-safetensors"]["faults"][0]
    assert native["when"]["point"] == "faultfs.write"
    python = gen["plain-ddp-train--mid-write--kill-at-half-global-step-state-json"]["faults"][0]
    assert python["when"]["point"] == "file.write"
    ptr = gen["plain-ddp-train--mid-write--kill-at-half-latest"]["faults"][0]["when"]
    # 12 bytes: 6 reports at half or more in each save; the 2nd save's first is the 7th
    assert ptr == {"point": "file.write", "rank": 0, "path": "checkpoints/latest", "min_fraction": 0.5, "nth": 7}
    assert "keep_last" not in gen["plain-ddp-train--kill--sigkill-all-step-7"]["command"]  # a pointer: no set kept
    corrupt = gen["plain-ddp-train--corrupt--truncate-newest-checkpoint"]["faults"][0]
    assert (corrupt["checkpoint"], corrupt["file"]) == ("global_step4", "model.safetensors")
    load = gen["plain-ddp-train--load--kill-relaunch-load"]["faults"][1]["when"]
    assert load == {"point": "faultfs.open", "rank": 0, "path": "checkpoints/global_step4/model.safetensors"}


def test_reports_at_half_follow_the_probe_layers_tenths():
    # a write is reported at each tenth of the file, rounded up, at least a byte apart
    assert _reports_at_half(24) == 6
    assert _reports_at_half(1000) == 6
    assert _reports_at_half(3) == 2  # bytes 1, 2, 3: 2 and 3 are half or more


def test_describe_names_every_file_and_inference(tmp_path):
    text = "\n".join(describe(discover(plain_ddp(tmp_path))))
    assert "checkpoints/step_00000008.pt.tmp -> checkpoints/step_00000008.pt" in text
    assert "cadence: every 4 steps" in text and "complete: 'step_*.pt'" in text


# ---- the command line ---------------------------------------------------------------------------------

def audit(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckpt_chaos.cli", "audit", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture
def cli(monkeypatch, capsys):
    """``ckpt-chaos audit ARGS`` in this process, from a folder: its exit status and stderr."""
    from ckpt_chaos.cli import main
    from ckpt_chaos.subcommands.common import project

    def run(*args: str, cwd: Path) -> tuple[int, str]:
        monkeypatch.chdir(cwd)
        project.cache_clear()  # the project's settings are read once a process, from where it runs
        try:
            code = main(["audit", *args])
        finally:
            project.cache_clear()
        return code, capsys.readouterr().err

    return run


def test_cli_without_a_command_says_how_to_give_one(tmp_path, cli):
    code, err = cli(cwd=tmp_path)
    assert code == 2
    assert "give its command after --" in err and "[tool.ckpt-chaos.audit]" in err


def test_cli_command_without_ckpt_dir(tmp_path, cli):
    code, err = cli("--", "train.py", "--steps", "3", cwd=tmp_path)
    assert code == 2 and "does not name {ckpt_dir}" in err and "--ckpt-dir {ckpt_dir}" in err


def test_cli_bad_placeholder_and_family_name_the_key(tmp_path, cli):
    code, err = cli("--", "train.py", "{ckpt_dir}", "{nope}", cwd=tmp_path)
    assert code == 2 and "command.argv" in err and "{nope}" in err
    code, err = cli("--families", "kill,bogus", "--", "train.py", "{ckpt_dir}", cwd=tmp_path)
    assert code == 2 and "--families bogus: unknown family" in err


def test_pyproject_table_is_read_and_checked(tmp_path, cli):
    (tmp_path / "pyproject.toml").write_text('[tool.ckpt-chaos.audit]\nargv = ["train.py"]\nnproc = "two"\n')
    code, err = cli(cwd=tmp_path)
    assert code == 2 and "tool.ckpt-chaos.audit.nproc" in err and "nproc = 2" in err
    (tmp_path / "pyproject.toml").write_text('[tool.ckpt-chaos.audit]\nargv = ["train.py"]\nbogus = 1\n')
    code, err = cli(cwd=tmp_path)
    assert code == 2 and "tool.ckpt-chaos.audit.bogus: unknown key" in err
    # the table's command is the one audited: here it names no {ckpt_dir}, and the message names the file
    (tmp_path / "pyproject.toml").write_text('[tool.ckpt-chaos.audit]\nargv = ["train.py", "--steps", "3"]\n')
    code, err = cli(cwd=tmp_path)
    assert code == 2 and "pyproject.toml [tool.ckpt-chaos.audit]" in err and "{ckpt_dir}" in err


def test_cli_a_command_that_fails_its_fault_free_run(tmp_path, cli):
    script = tmp_path / "broken.py"
    script.write_text("import sys\nprint('broken trainer: no such dataset', flush=True)\nsys.exit(3)\n")
    code, err = cli("--launcher", "self", "--golden-dir", str(tmp_path / "golden"), "--out", str(tmp_path / "out"),
                    "--", "{python}", str(script), "{ckpt_dir}", cwd=tmp_path)
    assert code == 2, err
    assert "fault-free run failed (exit 3)" in err and "broken trainer: no such dataset" in err


# ---- end to end -----------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.nightly  # make test: the discovery and generation units above, from plain_ddp's records
def test_discover_only_on_plain_ddp(tmp_path, command_golden_root):
    p = audit("--discover-only", "--json", "--golden-dir", str(command_golden_root), "--out", str(tmp_path), "--",
              *ARGV)
    assert p.returncode == 0, p.stderr
    profile = json.loads(p.stdout)
    assert profile["save_every"] == 4 and profile["complete"] == "step_*.pt" and profile["keep_last"] == 2
    assert [s["step"] for s in profile["saves"]] == [4, 8, 12]
    f = profile["saves"][1]["files"][0]
    assert f["names"] == ["checkpoints/step_00000008.pt.tmp", "checkpoints/step_00000008.pt"]
    assert f["writer"] == "torch.save" and f["fsynced"]
    assert "commit rename" in p.stderr
    # the stop-and-relaunch run: killed as step 7 began, the relaunch read step_4 and went on from it
    r = profile["relaunch"]
    assert (r["decided"], r["resumed_from"], r["first_step"]) == (True, "checkpoints/step_00000004.pt", 5), r
    assert r["reads"][:1] == ["checkpoints/step_00000004.pt"], r
    assert "relaunch after a stop: resumed from checkpoints/step_00000004.pt" in p.stderr


@pytest.mark.slow
@pytest.mark.nightly  # make test: the generation units above; the examples' hand-written suite runs these faults
def test_small_audit_of_plain_ddp(tmp_path, command_golden_root):
    """Two families whose verdicts the trainer's code decides: a kill between saves resumes from
    step_4 and trains on bit for bit (the checkpoint holds every rank's RNG and the data position);
    a kill before the rename leaves only step_00000008.pt.tmp, which step_*.pt does not match."""
    p = audit("--families", "kill,commit", "--golden-dir", str(command_golden_root), "--out", str(tmp_path),
              "--json", "--", *ARGV)
    assert p.returncode == 0, p.stderr[-3000:]
    cells = json.loads(p.stdout)["cells"]
    assert {(c["fault"], c["verdict"]) for c in cells} == {("SIGKILL all", "pass"), ("kill", "pass")}
    assert (tmp_path / "matrix.json").is_file() and (tmp_path / "profile.json").is_file()
    page = next(tmp_path.glob("reports/custom/*/index.html")).read_text()
    assert page.count('<td class="pass"><a href="#') == 2, "the grid's cells open their scenarios' sections"


def test_the_report_of_an_audit_is_headed_by_its_grid(tmp_path):
    from ckpt_chaos.audit.matrix import GRID
    from ckpt_chaos.report import results

    def row(name, verdict):
        return {"scenario": name, "verdict": verdict, "reason": "", "families": ["process"], "kinds": ["kill"],
                "tags": [], "checks": [], "launches": 2, "wall_s": 3.0, "run_dir": ""}

    cells = [{"scenario": "a-kill-mid-write-step", "fault": "kill at half", "point": "step_*.pt", "verdict": "fail",
              "check": "no_torn_read@1", "detail": "it loaded step_8.pt, torn"},
             {"scenario": "a-sigterm-all", "fault": "SIGTERM all", "point": "mid-epoch", "verdict": "pass",
              "check": "", "detail": ""},
             {"scenario": "a-inodes", "fault": "inodes full", "point": "step_*.pt", "verdict": "left out",
              "check": "", "detail": "needs root"}]
    (tmp_path / GRID).write_text(json.dumps({"cells": cells}))
    page = results.write(tmp_path, "custom", [row("a-kill-mid-write-step", "fail"), row("a-sigterm-all", "pass")],
                         wall_s=9.0, plots=False).read_text()
    grid = page[page.index('<table id="audit-grid">'):page.index('<table id="scenarios">')]
    # a row per fault, a column per point; a pair with no scenario is an empty cell
    assert grid.count("<tr>") == 4 and "<th><code>step_*.pt</code></th><th><code>mid-epoch</code></th>" in grid
    assert ('<td class="fail" title="no_torn_read@1: it loaded step_8.pt, torn"><a href="#a-kill-mid-write-step">'
            'fail</a><br><small>no_torn_read@1</small></td><td></td>') in grid
    assert '<td class="skipped" title="needs root">left out</td>' in grid
    (tmp_path / GRID).write_text("{")  # a damaged file costs the grid, not the report
    assert 'id="audit-grid"' not in results.rebuild(tmp_path, plots=False).read_text()


def test_triggers_are_held_to_the_golden_run_they_came_from(tmp_path):
    golden = plain_ddp(tmp_path)
    gen = generate(discover(golden))
    checked = check(gen, tmp_path / "s", golden)
    refused = [g.left_out for g in checked if g.left_out and "refuses" in g.left_out]
    assert refused == []
    # a trigger on a file the golden run never wrote is refused, and said to be the generation's bug
    for g in gen:
        g.text = g.text.replace("checkpoints/step_00000008.pt", "checkpoints/step_00000009.pt")
        g.left_out = None if g.family == "mid-write" else g.left_out
    mid = next(g for g in check(gen, tmp_path / "s", golden) if g.family == "mid-write")
    assert "the harness refuses its trigger" in mid.left_out and "step_00000009.pt" in mid.left_out


def test_a_save_of_several_ranks_ends_at_the_next_step(tmp_path):
    """Where every rank writes its own file, which one finishes last varies from run to run: the power
    is cut as the next optimizer step begins, after the collectives that wait for them all."""
    r = Records()
    for s in range(1, 13):
        r.step(s)
        if s % 4 == 0:
            for rank in (0, 1):
                r.point(rank, "file.done", path=f"checkpoints/step_{s}/rank{rank}.pt", bytes=100, via="torch.save")
    p = discover(r.write(tmp_path / "g", {}))
    assert p.saves[1].ranks == [0, 1] and p.complete == "step_*"
    assert p.saves[1].marks["end"] == {"point": "step.begin", "rank": 0, "step": 9}
    assert p.saves[2].marks["end"]["point"] == "file.done"  # the last save: no next step to wait for
    roles = [f.role for f in p.saves[1].roles]
    assert roles == ["checkpoints/step_*/rank*.pt"]  # one role for both ranks' files: one mid-write kill


# ---- relaunches with an option changed: --change, and the reference trainer's catalogue -----------------

def test_a_change_is_parsed_as_a_toml_value_and_expected_refused_unless_resumable():
    from ckpt_chaos.audit.changes import Change, parse_change

    assert parse_change("seed=7") == Change("seed", 7, True)
    assert parse_change("lr=0.5", ["lr"]) == Change("lr", 0.5, False)
    assert parse_change("fast=true").value is True
    assert parse_change("out=runs/b").value == "runs/b"  # not TOML: the string as given
    assert parse_change("day=2024-01-02").value == "2024-01-02"
    for bad, says in (("seed", "give KEY=VALUE"), ("=7", "give KEY=VALUE"), ("ids=[1, 2]", "is not one value")):
        with pytest.raises(ValueError, match=says):
            parse_change(bad)


def test_change_scenarios_kill_between_saves_and_expect_what_the_user_declares(tmp_path):
    from ckpt_chaos.audit.changes import parse_change
    from ckpt_chaos.run.command import argv

    p = discover(plain_ddp(tmp_path))
    changes = (parse_change("seed=7"), parse_change("save-every=2", ["save-every"]))
    gen = {g.name: g for g in generate(p, ("kill",), changes)}
    refused, accepted = gen["plain-ddp-train--change--seed-7"], gen["plain-ddp-train--change--save-every-2"]
    assert (refused.family, refused.point, refused.fault) == ("change", "relaunch", "seed = 7 refused")
    assert accepted.fault == "save-every = 2 accepted"
    t = _tables(refused)
    assert t["faults"] == [{"kind": "kill", "target": "all", "when": {"point": "step.begin", "rank": 0, "step": 7}}]
    assert t["recovery"] == {"max_restarts": 2, "changes": [{"seed": 7}]} and t["expect"] == {"refused": ["seed"]}
    assert "declares a resume must refuse" in t["description"] and "resume from step_00000004.pt" in t["description"]
    t = _tables(accepted)
    assert t["recovery"]["changes"] == [{"save-every": 2}] and "expect" not in t
    s = from_dict(tomllib.loads(refused.text), "r.toml", "r")  # ckpt-chaos run's own checks
    assert argv(s, Path("/r"), 1, 2)[-1] == "--seed=7" and "--seed=7" not in argv(s, Path("/r"), 2, 2)
    assert "kill" in {g.family for g in gen.values()} and "mid-write" not in {g.family for g in gen.values()}


def test_a_change_with_no_checkpoint_before_it_is_left_out_saying_why(tmp_path):
    from ckpt_chaos.audit.changes import parse_change

    p = discover(plain_ddp(tmp_path))
    p.saves = p.saves[:1]
    (g,) = [g for g in generate(p, (), (parse_change("seed=7"),))]
    assert g.family == "change" and "no checkpoint to resume or to refuse" in g.left_out


def test_cli_change_and_resumable_are_checked_before_anything_runs(tmp_path, cli):
    code, err = cli("--change", "seed", "--", "train.py", "{ckpt_dir}", cwd=tmp_path)
    assert code == 2 and "--change seed: give KEY=VALUE" in err
    code, err = cli("--change", "seed=7", "--resumable", "sed", "--", "train.py", "{ckpt_dir}", cwd=tmp_path)
    assert code == 2 and "--resumable sed: no --change sed=VALUE" in err
    (tmp_path / "pyproject.toml").write_text('[tool.ckpt-chaos.audit]\nargv = ["train.py", "{ckpt_dir}"]\n'
                                             'changes = "seed=7 lr"\n')
    code, err = cli(cwd=tmp_path)
    assert code == 2 and "--change lr: give KEY=VALUE" in err


def test_the_catalogue_s_relaunch_changes_are_what_the_reference_trainer_declares():
    """One scenario per field the reference declares, written by the audit's generator: a field added to
    its configuration, or moved in or out of RESUMABLE_CHANGES, fails here until the files are written again."""
    import dataclasses

    from ckpt_chaos.audit.changes import GENERATED, reference_files, reference_folder
    from ckpt_chaos.check.promises import UNCHANGEABLE
    from ckpt_chaos.scenario import load
    from reference_trainer.config import RESUMABLE_CHANGES, TrainConfig

    want = reference_files()
    folder = reference_folder()
    have = {p.name: p.read_text() for p in folder.glob("relaunch-with-changed-*.toml")
            if p.read_text().startswith(GENERATED)}
    assert have == want, ("the catalogue's relaunch-change scenarios differ from the reference trainer's declaration: "
                          "write them again with python -m ckpt_chaos.audit.changes "
                          f"(differ: {sorted(set(have) ^ set(want)) or [n for n in want if have[n] != want[n]]})")
    fields = {f.name for f in dataclasses.fields(TrainConfig)} - set(UNCHANGEABLE)
    by_field = {}
    for name in want:
        s = load(folder / name)
        (change,) = s.recovery.changes
        (key,) = change
        by_field[key] = s
        assert s.expect.refused == ([] if key in RESUMABLE_CHANGES else [key]), name
        assert ("default" in s.suites) == (key == "seed"), name
    assert set(by_field) == fields
