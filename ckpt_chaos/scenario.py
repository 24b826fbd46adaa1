"""Scenarios: reading scenario files into the model (``ckpt_chaos/scenario_model.py``, whose names
this module exports too) and validating them. Every problem names the file, the key, what was found
and the fix, and nothing runs from a file that does not validate. The format is in docs/scenarios.md."""

from __future__ import annotations

import string
import tomllib
import types
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from ckpt_chaos.env.storage import FAULTFS_POINTS
from ckpt_chaos.faults.registry import KINDS, Invalid
from ckpt_chaos.faults.targets import target_ranks
from ckpt_chaos.probe import auto_state
from ckpt_chaos.probe.profile import TrainerProfile, profile_of
from ckpt_chaos.scenario_model import (AUTO_POINTS, BACKENDS, CHOICE_NAMES, EXTERNAL_POINTS, FAMILIES, FAULT_KINDS,
                                       FULL_SUITE, GENERIC_KEYS, PATH_POINTS, PLACEHOLDERS, CHANGE_PLACEHOLDERS, Cluster,
                                       Command, Expect, Fault, Recovery, Remote, Scenario, Storage, Trigger)

__all__ = ["AUTO_POINTS", "BACKENDS", "EXTERNAL_POINTS", "FAMILIES", "FAULT_KINDS", "FULL_SUITE", "PATH_POINTS",
           "Cluster", "Command", "Expect", "Fault", "Recovery", "Remote", "Scenario", "ScenarioError", "Storage",
           "Trigger", "builtin", "catalogue", "from_dict", "load", "validate"]


class ScenarioError(ValueError):
    """A scenario that cannot run; the message names the file, the key and the fix."""


def _error(source: str, key: str, problem: str, fix: str) -> ScenarioError:
    return ScenarioError(f"{source}: {key}: {problem}; {fix}")


def _take(cls, data: Any, source: str, key: str, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """The keys of table ``data`` for dataclass ``cls``, each checked against its field's declared type;
    unknown and missing keys are refused."""
    if not isinstance(data, dict):
        raise _error(source, key, f"expected a table, found {type(data).__name__}", f"write [{key}] with keys")
    hints = _hints(cls)
    allowed = [f.name for f in fields(cls) if f.name != "source"]
    for k in data:
        if k not in allowed:
            raise _error(source, f"{key}.{k}" if key else k, "unknown key",
                         f"allowed keys: {', '.join(sorted(allowed))}")
    for k in required:
        if k not in data:
            raise _error(source, f"{key}.{k}" if key else k, "missing", "this key is required")
    for k, v in data.items():
        _check_value(source, f"{key}.{k}" if key else k, v, hints[k])
    return dict(data)


def _check_value(source: str, key: str, value: Any, tp: Any) -> None:
    """The one check of a value against its field's type, for every field: a wrong type names the
    type expected, and a value outside the field's declared choices (its ``Literal``) the allowed ones."""
    if not _fits(value, tp):
        raise _error(source, key, f"wrong type {type(value).__name__} ({value!r})", f"expected {_show(tp)}")
    choices = _literal(tp)
    if choices is not None and isinstance(value, str) and value not in get_args(choices):
        raise _error(source, key, f"unknown {CHOICE_NAMES.get(choices, 'value')} {value!r}",
                     f"allowed: {', '.join(get_args(choices))}")


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """The field types of a dataclass, resolved from the annotations' text once per class."""
    if cls not in _HINTS:
        _HINTS[cls] = get_type_hints(cls)
    return _HINTS[cls]


def _literal(tp: Any) -> Any:
    """The ``Literal`` that declares a field's choices (also as ``Literal[...] | None``), or None."""
    if get_origin(tp) is Literal:
        return tp
    if get_origin(tp) in (Union, types.UnionType):
        return next((a for a in get_args(tp) if get_origin(a) is Literal), None)
    return None


def _fits(value: Any, tp: Any) -> bool:
    """``value`` (as TOML gives it, or set in Python) has type ``tp``; a field of a dataclass type
    takes a table, which is checked against that dataclass in turn."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return True
    if origin is Literal:
        return any(type(value) is type(a) for a in args)
    if origin in (Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if origin is list:
        return isinstance(value, list) and all(_fits(x, args[0]) for x in value)
    if origin is dict:
        return isinstance(value, dict) and all(_fits(k, args[0]) and _fits(v, args[1]) for k, v in value.items())
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if is_dataclass(tp):
        return isinstance(value, (dict, tp))
    return isinstance(value, tp) if isinstance(tp, type) else True


def _show(tp: Any) -> str:
    """A type as a message names it: int, int | None, list[str], dict[str, Any]."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return " | ".join(dict.fromkeys(type(a).__name__ for a in args))
    if origin in (Union, types.UnionType):
        return " | ".join(_show(a) for a in args)
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_show(a) for a in args)}]"
    if tp is type(None):
        return "None"
    if tp is Any:
        return "Any"
    if is_dataclass(tp):
        return "a table"
    return getattr(tp, "__name__", str(tp))


