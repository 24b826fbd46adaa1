"""The audit's search: two of the audit's faults composed across launches, on a ``[command]`` trainer.

The audit's suite (``generate.py``) holds one fault per scenario. A trainer can survive each of them
and still fail their composition: one that saves atomically in its first launch but writes in place
after a resume survives a kill between saves and a kill mid-write apart, not the second in the
relaunch the first one caused. The search composes the suite's own faults, at the points the
fault-free run showed, into schedules of two:

* **A**, a fault that ends launch 0 (``Fault.ends_launch``: a kill at half of a file, a kill before
  the commit or between saves, a power cut, a SIGTERM), as its scenario has it;
* **B**, the fault of another scenario moved to the relaunch (``attempt`` + 1), or a scenario's own
  relaunch fault (the kill of the relaunch's load). A relaunch is not what the golden run recorded
  (``probe/follow.py``: its writes are matched by exact path, with no golden-run names), so a trigger
  on a file's write names every name the file had (``step_8.pt.tmp`` and ``step_8.pt`` as
  ``step_8.pt*``: a trainer that writes in place after a resume is cut too), and a trigger counting
  the events of a path again in every save (``nth``) counts from the save the relaunch resumes from.

Only faults whose single scenario passed in the suite are composed, where the suite ran: a single
fault that already fails is the suite's finding. Each composition gets ``max_restarts`` for both
faults and a spare, its faults' order declared with ``after`` where ``order.races`` asks for it,
and the expectations a correct trainer meets under it (``search/schedule.py``'s ``expected``, for a
``[command]`` trainer: no ``resume_from``; the checks of a relaunch, resumed newest, no torn read,
the trajectory; the lost-work bound of one interval unless a fault may fail saves or damage data).

The order is drawn from the seed, the least-tried pairs first (by the family and point of A and of B),
and depends only on the pairs drawn before, never on a verdict: the same seed runs the same
schedules. A pair whose A cuts power after the save every other fault aims at, so that a correct
relaunch resumes past B's point, comes after the others (except a B at the relaunch's load). Each
schedule runs with ``runner.run_scenario`` against the audit's golden runs, until the budget is spent.

A failure's identity is its root check (``explore.identity`` over the checks in causal order, as the
matrix gives a failure's cause); ``fault_N_fired`` (the schedule did not happen as planned) and
``unknown`` are not findings. A failure is shrunk by the search's deletion pass (``reduce``: drop B,
drop A; a single fault that passed in the suite is known to pass), written as an ordinary scenario
file with a comment saying what was composed and why, loaded back and run once more: one that does
not fail the same way again is reported as "did not reproduce", and its file removed.
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import hashlib
import json
import random
import time
import tomllib
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from ckpt_chaos.audit.discover import Profile, glob_escape, load_golden
from ckpt_chaos.audit.generate import Generated, _rel, _text, slug, trainer_name
from ckpt_chaos.probe.follow import WRITE

SEARCHED = "search"
"""Tag of the composed scenarios."""


@dataclass
class Piece:
    """One fault of a composition, from one generated scenario."""

    source: str
    """The generated scenario it comes from."""
    family: str
    point: str
    fault: str
    why: str
    """What the generated scenario says it does."""
    table: dict
    """Its ``[[faults]]`` table as it runs in a composition (in the relaunch, for a B)."""
    alone: dict
    """Its table in its own scenario: what it is with no fault before it."""
    storage: dict | None = None
    role: str = "B"
    before: dict | None = None
    """For a fault of the relaunch itself: the launch-0 fault its own scenario puts before it."""

    @property
    def key(self) -> tuple[str, str]:
        return self.family, self.point


@dataclass
class Attempt:
    """One schedule run."""

    name: str
    verdict: str
    identity: str | None
    detail: str
    run_dir: str
    wall_s: float
    composed: list[str] = field(default_factory=list)


@dataclass
class Finding:
    identity: str
    detail: str
    file: str
    composed: list[str]
    """The generated scenarios its faults come from, in launch order."""
    reproduced: bool
    run_dir: str = ""
    rerun_reason: str = ""
    found_after_s: float = 0.0


@dataclass
class Summary:
    trainer: str
    seed: int
    budget_s: float
    pairs: int = 0
    """Schedules the search could compose here."""
    schedules: int = 0
    """Run for real (shrink and reproduction runs included)."""
    not_fired: int = 0
    """Runs in which a fault did not fire: the schedule did not happen as planned."""
    known_pass: int = 0
    """Shrink candidates that are a single fault the suite saw pass (not run again)."""
    left_out: dict[str, int] = field(default_factory=dict)
    """Why single faults or pairs were not composed, and how many."""
    findings: list[Finding] = field(default_factory=list)
    not_reproduced: list[Finding] = field(default_factory=list)
    wall_s: float = 0.0
    run_s: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


# ---- the pieces ------------------------------------------------------------------------------------------

def _moved_path(p: Profile, path: str, rel: bool) -> str:
    """A trigger's path for the relaunch: where it names a file of a save under one of its names, and each
    name the file had in the checkpoint folder extends its last (``x.pt.tmp``, ``x.pt``), a glob of them
    all (``x.pt*``). ``rel``: a path inside the checkpoint folder, masked as errno's takes it."""
    form = (lambda n: _rel(p, n)) if rel else glob_escape
    for f in (f for s in p.saves for f in s.files):
        inside = [n for n in f.names if n.startswith(p.ckpt_dir.rstrip("/") + "/")]
        if len(inside) > 1 and all(n.startswith(f.final) for n in inside) and path in {form(n) for n in inside}:
            return form(f.final) + "*"
    return path


