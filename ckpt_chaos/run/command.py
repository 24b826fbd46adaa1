"""Running a trainer of its own (a scenario's ``[command]``): its command line, the directories the
probe layer watches, its golden run (recorded by the probe layer, twice, to tell a trainer that is
not deterministic), and the check that every trigger names a point the golden run reached."""

from __future__ import annotations

import glob
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import sys
import uuid
from dataclasses import asdict
from pathlib import Path

from filelock import FileLock

from ckpt_chaos.check.trajectory import EXACT
from ckpt_chaos.check.history import read_jsonl
from ckpt_chaos.config import golden_dir, golden_tree, refuse_golden_elsewhere
from ckpt_chaos.env.fileevents import FileEvents
from ckpt_chaos.env.launcher import Job, launch_command, native_crash, worker_pythonpath
from ckpt_chaos.env.storage import FAULTFS_POINTS, Storage, StorageSpec
from ckpt_chaos.probe import auto, auto_state, follow
from ckpt_chaos.probe.run_files import GOLDEN, LISTING, PLANNED, PROBE_LOG, TORCHRUN_LOG, TRAJECTORY
from ckpt_chaos.run import triggers
from ckpt_chaos.run.controller import ProbeServer
from ckpt_chaos.scenario import Scenario, ScenarioError

WRITTEN = {"file.write": "file.done", "ckpt.shard.write": "ckpt.shard.done", "faultfs.write": "faultfs.done"}  # the golden run's file sizes: the plan of a chaos run's file.write fractions


def missing(s: Scenario) -> str | None:
    """Why this machine cannot run the trainer: a module it needs is not installed. torch counts
    where the trainer runs in this environment (under its torchrun, or as ``{python}``): the probe
    layer sees its steps through torch's optimizer, and the core installs no torch of its own."""
    import importlib.util

    c = s.command
    here = c.launcher == "torchrun" or (c.argv and c.argv[0] == "{python}")
    absent = [m for m in dict.fromkeys((["torch"] if here else []) + c.requires) if importlib.util.find_spec(m) is None]
    if absent:
        return (f"the trainer needs the Python module(s) {', '.join(absent)}, which are not installed "
                "(for the examples: pip install 'ckpt-chaos[examples]')")
    return None


def _values(s: Scenario, run_dir: Path, attempt: int, world_size: int) -> dict[str, str]:
    # absolute: a framework may run its workers in another directory (Ray Train's working directory
    # per run), where a relative TMPDIR would name nothing and tempfile would fall back to /tmp
    run_dir = Path(os.path.abspath(run_dir))
    return {"python": sys.executable, "run_dir": str(run_dir), "ckpt_dir": str(run_dir / s.command.ckpt_dir),
            "world_size": str(world_size), "attempt": str(attempt)}


def argv(s: Scenario, run_dir: Path, attempt: int, world_size: int) -> list[str]:
    """The launch's command line: argv, then on a relaunch relaunch_argv and each key the relaunch's
    recovery.changes table changes (command.change_argv)."""
    c = s.command
    values = _values(s, run_dir, attempt, world_size)
    args = [a.format(**values) for a in c.argv + (c.relaunch_argv if attempt > 0 else [])]
    change = s.recovery.changes[attempt - 1] if 0 < attempt <= len(s.recovery.changes) else {}
    for key, value in change.items():
        args += [a.format(**values, key=key, value=str(value).lower() if isinstance(value, bool) else value)
                 for a in c.change_argv]
    return args


def environment(s: Scenario, run_dir: Path, attempt: int, world_size: int) -> dict[str, str]:
    values = _values(s, run_dir, attempt, world_size)
    return {k: v.format(**values) for k, v in s.command.env.items()}


def watched(s: Scenario, run_dir: Path) -> list[Path]:
    return [run_dir / s.command.ckpt_dir, *(Path(w) if os.path.isabs(w) else run_dir / w for w in s.command.watch)]