def _check_choices(s: Scenario) -> None:
    """The choice fields of every section, checked as a file's are: a scenario built in Python
    (the search builds them) meets the same check."""
    sections: list[tuple[str, Any]] = [("", s), ("storage", s.storage), ("cluster", s.cluster),
                                       ("remote", s.remote), ("command", s.command),
                                       ("recovery", s.recovery), ("expect", s.expect)]
    for i, f in enumerate(s.faults):
        sections += [(f"faults[{i}]", f), (f"faults[{i}].when", f.when), (f"faults[{i}]", f.params)]
    for key, part in sections:
        if part is None:
            continue
        hints = _hints(type(part))
        for fl in fields(part):
            if _literal(hints[fl.name]) is not None:
                _check_value(s.source, f"{key}.{fl.name}" if key else fl.name, getattr(part, fl.name), hints[fl.name])


def _check_target(target: str, s: Scenario, source: str, key: str) -> None:
    world_size, nodes = s.world_size, s.nodes()
    fix = "use rank:N, ranks:A,B, all, majority, minority, node:N, triggering or uploader"
    if target == "uploader":
        if s.remote is None:
            raise _error(source, key, "the uploader exists only with a remote tier", "add a [remote] table")
        return
    try:
        ranks = target_ranks(target, world_size, triggering=0,
                             ranks_per_node=s.cluster.ranks_per_node if s.cluster.multi_node else None)
    except ValueError:
        raise _error(source, key, f"unknown target {target!r}", fix) from None
    if target.startswith("node:") and not 0 <= int(target[5:]) < nodes:
        raise _error(source, key, f"{target!r}: the job has {nodes} node(s)" +
                     ("" if s.cluster.multi_node else " on the local backend"),
                     f"use node:0..node:{nodes - 1}" + ("" if s.cluster.multi_node else
                                                       ", or [cluster] backend = \"docker\" for several nodes"))
    if not ranks:
        raise _error(source, key, f"{target!r} is empty at world size {world_size}", fix)
    bad = [r for r in ranks if not 0 <= r < world_size]
    if bad:
        raise _error(source, key, f"rank {bad[0]} does not exist at world size {world_size}",
                     f"use a rank in 0..{world_size - 1}")


