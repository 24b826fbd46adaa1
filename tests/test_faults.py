"""The fault registry's contract (ckpt_chaos/faults/): every kind defined once and completely, looked up by
name everywhere, and the catalogue's scenarios unchanged by it (no processes)."""

from __future__ import annotations

import dataclasses
import re
import sys
import textwrap
import tomllib

import pytest

from ckpt_chaos import faults
from ckpt_chaos.config import builtin_scenarios
from ckpt_chaos.faults import (KINDS, FaultKind, Nemesis, families, kind_modules, lookup, nemesis_classes,
                               register)
from ckpt_chaos.scenario import FAMILIES, FAULT_KINDS, Fault, ScenarioError, Trigger, catalogue, from_dict

CATALOGUE = catalogue(builtin_scenarios())


@pytest.mark.parametrize("kind", list(KINDS.values()), ids=list(KINDS))
def test_every_kind_is_defined_completely(kind: FaultKind):
    assert kind.doc and "\n" not in kind.doc and not kind.doc.endswith(".")
    assert kind.family in families()
    assert re.fullmatch(r"#[0-9a-f]{6}", kind.colour)
    assert dataclasses.is_dataclass(kind.params)
    defaults = kind.params()  # every parameter has a default
    assert [f.name for f in dataclasses.fields(defaults)] == list(kind.keys)
    if kind.heals:  # a heal is every nemesis lifting what it injected
        assert kind.nemesis is None and kind.action is None
    else:
        assert issubclass(kind.nemesis, Nemesis) and callable(kind.action)
        assert kind.action.__qualname__.startswith(kind.nemesis.__name__ + ".")
    # defined in its family's module, with its nemesis
    module = kind.validate.__module__ if kind.validate else (kind.nemesis or Nemesis).__module__
    assert module.startswith("ckpt_chaos.faults.")
    assert kind in getattr(faults, module.rsplit(".", 1)[1]).KINDS


def test_each_parameter_is_commented_where_it_is_defined():
    """One field per key, with its default and a comment saying what it means."""
    import inspect

    for kind in KINDS.values():
        if not kind.keys:
            continue
        source = inspect.getsource(kind.params)
        for key in kind.keys:
            line = next(line for line in source.splitlines() if line.strip().startswith(f"{key}:"))
            assert "=" in line and "#" in line, f"{kind.name}.{key}: {line}"


def test_the_names_the_cli_and_the_plugin_import_keep_their_shape():
    assert FAMILIES == families() == ["network", "node", "process", "remote", "scheduler", "storage"]
    assert list(FAULT_KINDS)[:4] == ["kill", "term", "stop", "raise"]
    assert all(FAULT_KINDS[k] == (KINDS[k].family, KINDS[k].doc) for k in KINDS)
    # one nemesis per family module, composed in the order of the modules (a kind's own module comes after)
    assert [c.__module__.rsplit(".", 1)[1] for c in nemesis_classes()][:5] == ["process", "cluster", "storage",
                                                                               "remote", "slurm"]


DROPPED = textwrap.dedent('''
    from ckpt_chaos.faults.kind import FaultKind, Nemesis, NoParams
    from ckpt_chaos.faults.search_rules import Rule, SearchRule


    class DroppedNemesis(Nemesis):
        def drop(self, fault, event, record):
            record["dropped"] = True


    def _drop(s, delay):
        if s.can() and (when := s.at("step.begin", 0, delay)):
            s.add("dropped", when)


    KINDS = (FaultKind(name="dropped", family="storage", doc="a kind in a module nobody imports by name",
                       params=NoParams, nemesis=DroppedNemesis, action=DroppedNemesis.drop, colour="#123456",
                       coverage={"fault_dropped_seen": lambda s, f: True},
                       search=SearchRule(rules=(Rule("dropped", "storage", {"delay": range(2)}, _drop),))),)
''')


@pytest.fixture
def dropped(tmp_path, monkeypatch):
    """A module ``zz_dropped`` with one kind, dropped into the package's folder (a folder added to its
    ``__path__``, as the package sees its own), beside a module without kinds; the registry restored after."""
    (tmp_path / "zz_dropped.py").write_text(DROPPED)
    (tmp_path / "zz_helper.py").write_text("VALUE = 1  # a module of the package that defines no kind\n")
    monkeypatch.setattr(faults, "__path__", [*faults.__path__, str(tmp_path)])
    saved = dict(KINDS)
    yield
    KINDS.clear()
    KINDS.update(saved)
    for name in ("ckpt_chaos.faults.zz_dropped", "ckpt_chaos.faults.zz_helper"):
        sys.modules.pop(name, None)