def recorded(s: Scenario, run_dir: Path) -> list[Path]:
    """The folders whose file events the fanotify recorder keeps (``files.jsonl``): the watched ones
    and the ``TMPDIR`` the command sets, as any launch sets it."""
    tmp = {environment(s, run_dir, a, s.launch_world_size(a)).get("TMPDIR")
           for a in range(s.recovery.max_restarts + 1)}
    return watched(s, run_dir) + sorted(Path(t) for t in tmp if t)


def launch(s: Scenario, run_dir: Path, attempt: int, world_size: int, controller: str,
           planned: Path | None = None, env: dict[str, str] | None = None, max_restarts: int = 0,
           all_points: bool = False) -> Job:
    """``all_points``: every per-step point goes to the controller (the golden run, which shows what a
    trigger can aim at); else only those the scenario's triggers name, a round trip per step each."""
    own = environment(s, run_dir, attempt, world_size)
    if s.recovery.relaunch == "self":  # its workers learn their rank at run time: the layer counts their restarts
        own[auto_state.ENV_COUNT_RESTARTS] = "1"
    for d in watched(s, run_dir) + ([Path(own["TMPDIR"])] if "TMPDIR" in own else []):
        d.mkdir(parents=True, exist_ok=True)  # a TMPDIR that does not exist is silently not used
    layer = auto.environment(controller, run_dir, watched(s, run_dir), planned=planned,
                             digest_every=s.command.digest_every, pythonpath=worker_pythonpath("ckpt_chaos"),
                             step_points=None if all_points else
                             {f.when.point for f in s.faults if f.when.point in auto_state.STEP_POINTS})
    return launch_command(run_dir, world_size, argv(s, run_dir, attempt, world_size), launcher=s.command.launcher,
                          env={**(env or {}), **own, **layer}, max_restarts=max_restarts)


def uses_faultfs(s: Scenario) -> bool:
    """A trigger names a point faultfs reports: the golden run needs faultfs too, for the plan."""
    return any(f.when.point in FAULTFS_POINTS for f in s.faults)


def report_to(storage: Storage, s: Scenario, controller: str | None, planned: Path | None = None) -> None:
    """Have faultfs report the job's calls under the checkpoint directory to ``controller`` (None: stop)."""
    if storage.client is None or not uses_faultfs(s):
        return
    plan = json.loads(planned.read_text()) if planned is not None and planned.is_file() else None
    storage.client.call("report", controller=controller, points=list(FAULTFS_POINTS), planned=plan,
                        prefix=s.command.ckpt_dir)


def plan(s: Scenario, golden: Path, run_dir: Path) -> Path:
    """The chaos run's plan: the golden run's files, each with its size, its names through the renames
    and a key that finds it again under a random temporary name (``follow.plan``). A write is cut at
    tenths of its own file's size, whatever a trigger's glob also matches."""
    out = run_dir / PLANNED
    out.write_text((golden / PLANNED).read_text())
    return out


def complete(s: Scenario, run_dir: Path) -> dict[str, dict]:
    """The checkpoints the trainer itself would count as complete (``command.complete`` in its folder):
    path relative to the run directory -> size and modification time. With a pointer file
    (``complete = { pointer = ... }``), the one checkpoint it names, its entry carrying ``via``: the
    pointer's path relative to the run directory; nothing when the pointer is missing, empty, garbled or
    names nothing that exists (``pointer()`` says which)."""
    ptr = pointer(s, run_dir)
    if ptr is None:
        found = sorted((run_dir / s.command.ckpt_dir).glob(s.command.complete))
    else:
        found = [run_dir / ptr["checkpoint"]] if ptr["checkpoint"] else []
    out = {}
    for p in found:
        try:
            st = p.stat()
            size = st.st_size if p.is_file() else sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        except OSError:
            continue  # removed while we looked
        out[str(p.relative_to(run_dir))] = {"size": size, "mtime_ns": st.st_mtime_ns,
                                            **({"via": ptr["file"]} if ptr else {})}
    return out