def from_dict(data: dict[str, Any], source: str, default_name: str) -> Scenario:
    """Build and validate a scenario from a parsed table."""
    top = _take(Scenario, {k: v for k, v in data.items()
                           if k not in ("faults", "recovery", "expect", "storage", "cluster", "remote", "command")},
                source, "")
    raw_faults = data.get("faults", [])
    if not isinstance(raw_faults, list):
        raise _error(source, "faults", "expected an array of tables", "write each fault as [[faults]]")
    faults = []
    for i, raw in enumerate(raw_faults):
        key = f"faults[{i}]"
        if not isinstance(raw, dict):
            raise _error(source, key, f"expected a table, found {type(raw).__name__}", "write each fault as [[faults]]")
        f = _take(Fault, {k: v for k, v in raw.items() if k in GENERIC_KEYS}, source, key, required=("kind", "when"))
        spec = KINDS[f["kind"]]
        when = _take(Trigger, f["when"], source, f"{key}.when", required=("point",))
        if when["point"] == "fs.created" and "path" not in when:
            raise _error(source, f"{key}.when.path", "fs.created needs a path glob",
                         "e.g. when = { point = \"fs.created\", path = \"checkpoints/.tmp-step_00000008/*.distcp\" }")
        if "path" in when and when["point"] not in PATH_POINTS:
            raise _error(source, f"{key}.when.path", f"{when['point']} carries no path",
                         f"path filters only {', '.join(PATH_POINTS)}")
        if when.get("nth", 1) < 1:
            raise _error(source, f"{key}.when.nth", "must be 1 or more", "count events from 1")
        f["when"] = Trigger(**when)
        own = {k: v for k, v in raw.items() if k not in GENERIC_KEYS}
        extra = [k for k in own if k not in spec.keys]
        if extra:
            raise _error(source, f"{key}.{extra[0]}", f"does not apply to kind {spec.name!r}",
                         f"{spec.name} takes {', '.join(spec.keys) or 'no keys of its own'} "
                         f"(besides {', '.join(GENERIC_KEYS)})")
        faults.append(Fault(**f, params=spec.params(**_take(spec.params, own, source, key))))
    storage = Storage(**_take(Storage, data.get("storage", {}), source, "storage"))
    cluster = Cluster(**_take(Cluster, data.get("cluster", {}), source, "cluster"))
    remote = Remote(**_take(Remote, data["remote"], source, "remote")) if "remote" in data else None
    command = Command(**_take(Command, data["command"], source, "command")) if "command" in data else None
    recovery = Recovery(**_take(Recovery, data.get("recovery", {}), source, "recovery"))
    expect = Expect(**_take(Expect, data.get("expect", {}), source, "expect"))
    scenario = Scenario(name=top.pop("name", default_name), faults=faults, storage=storage, cluster=cluster,
                        remote=remote, command=command, recovery=recovery, expect=expect, source=source, **top)
    validate(scenario)
    return scenario


def validate(s: Scenario) -> None:
    """Cross-field checks: targets exist, the trainer config is valid at every world size used."""
    src = s.source
    _check_choices(s)
    if s.world_size < 1:
        raise _error(src, "world_size", f"{s.world_size} ranks", "use 1 or more")
    if s.expect.max_lost_steps is not None and s.expect.max_lost_steps < 0:
        raise _error(src, "expect.max_lost_steps", f"{s.expect.max_lost_steps}", "use the steps a relaunch may "
                     "train again: 0 or more")
    if s.storage.fs != "host" and not 8 <= s.storage.size_mb <= 4096:
        raise _error(src, "storage.size_mb", f"{s.storage.size_mb}", "use 8 to 4096 (MiB)")
    _check_cluster(s)
    _check_command(s)
    if s.recovery.relaunch == "torchrun" and s.recovery.world_size not in (None, s.world_size):
        if not s.cluster.multi_node:
            raise _error(src, "recovery.world_size", "torchrun restarts on one node keep the world size",
                         "use relaunch = \"harness\", or a multi-node [cluster] (torchrun --nnodes=MIN:MAX)")
        if s.resumed_world_size() > s.world_size:
            raise _error(src, "recovery.world_size", "an elastic torchrun job only shrinks here (no node joins)",
                         "use relaunch = \"harness\" to grow")
    # a relaunch that must refuse the new size trains nothing: the ones after it are at the old size
    if (s.resumed_world_size() != s.world_size and "world_size" not in s.expect.refused
            and s.expect.trajectory == "bit-exact"):
        raise _error(src, "expect.trajectory", "bit-exact across a world-size change",
                     "use trajectory = \"tolerance\" (the README says why)")
    for i, f in enumerate(s.faults):
        if f.spec.validate is not None:  # the kind's own checks first: they explain a target best
            try:
                f.spec.validate(s, f)
            except Invalid as e:
                raise _error(src, e.key if e.top else f"faults[{i}].{e.key}", e.problem, e.fix) from None
        _check_target(f.target, s, src, f"faults[{i}].target")
        if not s.probe and not f.when.external:
            raise _error(src, f"faults[{i}].when.point", f"{f.when.point!r} needs the probe, and probe = false",
                         f"use an external point ({', '.join(EXTERNAL_POINTS)}) or probe = true")
        if f.when.external and f.target == "triggering":
            raise _error(src, f"faults[{i}].target", "an external event has no triggering rank",
                         "name the ranks: rank:N, all, ...")
        if f.when.rank is not None and not 0 <= f.when.rank < s.world_size:
            raise _error(src, f"faults[{i}].when.rank", f"rank {f.when.rank} does not exist at world size "
                         f"{s.world_size}", f"use a rank in 0..{s.world_size - 1}")
        if f.target == "uploader" and not f.spec.uploader:
            takes = [k.name for k in KINDS.values() if k.uploader]
            raise _error(src, f"faults[{i}].target", f"{f.kind} does not act on the uploader",
                         "use kind = " + " or ".join(f'"{k}"' for k in takes))
        if f.attempt > s.recovery.max_restarts:
            raise _error(src, f"faults[{i}].attempt", f"launch {f.attempt} never happens with max_restarts = "
                         f"{s.recovery.max_restarts}", "raise recovery.max_restarts or lower attempt")
    _check_order(s)
    _check_changes(s)
    profile = profile_of(s)
    if profile is not None:
        _check_trainer_table(src, "trainer", s.trainer, s, profile)
        for i, change in enumerate(s.recovery.changes):
            _check_trainer_table(src, f"recovery.changes[{i}]", {**s.trainer, **change}, s, profile, change)