def test_a_kind_module_dropped_in_the_package_is_found_and_registered(dropped):
    """Adding a kind edits no other module: every module of ``ckpt_chaos.faults`` whose ``KINDS`` is a
    tuple of kinds is found (pkgutil) and registered, the family modules first, in their ``ORDER``."""
    names = [m.__name__.rsplit(".", 1)[1] for m in kind_modules()]
    assert names[:5] == ["process", "cluster", "storage", "remote", "slurm"] and names[-1] == "zz_dropped"
    assert not {"zz_helper", "kind", "registry", "search_rules", "targets"} & set(names)
    register(kind_modules())
    kind = lookup("dropped")
    assert list(KINDS)[-1] == "dropped" and kind.nemesis.__module__ == "ckpt_chaos.faults.zz_dropped"
    assert kind.nemesis in nemesis_classes() and "storage" in families()
    register(kind_modules())  # registering again is no redefinition
    twin = dataclasses.replace(kind, doc="another kind of the same name")
    with pytest.raises(ValueError, match="fault kind 'dropped' is defined in x and elsewhere"):
        register([_module("x", (twin,))])


def _module(name, kinds):
    module = type(sys)(name)
    module.KINDS = kinds
    return module


def test_the_search_and_the_coverage_take_a_dropped_kind_from_its_module(dropped, monkeypatch):
    """Its search rule becomes a rule of the search's state machine for its family, and the coverage
    report counts the kind and its checks, with no list of kind names anywhere."""
    pytest.importorskip("hypothesis")
    from ckpt_chaos.check import coverage
    from ckpt_chaos.search import machine, schedule

    register(kind_modules())
    monkeypatch.setattr(machine, "_MACHINES", {})
    assert ("dropped", "dropped") in [(k.name, r.name) for k, r in schedule.rules()]
    assert hasattr(machine.machine_for(["storage"]), "dropped")
    assert ("kind", "dropped") in coverage.universe([])
    assert coverage.kind_checks()["dropped"] == {"fault_dropped_seen"}
    assert coverage.emitted_checks()["fault_dropped_seen"] == ["kind dropped"]


def test_an_unknown_kind_is_refused_with_the_kinds_there_are():
    with pytest.raises(ValueError, match="unknown fault kind 'explode'; allowed kinds: kill, term"):
        lookup("explode")
    with pytest.raises(ValueError, match="unknown fault kind"):
        Fault(kind="explode", when=Trigger(point="step.end"))


def test_faults_are_built_in_python_with_their_kinds_keys():
    f = Fault(kind="errno", when=Trigger(point="ckpt.stage"), call="fsync", errno="ENOSPC")
    assert (f.params.call, f.params.errno, f.params.count) == ("fsync", "ENOSPC", 1)
    assert f.keys() == {"call": "fsync", "errno": "ENOSPC"}  # what differs from the defaults
    assert f == Fault(kind="errno", when=Trigger(point="ckpt.stage"), params=f.params)
    with pytest.raises(TypeError, match="fault kind 'errno' takes call, errno, path.*not 'grace_s'"):
        Fault(kind="errno", when=Trigger(point="ckpt.stage"), grace_s=3)
    with pytest.raises(TypeError, match="fault kind 'kill' takes no keys of its own, not 'call'"):
        Fault(kind="kill", when=Trigger(point="ckpt.stage"), call="fsync")
    with pytest.raises(TypeError, match="not both"):
        Fault(kind="term", when=Trigger(point="ckpt.stage"), params=f.params)


def test_a_copy_of_a_fault_does_not_share_its_parameters():
    f = Fault(kind="slow", when=Trigger(point="step.begin"), latency_ms=5.0)
    g = dataclasses.replace(f, params=dataclasses.replace(f.params, path="x"))
    assert f.params.path == "*" and g.params.path == "x"