def pointer(s: Scenario, run_dir: Path) -> dict | None:
    """What the pointer file of ``command.complete = { pointer = FILE, format = ... }`` names now; None
    when ``complete`` is a glob. ``file``: the pointer, relative to the run directory; ``content``: its
    stripped text (None when it cannot be read; at most 200 characters); ``checkpoint``: the path it
    names, relative to the run directory, when that exists, else None; ``problem``: why it names no
    checkpoint (missing, empty, garbled, not a number for ``format``, outside the checkpoint folder,
    dangling), else None."""
    spec = s.command.complete
    if not isinstance(spec, dict):
        return None
    root = Path(os.path.normpath(run_dir))
    folder = Path(os.path.normpath(root / s.command.ckpt_dir))
    file = Path(os.path.normpath(folder / spec["pointer"]))  # inside the folder: the loader checks it
    rel = str(file.relative_to(root))
    out: dict = {"file": rel, "content": None, "checkpoint": None, "problem": None}
    field = spec.get("json")
    try:
        raw = file.read_bytes()[:(1 << 20) if field else 4096]
    except FileNotFoundError:
        return {**out, "problem": f"{rel} does not exist"}
    except OSError as e:
        return {**out, "problem": f"{rel} cannot be read: {e.strerror or e}"}
    text = raw.decode("utf-8", "replace").strip()
    out["content"] = text[:200]
    fmt = spec.get("format")
    if not text:
        return {**out, "problem": f"{rel} is empty"}
    if field is not None:  # a JSON file: its value at ``json`` names the checkpoint (Ray Train's snapshot)
        try:
            value = json.loads(text)
            for part in field.split("."):
                value = None if value is None else value[part]  # null on the way: no checkpoint yet
        except (ValueError, KeyError, TypeError, IndexError) as e:
            return {**out, "problem": f"{rel} is garbled: no JSON value at {field} ({type(e).__name__}: {e})"}
        if value is None or value == "":
            return {**out, "problem": f"{rel} names no checkpoint ({field} is {value!r})"}
        out["content"] = str(value)[:200]
        name = fmt.format(value) if fmt is not None else str(value)
        return _named(out, folder, root, rel, name, s.command.ckpt_dir)
    if "\ufffd" in text or any(ord(ch) < 32 for ch in text):
        return {**out, "problem": f"{rel} is garbled: it holds {text[:60]!r}, not one name"}
    if fmt is not None:
        if not text.isascii() or not text.isdigit():
            return {**out, "problem": f"{rel} holds {text[:60]!r}, not the number format {fmt!r} takes"}
        name = fmt.format(int(text))
    else:
        name = text
    return _named(out, folder, root, rel, name, s.command.ckpt_dir)


def _named(out: dict, folder: Path, root: Path, rel: str, name: str, ckpt_dir: str) -> dict:
    """``pointer``'s answer for the checkpoint ``name`` (relative to the checkpoint folder ``folder``)."""
    target = Path(os.path.normpath(folder / name))
    if target == folder or not target.is_relative_to(folder):
        return {**out, "problem": f"{rel} names {name!r}, which is not inside the checkpoint folder {ckpt_dir}"}
    if not target.exists():
        return {**out, "problem": f"{rel} names {name!r}, which does not exist (a dangling pointer)"}
    return {**out, "checkpoint": str(target.relative_to(root))}


def listing(s: Scenario, run_dir: Path) -> dict[str, int]:
    """Every file in the checkpoint folder, path relative to the run directory -> size: what a
    relaunch will find, for the checks that compare it with the golden run's files."""
    out = {}
    for dirpath, _, names in os.walk(run_dir / s.command.ckpt_dir):
        for n in names:
            p = Path(dirpath) / n
            try:
                out[str(p.relative_to(run_dir))] = p.lstat().st_size
            except OSError:
                continue
    return out


def _key_files(s: Scenario, root: Path | None = None) -> list[Path]:
    """The files matching the scenario's ``key`` patterns, relative ones under ``root`` (default: the
    current directory), as the patterns name them."""
    found = sorted({Path(p) for pattern in s.command.key
                    for p in glob.glob(pattern, recursive=True, root_dir=root)
                    if (Path(root or ".") / p).is_file()})
    return found