def _resumed_nth(p: Profile, when: dict, events: list[dict] | None) -> dict:
    """``when`` counted from the save the relaunch resumes from (the one before the target save): a
    trigger on a path met again in every save (``nth``) otherwise counts the earlier saves, which a
    relaunch does not redo."""
    when = dict(when)
    if when.get("min_fraction") is not None:
        when.pop("nth", None)  # a pointer's write, counted per save: the relaunch's first is the target's
        return when
    if when.get("nth", 1) <= 1 or not when.get("path") or not events:
        return when
    k = 1 if len(p.saves) > 1 else 0  # the target save, as generate() picks it
    resumed = p.saves[k - 1].step if k else 0
    rank = when.get("rank", 0)
    mine = [e for e in events if e.get("rank", 0) == rank]
    boundary = next((i for i, e in enumerate(mine) if e["point"] == "step.begin"
                     and (e.get("info") or {}).get("step") == resumed + 1), 0)
    before = sum(1 for e in mine[:boundary] if e["point"] == when["point"]
                 and fnmatch.fnmatch((e.get("info") or {}).get("path") or "", when["path"]))
    if 0 < before < when["nth"]:
        when["nth"] -= before
    if when.get("nth") == 1:
        when.pop("nth")
    return when


def in_relaunch(p: Profile, table: dict, events: list[dict] | None = None) -> dict:
    """A launch-0 fault table moved to the relaunch: ``attempt`` + 1, its trigger aimed as a relaunch that
    resumed from the save before the target sees it (``_moved_path``, ``_resumed_nth``)."""
    t = copy.deepcopy(table)
    t["attempt"] = t.get("attempt", 0) + 1
    if t["when"].get("point") in WRITE and t["when"].get("path"):
        t["when"]["path"] = _moved_path(p, t["when"]["path"], rel=False)
    if isinstance(t.get("path"), str):  # errno's glob, inside the checkpoint folder
        t["path"] = _moved_path(p, t["path"], rel=True)
    t["when"] = _resumed_nth(p, t["when"], events)
    return t


def pieces(p: Profile, gen: list[Generated], verdicts: dict[str, str] | None = None,
           left_out: Counter | None = None) -> tuple[list[Piece], list[Piece]]:
    """The As and the Bs of the generated scenarios ``gen``; ``verdicts``: the suite's, by scenario name,
    where it ran. Why the others are not composed is counted in ``left_out``."""
    from ckpt_chaos.scenario import ScenarioError, from_dict

    left_out = Counter() if left_out is None else left_out
    try:
        events = load_golden(Path(p.golden))[0]
    except (OSError, ValueError, KeyError):
        events = None  # the golden run is gone: counts stay as the first launch saw them
    a_side, b_side = [], []
    for g in gen:
        if g.left_out:
            left_out["left out of the suite"] += 1
            continue
        if verdicts is not None and verdicts.get(g.name) != "pass":
            left_out["failed or unknown in the suite (its finding, not the search's)"] += 1
            continue
        data = tomllib.loads(g.text)
        if data.get("recovery", {}).get("changes") or data.get("expect"):
            left_out["a relaunch with an option changed (expectations of its own)"] += 1
            continue
        try:
            s = from_dict(data, g.name, g.name)
        except ScenarioError:
            left_out["not loadable"] += 1
            continue
        tables, storage = data.get("faults", []), data.get("storage")
        why = data.get("description", g.fault)
        if len(tables) == 1 and s.faults[0].attempt == 0:
            if s.faults[0].ends_launch:
                a_side.append(Piece(g.name, g.family, g.point, g.fault, why, tables[0], tables[0], storage, "A"))
            b_side.append(Piece(g.name, g.family, g.point, g.fault, why, in_relaunch(p, tables[0], events),
                                tables[0], storage))
        elif [f.attempt for f in s.faults] == [0, 1]:  # a fault of the relaunch itself (the kill of its load)
            b_side.append(Piece(g.name, g.family, g.point, g.fault, why, tables[1], tables[1], storage,
                                before=tables[0]))
        else:
            left_out["several faults in one launch"] += 1
    return a_side, b_side