@pytest.mark.parametrize("s", CATALOGUE, ids=[s.name for s in CATALOGUE])
def test_every_catalogue_scenario_loads_and_round_trips(s):
    text = s.to_toml()
    again = from_dict(tomllib.loads(text), "round-trip", s.name)
    assert again.to_toml() == text and again.faults == s.faults
    for f in s.faults:  # the file's keys are the kind's keys, and the kind knows its family
        raw = tomllib.loads(text)["faults"][s.faults.index(f)]
        assert set(raw) - {"kind", "when", "target", "attempt"} <= set(f.spec.keys)
        assert f.family == KINDS[f.kind].family


def test_the_properties_the_checks_and_the_search_go_by():
    """What used to be kind-name tuples in checker.py and explore.py, now facts of each kind: those of
    the five family modules' kinds (a kind added in a module of its own is held to its facts by its
    own test, so that adding it edits no other file)."""
    families_kinds = {k.name: k for m in (faults.process, faults.cluster, faults.storage, faults.remote,
                                          faults.slurm) for k in m.KINDS}

    def having(prop):
        return {name for name, k in families_kinds.items() if getattr(k, prop)}

    # after these the trainer may keep training: whether it stops is its policy
    assert set(families_kinds) - having("ends_launch") == {"disk_full", "errno", "slow", "corrupt", "corrupt_remote", "toxic",
                                                  "heal"}
    assert having("crashes") >= {"kill", "stop", "power_loss"}
    assert having("fails_saves") == {"errno", "disk_full"} and having("fills_disk") == {"disk_full"}
    assert having("notice") == {"term", "preempt", "time_limit"} and having("loses_disk") == {"lose_disk"}
    assert having("damages") == {"corrupt", "corrupt_remote"} and having("heals") == {"heal"}
    assert having("healable") == {"partition", "toxic"} and having("uploader") == {"kill"}
    # an uploader killed alone does not end the launch
    assert not Fault(kind="kill", when=Trigger(point="upload.write"), target="uploader").ends_launch
    assert Fault(kind="kill", when=Trigger(point="upload.write"), target="rank:0").ends_launch


def test_a_kinds_effects_are_one_record_and_its_fixed_choices_are_named_literals():
    from typing import Literal, get_origin, get_type_hints

    from ckpt_chaos.faults.kind import Effects, NoParams
    from ckpt_chaos.scenario_model import CHOICE_NAMES

    # built by keyword only: seven strings and types in a row are too easy to swap
    with pytest.raises(TypeError):
        FaultKind("x", "storage", "doc", NoParams, None, None, "#000000")
    assert lookup("kill").effects == Effects(ends_launch=True, crashes=True, kills_target=True, uploader=True)
    assert all(getattr(k, f.name) == getattr(k.effects, f.name) for k in KINDS.values()
               for f in dataclasses.fields(Effects))
    # every parameter with a fixed set of values is a Literal that the loader's messages name
    choices = [(k.name, key, tp) for k in KINDS.values() for key, tp in get_type_hints(k.params).items()
               if get_origin(tp) is Literal]
    assert {key for _, key, _ in choices} >= {"split", "cut", "error", "link", "toxic", "stream", "signal", "call",
                                              "via", "mode", "corruption"}
    assert [c for c in choices if c[2] not in CHOICE_NAMES] == []
    # a fault built in Python meets the same check as a file's
    data = {"world_size": 4, "cluster": {"backend": "netns", "ranks_per_node": 2},
            "trainer": {"max_steps": 8, "ckpt_every_steps": 2},
            "faults": [{"kind": "partition", "target": "node:1", "when": {"point": "step.end"}}]}
    s = from_dict(data, "x.toml", "x")
    s.faults[0].params.split = "quarters"
    from ckpt_chaos.scenario import validate
    with pytest.raises(ScenarioError, match=r"faults\[0\].split: unknown split 'quarters'; allowed: isolate, halves, "
                                            r"store$"):
        validate(s)