def _torch_version() -> str | None:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:  # a trainer that runs on an interpreter of its own
        return None


def golden_key(s: Scenario) -> str:
    h = hashlib.sha256()
    tree = golden_tree()  # pinned (mutation testing): the pristine tree's files, not the mutant's
    files = [(p, Path(tree or ".") / p) for p in _key_files(s, tree)]
    # the layer's code shapes the records too (every module of it), and follow.py the plan made of them
    layer = sorted(Path(auto.__file__).parent.glob("auto*.py")) + [Path(follow.__file__)]
    if uses_faultfs(s):  # and faultfs's, whose points the golden run records for a trigger's plan and aim
        layer += [Path(__file__).parents[1] / "env" / n for n in ("faultfs.py", "faultfs_probe.py")]
    for name, p in files + [(m, m) for m in layer]:
        h.update(str(name).encode())
        h.update(p.read_bytes())
    c = asdict(s.command)
    blob = json.dumps({"argv": c["argv"], "launcher": c["launcher"], "ckpt_dir": c["ckpt_dir"], "watch": c["watch"],
                       "env": c["env"], "digest_every": c["digest_every"], "world_size": s.world_size, "files": h.hexdigest(),
                       "faultfs": uses_faultfs(s),
                       "torch": _torch_version(), "python": platform.python_version()},
                      sort_keys=True)
    return "cmd-" + hashlib.sha256(blob.encode()).hexdigest()[:20]


def _golden_once(s: Scenario, work: Path, timeout: float) -> tuple[int | None, list[dict]]:
    events: list[dict] = []
    with ProbeServer(lambda e: events.append(e)) as server, \
            Storage(work, StorageSpec(faultfs=uses_faultfs(s))) as storage, \
            FileEvents(work, recorded(s, work)) as files:  # files.jsonl stays with the golden run
        report_to(storage, s, server.address)
        files.launch(0)
        job = launch(s, work, 0, s.world_size, server.address, all_points=True)
        try:
            rc = job.wait(timeout)
        finally:
            job.kill()
            files.drain()
            report_to(storage, s, None)
    shutil.rmtree(work / ".storage", ignore_errors=True)
    with open(work / PROBE_LOG, "w") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")
    return rc, events


def golden_run(s: Scenario, root: Path | None = None, timeout: float = 600) -> Path:
    """The fault-free run of a ``[command]`` trainer, made twice: ``golden.json`` says whether the two
    trajectories are identical (``deterministic``) and, if not, at which step they first differ."""
    root = Path(root) if root else golden_dir()
    root.mkdir(parents=True, exist_ok=True)
    key = golden_key(s)
    final = root / key
    with FileLock(str(root / f"{key}.lock")):
        if (final / GOLDEN).is_file():
            return final
        refuse_golden_elsewhere(key, root)
        runs = []
        for n in (1, 2):
            for tries in (1, 2):
                work = root / f".tmp-{key}-{uuid.uuid4().hex[:8]}"
                rc, events = _golden_once(s, work, timeout)
                crash = native_crash(work / TORCHRUN_LOG) if rc != 0 else None
                if crash is None or tries == 2:
                    break
                # the fault-free run says nothing about faults; a crash the trainer causes comes back
                print(f"ckpt-chaos: WARNING: {s.source}: the trainer's fault-free run crashed natively ({crash}), "
                      f"running it once more; its log: {work / TORCHRUN_LOG}", file=sys.stderr, flush=True)
            if rc != 0:
                log = (work / TORCHRUN_LOG).read_text()[-3000:] if (work / TORCHRUN_LOG).exists() else ""
                raise ScenarioError(f"{s.source}: command: the trainer's fault-free run failed (exit {rc}); "
                                    f"fix the command or the trainer; its log ({work / TORCHRUN_LOG}):\n{log}")
            if not read_jsonl(work / TRAJECTORY):
                raise ScenarioError(f"{s.source}: command: the fault-free run recorded no optimizer step; the "
                                    "automatic probe layer sees steps through torch.optim's step hooks: does the "
                                    "trainer step a torch optimizer, in a process started by the command?")
            runs.append((work, events))
        (work, events), (other, _) = runs
        differ = first_difference(work, other, EXACT)
        (work / PLANNED).write_text(json.dumps(follow.plan(events)))
        (work / LISTING).write_text(json.dumps(listing(s, work)))
        for d in watched(s, work):
            if d.is_relative_to(work):
                shutil.rmtree(d, ignore_errors=True)  # the records are what is kept
        (work / GOLDEN).write_text(json.dumps({"command": asdict(s.command), "world_size": s.world_size,
                                                      "faultfs": uses_faultfs(s),
                                                      "deterministic": differ is None, "differs": differ,
                                                      "unstable": unstable(work, other)}))
        shutil.rmtree(other, ignore_errors=True)
        if final.exists():
            shutil.rmtree(final)
        os.rename(work, final)
    return final