# ---- a schedule as a scenario ------------------------------------------------------------------------------

Schedule = list[tuple[Piece, int]]
"""Each piece with the launch it strikes in."""


def _table(piece: Piece, launch: int) -> dict:
    """The piece's fault table in ``launch``: as its own scenario has it there, else as moved."""
    t = copy.deepcopy(piece.alone if launch == piece.alone.get("attempt", 0) else piece.table)
    t.pop("attempt", None)
    if launch:
        t["attempt"] = launch
    return t


def expect_of(p: Profile, faults) -> dict:
    """What a correct trainer guarantees under these faults (``search/schedule.py``'s ``expected``, for a
    ``[command]`` trainer): no ``resume_from``, so the relaunches' own checks (resumed newest, no torn
    read) and the trajectory; lost work bounded by one interval (the default) unless a fault may fail
    saves or damage or lose data, then by none."""
    if any(f.spec.fails_saves or f.spec.damages or f.spec.loses_disk for f in faults):
        return {"max_lost_steps": p.steps}
    return {}


def declare_order(tables: list[dict], data: dict) -> None:
    """``after`` on the later fault of each race (``order.races``: faults of one launch on different
    processes' events): it waits for the earlier one, the story's order, whichever process is quicker.
    ``data``: the scenario's other tables (loading one that races is refused, so each fault is read alone)."""
    from ckpt_chaos import order
    from ckpt_chaos.scenario import from_dict

    if len({t.get("attempt", 0) for t in tables}) == len(tables):
        return  # one fault a launch: faults of different launches never race
    alone = [from_dict({**data, "faults": [t]}, "the audit's search", "audit-search") for t in tables]
    s = dataclasses.replace(alone[0], faults=[x.faults[0] for x in alone])
    for i, j, _, _ in order.races(s):
        if tables[j]["when"].get("after") is None:
            tables[j]["when"]["after"] = i


def scenario_text(p: Profile, schedule: Schedule, header: str = "") -> tuple[str, object]:
    """The scenario file of ``schedule`` and the scenario it loads as (named by a hash of the text)."""
    from ckpt_chaos.scenario import from_dict

    tables = [_table(piece, launch) for piece, launch in schedule]
    storages = [piece.storage for piece, _ in schedule if piece.storage]
    if any(x != storages[0] for x in storages[1:]):
        raise ValueError("the faults need different storage: " + "; ".join(map(str, storages)))
    launches = max(launch for _, launch in schedule) + 1
    recovery = {"max_restarts": launches + 1}  # a relaunch per launch-ending fault and a spare
    what = [(f"in relaunch {launch}, " if launch else "") + piece.why for piece, launch in schedule]
    why = (f"{'; then '.join(what)} (composed by the audit's search from "
           f"{' and '.join(piece.source for piece, _ in schedule)})")

    def build(expect: dict | None):
        text = _text(p, why, tables, [SEARCHED], storage=storages[0] if storages else None,
                     recovery=recovery, expect=expect)
        return text, from_dict(tomllib.loads(text), "the audit's search", "audit-search")

    data = tomllib.loads(_text(p, why, [], [], storage=storages[0] if storages else None, recovery=recovery))
    declare_order(tables, data)
    text, s = build(None)
    text, s = build(expect_of(p, s.faults) or None)
    s.name = f"{trainer_name(p)}--search-{hashlib.sha256(text.encode()).hexdigest()[:10]}"
    return header + text, s