def test_a_kinds_own_validation_names_the_file_the_fault_key_and_the_fix():
    data = {"world_size": 2, "trainer": {"max_steps": 8, "ckpt_every_steps": 2},
            "faults": [{"kind": "kill", "when": {"point": "step.end"}},
                       {"kind": "term", "grace_s": 0, "when": {"point": "step.end"}}]}
    with pytest.raises(ScenarioError, match=r"^x.toml: faults\[1\].grace_s: 0; use a positive grace period$"):
        from_dict(data, "x.toml", "x")
    data["faults"][1] = {"kind": "raise", "error": "segfault", "when": {"point": "step.end"}}
    with pytest.raises(ScenarioError, match=r"faults\[1\].error: unknown error 'segfault'; allowed: oom, io, runtime"):
        from_dict(data, "x.toml", "x")
    data["faults"][1] = {"kind": "errno", "call": "fsync", "when": {"point": "step.end"}, "color": "red"}
    with pytest.raises(ScenarioError, match=r"faults\[1\].color: does not apply to kind 'errno'; errno takes call"):
        from_dict(data, "x.toml", "x")
    data["faults"][1] = {"kind": "errno", "count": "all", "when": {"point": "step.end"}}
    with pytest.raises(ScenarioError, match=r"faults\[1\].count: wrong type str"):
        from_dict(data, "x.toml", "x")
    data["faults"][1] = {"kind": "stop", "target": "uploader", "when": {"point": "step.end"}}
    data["remote"] = {}
    with pytest.raises(ScenarioError, match=r"faults\[1\].target: stop does not act on the uploader; use kind = \"kill\""):
        from_dict(data, "x.toml", "x")


def test_requirements_ask_every_family():
    from ckpt_chaos.faults import requirements

    local = next(s for s in CATALOGUE if s.name == "kill-rank1-mid-shard-write")
    assert requirements(local) is None  # signals to our own children always work


@pytest.mark.slow
@pytest.mark.nightly
def test_a_kind_added_in_its_family_module_runs_end_to_end(tmp_path):
    """``interrupt`` was added to faults/process.py alone (with its scenario and this test): the loader,
    the runner's dispatch, the checks and the report take it from the registry."""
    from ckpt_chaos.check.history import FaultFired, of, read_history
    from ckpt_chaos.run.runner import run_scenario

    s = next(s for s in catalogue(builtin_scenarios()) if s.name == "interrupt-rank0-mid-step")
    assert s.kinds == ["interrupt"] and "interrupt" in s.labels
    r = run_scenario(s, tmp_path / "runs", tmp_path / "golden")
    assert r.verdict == "pass", r.reason
    checks = {c["name"]: c for c in r.checks}
    assert checks["fault_0_job_failed"]["verdict"] == "pass"  # SIGINT ends the launch, as its kind says
    assert r.resumed_from == ["step_00000004"] and r.launches == 2
    fired = of(read_history(r.run_dir), FaultFired)
    assert [h.fault for h in fired] == ["interrupt"] and fired[0].detail["ranks"] == [0]


def test_corrupt_edits_a_manifest_and_damages_a_save_in_progress(tmp_path):
    import json

    from ckpt_chaos.faults.storage import corrupt
    from ckpt_chaos.probe.layout import validate

    def manifest(step: int) -> dict:
        return {"format": 2, "step": step, "micro": 0, "files": {".metadata": {"size": 1, "xxh3_128": "x"}}}

    for step in (2, 4, 6):
        (tmp_path / f"step_{step:08d}").mkdir()
        (tmp_path / f"step_{step:08d}" / "manifest.json").write_text(json.dumps(manifest(step)))
    (tmp_path / ".tmp-step_00000008").mkdir()
    (tmp_path / ".tmp-step_00000008" / "__1_0.distcp").write_bytes(b"0123456789")

    def hit(checkpoint: str, corruption: str, file: str = "manifest.json") -> dict:
        return corrupt(tmp_path, Fault(kind="corrupt", when=Trigger(point="step.begin"), corruption=corruption,
                                       file=file, checkpoint=checkpoint))

    assert hit("step_00000006", "wrong_format")["files"] == ["manifest.json: format 2 -> 99"]
    assert validate(tmp_path / "step_00000006") == "manifest format 99 is not one of [1, 2]"
    assert hit("step_00000004", "wrong_step")["files"] == ["manifest.json: step 4 -> 5"]
    assert validate(tmp_path / "step_00000004") == "manifest says step 5.0, directory is step_00000004"
    hit("step_00000002", "unlist_metadata")
    assert validate(tmp_path / "step_00000002") == "manifest lists no DCP .metadata file"
    done = hit("in_progress", "truncate", "__1_0.distcp")
    assert done == {"checkpoint": ".tmp-step_00000008", "files": ["__1_0.distcp: 10 -> 5 bytes"], "in_progress": True}

    data = {"world_size": 2, "trainer": {"max_steps": 8, "ckpt_every_steps": 2},
            "faults": [{"kind": "corrupt", "corruption": "wrong_step", "when": {"point": "step.end"}}]}
    with pytest.raises(ScenarioError, match=r"faults\[0\].file: corruption 'wrong_step' edits a manifest"):
        from_dict(data, "x.toml", "x")
    data["faults"][0].update(file="manifest.json", checkpoint="in_progress")
    with pytest.raises(ScenarioError, match=r"faults\[0\].checkpoint: a save in progress has no manifest yet"):
        from_dict(data, "x.toml", "x")