def _check_order(s: Scenario) -> None:
    """``when.after`` names a fault that can fire before this one, and no two faults of a launch race:
    fire on different processes' events with no order declared (``ckpt_chaos/order.py``)."""
    from ckpt_chaos import order

    for key, problem, fix in order.problems(s) + order.race_problems(s):
        raise _error(s.source, key, problem, fix)


def _check_trainer_table(src: str, key: str, table: dict[str, Any], s: Scenario, profile: TrainerProfile,
                         shown: dict[str, Any] | None = None) -> None:
    """``table`` is a valid configuration of the trainer (as its profile declares) at every world size the
    scenario uses; errors name ``key`` and the keys of ``shown`` (the table as written)."""
    defaults = profile.defaults
    for k, v in (table if shown is None else shown).items():
        if k not in defaults:
            raise _error(src, f"{key}.{k}", f"not a field of {s.trainer_module}'s configuration",
                         f"use one of its fields: {', '.join(sorted(defaults))}")
        if k in profile.reserved:
            raise _error(src, f"{key}.{k}", profile.reserved[k], "remove it")
        want = type(defaults[k])
        _check_value(src, f"{key}.{k}", v, want if want in (int, float, bool, str) else Any)
    try:
        for world in {s.world_size, s.resumed_world_size()}:
            profile.validate({**defaults, **table}, world)
    except ValueError as e:
        raise _error(src, key, str(e), "fix the trainer table or the world sizes") from None


def _check_changes(s: Scenario) -> None:
    src, changes = s.source, s.recovery.changes
    if s.command is not None:
        for i, change in enumerate(changes):
            bad = next((k for k, v in change.items() if not isinstance(v, (str, int, float, bool))), None)
            if bad is not None:
                raise _error(src, f"recovery.changes[{i}].{bad}", f"{change[bad]!r} cannot go on a command line",
                             "give a string, number or boolean")
    if changes and (s.recovery.relaunch != "harness" or s.cluster.backend == "slurm"):
        raise _error(src, "recovery.changes", "only a relaunch by the harness can change the configuration",
                     "use relaunch = \"harness\" on a backend other than slurm")
    if len(changes) > s.recovery.max_restarts:
        raise _error(src, "recovery.changes", f"{len(changes)} tables for {s.recovery.max_restarts} relaunch(es)",
                     "raise recovery.max_restarts or drop tables")
    for i, change in enumerate(changes):
        if not change and i == len(changes) - 1:
            raise _error(src, f"recovery.changes[{i}]", "an empty last table changes nothing",
                         "drop it: relaunches past the list run the scenario's own [trainer]")
    changed = {k for change in changes for k in change}
    if "world_size" in s.expect.refused and "world_size" not in changed:
        if s.command is None or s.resumed_world_size() == s.world_size:
            raise _error(src, "expect.refused", "world_size is refused only where a [command] trainer's relaunch "
                         "changes it", "set recovery.world_size to another number of ranks, in a [command] scenario")
        changed.add("world_size")
    for k in s.expect.refused:
        if k not in changed:
            raise _error(src, "expect.refused", f"{k!r} is changed by no relaunch",
                         "name keys that a recovery.changes table sets")