def first_difference(a: Path, b: Path, fields: tuple[str, ...]) -> dict | None:
    """The first step where two runs' trajectories differ in ``fields``, and in which, or None."""
    ta = {r["step"]: r for r in read_jsonl(a / TRAJECTORY)}
    tb = {r["step"]: r for r in read_jsonl(b / TRAJECTORY)}
    for step in sorted(set(ta) | set(tb)):
        ra, rb = ta.get(step, {}), tb.get(step, {})
        differ = sorted(k for k in fields if ra.get(k) != rb.get(k))
        if differ:
            return {"step": step, "fields": differ}
    return None


def unstable(a: Path, b: Path) -> list[str]:
    """Recorded fields whose values differ between two fault-free runs at a step both recorded them
    (an unseeded Python RNG): the diagnosis does not blame them. A field one run recorded at a step and
    the other did not is not unstable: the state digests are taken before the step after a save, which
    a save the layer does not see (a writer thread, another rank's files) shows a step earlier or later."""
    ta = {r["step"]: r for r in read_jsonl(a / TRAJECTORY)}
    tb = {r["step"]: r for r in read_jsonl(b / TRAJECTORY)}
    return sorted({k for step in set(ta) & set(tb) for k in set(ta[step]) & set(tb[step])
                   if k != "t" and ta[step][k] != tb[step][k]})


def check_triggers(s: Scenario, golden: Path) -> None:
    """Every fault of the first launch names a point the golden run reached (with its filters on
    rank and path): a trigger that cannot fire is an error before anything runs, not a fault that
    quietly never fired. A path is matched as the run will match it, a written file under each name
    it had (``follow.py``); the refusal says why the files it names were missed."""
    events = read_jsonl(golden / PROBE_LOG)
    listing = json.loads((golden / LISTING).read_text()) if (golden / LISTING).is_file() else None
    armed = sorted({p for e in events if e["point"] == "probe.armed" for p in e["info"]["points"]}
                   | (set(FAULTFS_POINTS) if uses_faultfs(s) else set()))
    seen = {e["point"] for e in events}
    for i, f in enumerate(s.faults):
        if f.attempt != 0 or f.when.external:
            continue
        if f.when.point not in armed:
            raise ScenarioError(f"{s.source}: faults[{i}].when.point: {f.when.point!r} is not armed in this trainer "
                                f"(the probe layer armed {', '.join(armed) or 'nothing'}); use one of those")
        # Without a plan the golden run reports a write only every MiB: a written file is its done point.
        point = WRITTEN.get(f.when.point, f.when.point)
        if point not in seen:
            why = triggers.near_misses(f.when, events, listing) if f.when.path is not None else []
            raise ScenarioError(f"{s.source}: faults[{i}].when.point: {f.when.point!r} never happened in the "
                                f"fault-free run ({golden / PROBE_LOG})" + "".join(f"; {w}" for w in why)
                                + f"; use a point it reached: {', '.join(sorted(seen - {'probe.armed'}))}")
        if f.when.path is not None:
            why = triggers.unreached(f.when, events, listing)
            if why is not None:
                raise ScenarioError(f"{s.source}: faults[{i}].when.path: {why}")