def _late_rank_run(tmp_path, wait_s: float | None):
    """A ChaosRun of two real processes as ranks 0 and 1, with a kill of rank 1 at rank 0's first
    event; rank 0's event comes in at once, rank 1's ``wait_s`` later (None: never)."""
    import subprocess
    import threading
    import time

    from ckpt_chaos.env.launcher import Job
    from ckpt_chaos.env.storage import Storage, StorageSpec
    from ckpt_chaos.faults.kind import Launch
    from ckpt_chaos.run.runner import ChaosRun

    s = from_dict({"world_size": 2, "faults": [{"kind": "kill", "target": "rank:1",
                                                 "when": {"point": "train.start", "rank": 0}}]}, "late.toml", "late")
    ranks = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    try:
        run = ChaosRun(s, run_dir, Storage(run_dir, StorageSpec()))
        run.job = Job(ranks[0], "late-rank", run_dir / "torchrun.log")
        run.nemeses.new_launch(Launch(0, run.job, 2, run.pids, run.roles, run._await_pids))

        def event(rank: int) -> dict:
            return {"point": "train.start", "rank": rank, "pid": ranks[rank].pid, "attempt": 0, "restart": 0,
                    "t": time.time(), "info": {}}

        held = threading.Thread(target=run.on_event, args=(event(0),))
        held.start()
        if wait_s is not None:
            time.sleep(wait_s)
            threading.Thread(target=run.on_event, args=(event(1),), daemon=True).start()
        held.join(30)
        assert not held.is_alive()
        try:  # rank 1's fate before the cleanup below kills it anyway
            killed = ranks[1].wait(5 if wait_s is not None else 0.5) == -9
        except subprocess.TimeoutExpired:
            killed = False
        return run, ranks[1].pid, killed
    finally:
        for p in ranks:
            p.kill()
            p.wait()


def test_a_kill_waits_for_a_target_rank_that_has_not_reported_its_pid_yet(tmp_path):
    """The nightly search's finding: a kill of rank 1 at rank 0's first event fired before rank 1's
    own first event reached the harness, signalled nobody, and was called fired. The nemesis now
    waits for the target's pid while rank 0 is held at its probe point."""
    from ckpt_chaos.check.history import FaultFired, of, read_history

    run, victim, killed = _late_rank_run(tmp_path, wait_s=1.0)
    assert killed, "rank 1 was not killed by the fault"
    (fired,) = of(read_history(run.run_dir), FaultFired)
    assert fired.pids == [victim] and fired.detail["missing_ranks"] == [] and fired.unreached is None


def test_a_fault_whose_target_never_reports_is_unknown_not_fired(tmp_path, monkeypatch):
    """A target that never reports its pid cannot be signalled: the record says so, and ``fault_fired``
    is unknown (the run holds nothing of the fault), with no exit check that could contradict it."""
    from ckpt_chaos.check.outcome import fault_effects as _fault_effects, faults_fired as _faults_fired
    from ckpt_chaos.check.history import Exited, FaultFired, of, read_history
    from ckpt_chaos.check.verdict import Report, Run
    from ckpt_chaos.faults import kind

    monkeypatch.setattr(kind, "PID_WAIT_S", 0.5)
    run, _, killed = _late_rank_run(tmp_path, wait_s=None)
    assert not killed
    history = read_history(run.run_dir)
    (fired,) = of(history, FaultFired)
    assert fired.pids == [] and "rank(s) 1 had not reported a pid" in fired.unreached
    report = Report()
    stored = Run(run.s, run.run_dir, tmp_path, history + [Exited(launch=0, rc=0, snapshot={})], [])
    _faults_fired(stored, report)
    _fault_effects(stored, report)
    (c,) = report.checks
    assert (c.check, c.verdict) == ("fault_fired", "unknown") and "reached none of its targets" in c.detail