def _check_command(s: Scenario) -> None:
    src, c = s.source, s.command
    if c is None:
        for i, f in enumerate(s.faults):
            if f.when.point in AUTO_POINTS:
                source = "faultfs" if f.when.point in FAULTFS_POINTS else "the automatic probe layer"
                raise _error(src, f"faults[{i}].when.point", f"{f.when.point} comes from {source}, "
                             f"which reports for a [command] trainer only", "use a point the trainer reports "
                             "(ckpt_chaos/probe/__init__.py POINTS), or describe the trainer in a [command] table")
        return
    if s.trainer or s.trainer_module != "reference_trainer":
        raise _error(src, "trainer" if s.trainer else "trainer_module", "a [command] trainer is configured on its "
                     "command line", "drop it and put the settings in command.argv")
    if not c.argv:
        raise _error(src, "command.argv", "empty", "name the script and its arguments, "
                     "e.g. argv = [\"train.py\", \"--ckpt-dir\", \"{ckpt_dir}\"]")
    bad_env = [k for k, v in c.env.items() if not isinstance(v, str)]
    if bad_env:
        raise _error(src, f"command.env.{bad_env[0]}", f"not a string: {c.env[bad_env[0]]!r}", "quote the value")
    for key, args, allowed in (("command.argv", c.argv, PLACEHOLDERS),
                               ("command.relaunch_argv", c.relaunch_argv, PLACEHOLDERS),
                               ("command.change_argv", c.change_argv, PLACEHOLDERS + CHANGE_PLACEHOLDERS),
                               ("command.env", list(c.env.values()), PLACEHOLDERS)):
        for arg in args:
            try:
                names = [name for _, name, _, _ in string.Formatter().parse(arg) if name is not None]
            except ValueError as e:
                raise _error(src, key, f"{arg!r}: {e}", "write a literal brace as {{ or }}") from None
            bad = [n for n in names if n not in allowed]
            if bad:
                raise _error(src, key, f"unknown placeholder {{{bad[0]}}} in {arg!r}",
                             f"allowed: {', '.join('{' + p + '}' for p in allowed)}")
    if s.recovery.changes and not any("{key}" in a for a in c.change_argv):
        raise _error(src, "command.change_argv", f"{c.change_argv!r} does not name the changed key",
                     "put {key} and {value} in it: [\"--{key}={value}\"]")
    if not s.probe:
        raise _error(src, "probe", "a [command] trainer is driven by the automatic probe layer", "use probe = true")
    if s.cluster.multi_node or s.remote is not None:
        raise _error(src, "cluster" if s.cluster.multi_node else "remote", "a [command] trainer runs on the local "
                     "backend without a remote tier", "drop the table")
    if s.recovery.relaunch == "self" and (c.launcher != "self" or s.recovery.changes or s.recovery.world_size):
        raise _error(src, "recovery.relaunch", "\"self\" is a trainer that restarts its own workers, started as "
                     "it is, with nothing changed", "use command.launcher = \"self\" and no recovery.changes or "
                     "recovery.world_size, or relaunch = \"harness\"")
    if c.launcher == "self" and s.recovery.relaunch == "torchrun":
        raise _error(src, "recovery.relaunch", "torchrun restarts need torchrun as the launcher",
                     "use relaunch = \"harness\", or command.launcher = \"torchrun\"")
    if Path(c.ckpt_dir).is_absolute() or ".." in Path(c.ckpt_dir).parts or not c.ckpt_dir.strip("./"):
        raise _error(src, "command.ckpt_dir", f"{c.ckpt_dir!r}", "name a folder inside the run directory, "
                     "e.g. \"checkpoints\"")
    spec = s.storage_spec()
    if (spec.fs != "host" or spec.faultfs) and Path(c.ckpt_dir) != Path("checkpoints"):
        raise _error(src, "command.ckpt_dir", f"storage faults act on the run directory's checkpoints folder, "
                     f"not {c.ckpt_dir!r}", "use ckpt_dir = \"checkpoints\"")
    if c.resize_rng is not None and c.resize_rng not in ("keep", "reseed", "shared"):
        raise _error(src, "command.resize_rng", f"{c.resize_rng!r}", "use keep, reseed or shared (docs/checks.md)")
    if c.save_every is not None and c.save_every < 1:
        raise _error(src, "command.save_every", f"{c.save_every}", "use the trainer's checkpoint interval in steps")
    if c.saves_in_flight < 0:
        raise _error(src, "command.saves_in_flight", f"{c.saves_in_flight}", "use how many saves may still be "
                     "writing while training goes on: 0 (each save is whole before the next step) or more")
    if c.saves_in_flight and c.save_every is None:
        raise _error(src, "command.saves_in_flight", "counts saves of command.save_every steps, which is not "
                     "given", "give command.save_every (the trainer's checkpoint interval in steps), or state "
                     "the bound itself as expect.max_lost_steps")
    if c.keep_last is not None and c.keep_last < 1:
        raise _error(src, "command.keep_last", f"{c.keep_last}", "use how many of its newest checkpoints the trainer "
                     "keeps (its --keep), or drop the key")
    if c.keep_last is not None and not isinstance(c.complete, str):
        raise _error(src, "command.keep_last", "a pointer names one checkpoint, not the set retention keeps",
                     "give command.complete as a glob of the checkpoints (\"step_*.pt\"), or drop keep_last")
    _check_complete(src, c.complete)
    armed = auto_state.armed_points(auto_state.PATCH_POINTS)
    for i, f in enumerate(s.faults):
        if not f.when.external and f.when.point not in armed and f.when.point not in FAULTFS_POINTS:
            raise _error(src, f"faults[{i}].when.point", f"the automatic probe layer never fires {f.when.point!r}",
                         f"use one of {', '.join(sorted(armed))} (or an external point: "
                         f"{', '.join(EXTERNAL_POINTS)})")