def pairs(a_side: list[Piece], b_side: list[Piece], p: Profile,
          left_out: Counter | None = None) -> list[tuple[Piece, Piece]]:
    """Every (A, B) this machine can run: B from another scenario, not a pair the suite already has
    (A, then the relaunch's load killed, where A is the load scenario's own kill), their storage
    compatible, their faults injectable here."""
    from ckpt_chaos.faults import requirements
    from ckpt_chaos.scenario import ScenarioError

    left_out = Counter() if left_out is None else left_out
    out = []
    cannot: dict[tuple, str | None] = {}  # by the kinds and storage: what this machine lacks depends on nothing else
    for a in a_side:
        for b in b_side:
            if b.source == a.source or (b.before is not None and b.before == a.alone):
                continue
            try:
                _, s = scenario_text(p, [(a, 0), (b, 1)])
            except (ValueError, ScenarioError) as e:
                left_out[f"not composable: {str(e).splitlines()[0][:160]}"] += 1
                continue
            need = (a.table["kind"], b.table["kind"], json.dumps(a.storage or b.storage, sort_keys=True))
            if need not in cannot:
                cannot[need] = requirements(s)
            if why := cannot[need]:
                left_out[f"cannot inject {why}"] += 1
                continue
            out.append((a, b))
    return out


def _late(a: Piece, b: Piece) -> bool:
    """A power cut right after the target save: a correct relaunch resumes from that save, so a B aimed at
    it or before it (every family's but the relaunch's load) never fires."""
    return a.family == "power-loss" and b.family != "load"


def draw(candidates: list[tuple[Piece, Piece]], seed: int) -> list[tuple[Piece, Piece]]:
    """The order the pairs are tried in: the least tried first, by the (family, point) of A and B
    together, then of A and B apart; among equals, as the seed shuffled them; ``_late`` pairs last. It
    depends on the pairs drawn before, never on a verdict, so a seed runs the same schedules."""
    shuffled = list(range(len(candidates)))
    random.Random(seed).shuffle(shuffled)
    rank = {i: r for r, i in enumerate(shuffled)}
    tried: Counter = Counter()
    left = set(range(len(candidates)))
    out = []
    while left:
        def score(i: int) -> tuple:
            a, b = candidates[i]
            return _late(a, b), tried[(a.key, b.key)], tried[("A", a.key)] + tried[("B", b.key)], rank[i]

        i = min(left, key=score)
        left.remove(i)
        a, b = candidates[i]
        tried.update([(a.key, b.key), ("A", a.key), ("B", b.key)])
        out.append(candidates[i])
    return out


# ---- the search ------------------------------------------------------------------------------------------------

def _signature(f) -> str:
    when = {k: v for k, v in asdict(f.when).items() if k != "after"}
    return json.dumps([f.kind, f.target, f.keys(), when], sort_keys=True, default=str)