COMPLETE_KEYS = ("pointer", "format", "json")  # command.complete as a table: the checkpoint a pointer file names


def _in_folder(path: str) -> bool:
    """A relative path that stays inside the folder it is relative to."""
    p = Path(path)
    return bool(path.strip("./ ")) and not p.is_absolute() and ".." not in p.parts


def _check_complete(src: str, complete: str | dict[str, Any]) -> None:
    """``command.complete``: a glob in ckpt_dir, or ``{ pointer = FILE }`` with an optional ``format``
    (a str.format template with one field, for the number the file holds)."""
    key = "command.complete"
    pointer_example = 'complete = { pointer = "latest" }'
    if isinstance(complete, str):
        if not _in_folder(complete):
            raise _error(src, key, f"{complete!r} is not a glob inside ckpt_dir", "give one, e.g. complete = "
                         f"\"step_*\", or the file that names the newest checkpoint: {pointer_example}")
        return
    unknown = [k for k in complete if k not in COMPLETE_KEYS]
    if unknown:
        raise _error(src, f"{key}.{unknown[0]}", "unknown key", f"allowed keys: {', '.join(COMPLETE_KEYS)}, e.g. "
                     "complete = { pointer = \"latest_checkpointed_iteration.txt\", format = \"iter_{:07d}\" }")
    pointer = complete.get("pointer")
    if pointer is None:
        raise _error(src, f"{key}.pointer", "missing", f"name the file in ckpt_dir whose content names the "
                     f"checkpoint the trainer resumes from, e.g. {pointer_example}")
    if not isinstance(pointer, str) or not _in_folder(pointer) or any(ch in pointer for ch in "*?["):
        raise _error(src, f"{key}.pointer", f"{pointer!r} is not one file inside ckpt_dir",
                     f"name a file, relative to ckpt_dir and without wildcards, e.g. {pointer_example}")
    field = complete.get("json")
    if field is not None and (not isinstance(field, str) or not all(field.split("."))):
        raise _error(src, f"{key}.json", f"{field!r} is not a dotted key", "name the value in the pointer's JSON "
                     "that holds the checkpoint's name, e.g. json = \"latest_checkpoint_result.checkpoint_dir_name\"")
    if "format" not in complete:
        return
    fmt = complete["format"]
    fix = ("write a template with one {} field for the number the pointer holds, e.g. format = \"iter_{:07d}\" "
           "(8 -> iter_0000008); leave format out when the pointer holds the checkpoint's name itself")
    if not isinstance(fmt, str):
        raise _error(src, f"{key}.format", f"wrong type {type(fmt).__name__} ({fmt!r})", fix)
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(fmt) if name is not None]
        example = fmt.format(8) if names == [""] or names == ["0"] else None
    except (ValueError, IndexError, KeyError) as e:
        raise _error(src, f"{key}.format", f"{fmt!r}: {e}", fix) from None
    if example is None:
        raise _error(src, f"{key}.format", f"{fmt!r} has {len(names)} replacement field(s), "
                     f"{', '.join('{' + n + '}' for n in names) or 'none'}", fix)
    if not _in_folder(example):
        raise _error(src, f"{key}.format", f"{fmt!r} makes {example!r}, which is not inside ckpt_dir", fix)


def _check_cluster(s: Scenario) -> None:
    src, c = s.source, s.cluster
    if c.ranks_per_node < 1:
        raise _error(src, "cluster.ranks_per_node", f"{c.ranks_per_node}", "use 1 or more")
    if not c.multi_node:
        return
    for key, world in (("world_size", s.world_size), ("recovery.world_size", s.resumed_world_size())):
        if world % c.ranks_per_node:
            raise _error(src, key, f"{world} ranks do not fill nodes of {c.ranks_per_node} rank(s)",
                         "use a multiple of cluster.ranks_per_node")
    if s.storage.fs != "host" and not c.one_host:
        raise _error(src, "storage", f"storage faults run on the local or slurm backend, not {c.backend!r}",
                     "drop [storage] and storage faults, or use backend = \"local\"")
    if c.backend == "slurm" and s.recovery.relaunch == "torchrun":
        raise _error(src, "recovery.relaunch", "on the slurm backend Slurm relaunches the job (its requeue)",
                     "use relaunch = \"harness\" (a failed job is requeued with scontrol requeue) or \"none\"")
    if not s.probe:
        raise _error(src, "probe", f"the {c.backend} backend drives trainers through the probe",
                     "use probe = true, or backend = \"local\" for an unprobed trainer")


def builtin(path: str | Path) -> bool:
    """The file is part of the built-in catalogue (``ckpt_chaos/scenarios/``)."""
    from ckpt_chaos.config import builtin_scenarios

    return Path(path).resolve().is_relative_to(builtin_scenarios())


def load(path: str | Path) -> Scenario:
    """The scenario in a file. A built-in file without ``suites`` is in ``default`` (CI's suite); any
    other file without it (a project's) is in ``full`` only, never in the built-in ``default``."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{path}: not valid TOML: {e}; fix the syntax") from None
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read: {e.strerror}") from None
    if "suites" not in data and not builtin(path):
        data = {**data, "suites": []}
    return from_dict(data, str(path), path.stem)


def catalogue(root: str | Path) -> list[Scenario]:
    """Every scenario file under ``root``, sorted by name; the first invalid file raises."""
    scenarios = [load(p) for p in sorted(Path(root).rglob("*.toml"))]
    seen: dict[str, str] = {}
    for s in scenarios:
        if s.name in seen:
            raise ScenarioError(f"{s.source}: name: {s.name!r} is also used by {seen[s.name]}; names must be unique")
        seen[s.name] = s.source
    return sorted(scenarios, key=lambda s: s.name)