def search(p: Profile, gen: list[Generated], out: Path, golden_root: Path, budget_s: float, seed: int = 0,
           verdicts: dict[str, str] | None = None, runner: Callable | None = None,
           on_event: Callable[[str, object], None] | None = None) -> Summary:
    """Run compositions of ``gen``'s faults for ``budget_s`` seconds (none starts after it; a failure found
    in it is shrunk and reproduced); ``out/summary.json``, each finding's file in ``out/found``."""
    from ckpt_chaos.check.verdict import causal
    from ckpt_chaos.run.runner import run_scenario
    from ckpt_chaos.search.explore import identity  # the search extra's (hypothesis), as explore's
    from ckpt_chaos.search.reduce import reduce

    runner = runner or run_scenario
    on_event = on_event or (lambda *_: None)
    started = time.monotonic()
    sm = Summary(trainer=trainer_name(p), seed=seed, budget_s=budget_s)
    left_out: Counter = Counter()
    a_side, b_side = pieces(p, gen, verdicts, left_out)
    order = draw(pairs(a_side, b_side, p, left_out), seed)
    sm.pairs, sm.left_out = len(order), dict(left_out)
    cache: dict[str, Attempt] = {}

    def judge(schedule: Schedule) -> Attempt:
        text, s = scenario_text(p, schedule)
        if text not in cache:
            t0 = time.monotonic()
            r = runner(s, out / "runs", golden_root)
            checks = causal(r.checks)
            ident = identity(checks) if r.verdict == "fail" else None
            root = next((c for c in checks if c["verdict"] == "fail" and c["check"] == ident), {})
            cache[text] = a = Attempt(s.name, r.verdict, ident, root.get("detail") or r.reason, r.run_dir,
                                      round(time.monotonic() - t0, 1), [pc.source for pc, _ in schedule])
            sm.schedules += 1
            sm.run_s += a.wall_s
            sm.not_fired += any(c["check"] == "fault_fired" and c["verdict"] == "fail" for c in checks)
            on_event("run", a)
        return cache[text]

    def shrink(schedule: Schedule, attempt: Attempt) -> tuple[Schedule, Attempt]:
        """``reduce``'s deletion pass: drop B, drop A, keeping a removal that fails the same way."""
        _, s = scenario_text(p, schedule)
        piece = {_signature(f): pc for f, (pc, _) in zip(s.faults, schedule)}

        def fails(faults, _world):
            smaller = [(piece[_signature(f)], f.attempt) for f in faults]
            if not smaller or any(launch < pc.alone.get("attempt", 0) for pc, launch in smaller):
                return None  # nothing left, or a relaunch's own fault with no relaunch to strike
            if len(smaller) == 1 and (verdicts or {}).get(smaller[0][0].source) == "pass":
                sm.known_pass += 1
                return None  # its own scenario: the suite saw it pass
            a = judge(smaller)
            return a if a.identity == attempt.identity else None

        faults, _, attempt = reduce(s.faults, None, attempt, fails, lambda: True)
        return [(piece[_signature(f)], f.attempt) for f in faults], attempt

    known: set[str] = set()
    for a_piece, b_piece in order:
        if time.monotonic() - started >= budget_s:
            break
        attempt = judge([(a_piece, 0), (b_piece, 1)])
        if attempt.identity is None or attempt.identity in known:
            continue
        known.add(attempt.identity)
        found_after = round(time.monotonic() - started, 1)
        schedule, attempt = shrink([(a_piece, 0), (b_piece, 1)], attempt)
        finding = _write_and_rerun(p, schedule, attempt, out, golden_root, seed, runner, verdicts is not None)
        finding.found_after_s = found_after
        (sm.findings if finding.reproduced else sm.not_reproduced).append(finding)
        on_event("finding", finding)
    sm.wall_s = round(time.monotonic() - started, 1)
    sm.run_s = round(sm.run_s, 1)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(sm.to_dict(), indent=1) + "\n")
    return sm


def _write_and_rerun(p: Profile, schedule: Schedule, attempt: Attempt, out: Path, golden_root: Path, seed: int,
                     runner: Callable, suite_ran: bool) -> Finding:
    """The finding's scenario file, loaded back and run once more: reproduced only if it fails the same way
    (else its file is removed)."""
    from ckpt_chaos.scenario import load

    found = out / "found"
    found.mkdir(parents=True, exist_ok=True)
    name = f"{trainer_name(p)}--search--{slug(attempt.identity)}"
    path = found / f"{name}.toml"
    sources = " then ".join(f"{pc.source} (launch {launch})" for pc, launch in schedule)
    alone = "each passed alone in the suite" if suite_ran else "no suite ran them alone here"
    header = (f"# Found by the audit's search (seed {seed}): the audit's faults {sources}, composed ({alone}).\n"
              f"# It failed {attempt.identity}: {attempt.detail[:300]}\n"
              f"# Reproduce: ckpt-chaos run {path}\n")
    text, _ = scenario_text(p, schedule, header)
    path.write_text(text)
    rerun = runner(load(path), out / "reruns", golden_root)
    again = {c["check"] for c in rerun.checks if c["verdict"] == "fail"}
    finding = Finding(attempt.identity, attempt.detail, str(path), [pc.source for pc, _ in schedule],
                      attempt.identity in again, attempt.run_dir, rerun.reason)
    if not finding.reproduced:
        path.unlink()
        finding.file = ""
    return finding


# ---- the command lines' side ---------------------------------------------------------------------------------

def parse_budget(value) -> float:
    """``90s``, ``10m``, ``1h`` or plain seconds (a number, or a TOML integer) -> seconds, more than 0."""
    text = str(value).strip()
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        seconds = float(text[:-1]) * units[text[-1]] if text and text[-1] in units else float(text)
    except ValueError:
        seconds = float("nan")
    if isinstance(value, bool) or not 0 < seconds < float("inf"):
        raise ValueError(f"{value!r} is not a time to search for; give one such as 90s, 10m or 1h, or seconds "
                         "(600)")
    return seconds


def describe(sm: Summary, found_in: Path | None = None) -> list[str]:
    """The search's outcome in lines: its findings, each with its file to replay, then its figures."""
    out = []
    for f in sm.findings:
        out.append(f"FINDING (search) {' then '.join(f.composed)}: {f.identity}: {f.detail}  (repro: {f.file}; "
                   f"run: {f.run_dir})")
    for f in sm.not_reproduced:
        out.append(f"did not reproduce (search) {' then '.join(f.composed)}: {f.identity} when first run, but its file "
                   f"ran {f.rerun_reason or 'otherwise'}; not a finding (run: {f.run_dir})")
    left = "; ".join(f"{n} {why}" for why, n in sm.left_out.items())
    out.append(f"search: {sm.schedules} schedule(s) run of {sm.pairs} composable ({sm.not_fired} with a fault that "
               f"did not fire), {len(sm.findings)} finding(s), {len(sm.not_reproduced)} not reproduced; "
               f"{sm.wall_s:.0f}s (budget {sm.budget_s:.0f}s, seed {sm.seed})"
               + (f"; not composed: {left}" if left else "") + (f"; {found_in / 'summary.json'}" if found_in else ""))
    return out


def run_after_suite(p: Profile, gen: list[Generated], cells: list[dict], out: Path, golden_root: Path,
                    budget_s: float, seed: int, say: Callable[[str], None]) -> Summary:
    """The audit's search after its suite (``audit --budget``): the faults whose cell passed, composed."""
    verdicts = {c["scenario"]: c["verdict"] for c in cells}
    say(f"search: two faults composed across launches, for {budget_s:.0f}s (seed {seed}); runs in {out}")

    def show(kind: str, obj) -> None:
        if kind == "run":
            say(f"  {obj.identity or obj.verdict:<16} {' then '.join(obj.composed)}  ({obj.wall_s:.0f}s)")

    sm = search(p, gen, out, golden_root, budget_s, seed, verdicts, on_event=show)
    for line in describe(sm, out):
        say(line)
    return sm


def from_file(path: Path, golden_root: Path, families: tuple[str, ...]) -> tuple[Profile, list[Generated],
                                                                                     dict[str, str] | None]:
    """The trainer of ``explore --command FILE``: a scenario file's ``[command]`` table (its fault-free run
    made or found, and read as the audit reads it), or an audit's ``profile.json`` (with the suite's
    verdicts where its ``matrix.json`` lies beside it). The profile, its generated scenarios (checked as
    the audit checks them) and the verdicts (None: not known). A bad file is a ValueError saying why."""
    from ckpt_chaos.audit.discover import discover
    from ckpt_chaos.audit.generate import check, generate
    from ckpt_chaos.run.command import golden_run
    from ckpt_chaos.scenario import load

    verdicts = None
    if path.suffix == ".json":
        try:
            p = Profile.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise ValueError(f"{path}: not an audit's profile.json ({type(e).__name__}: {e}); give the profile.json "
                             "that ckpt-chaos audit wrote, or a scenario file with a [command] table") from None
        matrix = path.parent / "matrix.json"
        if matrix.is_file():
            verdicts = {c["scenario"]: c["verdict"] for c in json.loads(matrix.read_text()).get("cells", [])}
        golden = Path(p.golden) if Path(p.golden).is_dir() else None
    elif path.suffix == ".toml":
        s = load(path)  # a malformed file is a ScenarioError naming the key
        if s.command is None:
            raise ValueError(f"{path}: no [command] table: explore --command takes a scenario file of a [command] "
                             "trainer, or an audit's profile.json; a Python module trainer is --trainer MODULE")
        golden = golden_run(dataclasses.replace(s, faults=[]), golden_root)  # as the audit's: no faultfs
        c = s.command
        declared = {k: v for k, v in (("complete", c.complete), ("save_every", c.save_every),
                                      ("keep_last", c.keep_last)) if v not in (None, "*")}
        p = discover(golden, declared)
        p.command = {**p.command, "key": list(c.key)}
    else:
        raise ValueError(f"{path}: give a scenario file (.toml) with a [command] table, or an audit's profile.json")
    if p.complete is None:
        raise ValueError(f"{path}: cannot tell which checkpoint the trainer resumes from: " + "; ".join(p.problems)
                         + " (declare command.complete in the scenario file)")
    gen = check(generate(p, families), path.parent / "scenarios", golden)
    return p, gen, verdicts
