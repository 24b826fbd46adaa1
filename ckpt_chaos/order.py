"""The order of a scenario's faults: which process reports each trigger, the order declared with
``when.after``, and the races left, where two faults of one launch fire on the events of different
processes and nothing says which comes first.

Two processes run side by side, so which of them reaches its point first is the machine's to decide:
a quiet machine gives one order and a loaded one the other, and so would the verdict. One process's
own events arrive in its program order, so two triggers on one process need no declaration; faults of
different launches are ordered by the launches. Any other pair must be linked by a chain of
``after``: ``after = i`` on fault j holds j's trigger until fault i has fired (``run/triggers.py``),
so j cannot fire first whoever is quicker. The format is in docs/scenarios.md.
"""

from __future__ import annotations

from dataclasses import asdict

from ckpt_chaos.env.storage import FAULTFS_POINTS
from ckpt_chaos.scenario_model import Fault, Scenario

# The reference trainer's points that only rank 0 reports (reference_trainer/checkpoint.py, remote.py).
RANK0_POINTS = ("ckpt.metadata", "ckpt.fsync", "ckpt.manifest", "ckpt.commit", "ckpt.latest", "ckpt.retention",
                "remote.download", "remote.restored")
# The points of the remote tier's uploader, a process of its own (role "uploader").
UPLOADER_POINTS = ("upload.begin", "upload.write", "upload.object", "upload.verify", "upload.durable",
                   "upload.failed", "upload.end", "remote.retention")

Process = tuple[str, "int | None"]  # ("rank" | "faultfs", rank or None: any) | ("uploader" | "harness", None)


def process(s: Scenario, f: Fault) -> Process:
    """The process whose events ``f``'s trigger counts: a rank (None: any rank of the launch), the
    uploader, faultfs on behalf of a rank (its events come from the file system, not from the rank's
    own program order), or the harness (an external point it polls for)."""
    point, rank = f.when.point, f.when.rank
    if f.when.external:
        return ("harness", None)
    if point in UPLOADER_POINTS:
        return ("uploader", None)
    if rank is None and (s.world_size == 1 or (s.command is None and point in RANK0_POINTS)):
        rank = 0
    return ("faultfs" if point in FAULTFS_POINTS else "rank", rank)


def describe(p: Process) -> str:
    kind, rank = p
    if kind == "uploader":
        return "the uploader"
    if kind == "harness":
        return "the harness's poll of the run directory"
    who = "any rank" if rank is None else f"rank {rank}"
    return f"faultfs (for {who})" if kind == "faultfs" else who


def _same_event(a: Fault, b: Fault) -> bool:
    """Two triggers that match the same events, so fire on the same one, in index order."""
    strip = lambda f: {k: v for k, v in asdict(f.when).items() if k != "after"}
    return strip(a) == strip(b) and a.attempt == b.attempt


def waits_for(s: Scenario, j: int) -> list[int]:
    """The faults fault ``j`` waits for, through its chain of ``after``, nearest first."""
    chain, seen = [], {j}
    i = s.faults[j].when.after
    while i is not None and 0 <= i < len(s.faults) and i not in seen:
        chain.append(i)
        seen.add(i)
        i = s.faults[i].when.after
    return chain


def _ordered(s: Scenario, i: int, j: int) -> bool:
    """Fault ``j`` cannot fire before fault ``i``: ``i`` is in its chain of ``after``, or fires on the same
    event as one that is (the faults of one event fire together, before a held trigger is let go)."""
    a = s.faults[i]
    return any(k == i or (_same_event(s.faults[k], a) and s.faults[k].when.after == a.when.after)
               for k in waits_for(s, j))


def problems(s: Scenario) -> list[tuple[str, str, str]]:
    """What is wrong with the declared order, as (key, problem, fix): ``after`` naming no fault, the
    fault itself, a fault of a later launch, a trigger nobody waits at, or a cycle."""
    out = []
    n = len(s.faults)
    for j, f in enumerate(s.faults):
        i, key = f.when.after, f"faults[{j}].when.after"
        if i is None:
            continue
        if not 0 <= i < n:
            out.append((key, f"no fault {i}: the scenario has {n} (faults[0] to faults[{n - 1}])",
                        "name the index of the fault this one waits for, counting [[faults]] tables from 0"))
        elif i == j:
            out.append((key, "a fault cannot wait for itself", "name another fault, or drop after"))
        elif s.faults[i].attempt > f.attempt:
            out.append((key, f"fault {i} belongs to launch {s.faults[i].attempt}, which starts after this fault's "
                        f"launch {f.attempt} has ended", f"name a fault of launch {f.attempt} or an earlier one"))
        elif f.when.external:
            out.append((key, f"{f.when.point} is observed from outside: no process waits at it, so nothing can "
                        "be held until fault " + str(i) + " fired", f"put the order on the other fault (after = {j} "
                        f"in faults[{i}].when), or aim this one at a probe point"))
    if out:
        return out
    for j in range(n):
        chain = [j]
        i = s.faults[j].when.after
        while i is not None and 0 <= i < n and i not in chain:
            chain.append(i)
            i = s.faults[i].when.after
        if i == j:
            loop = " -> ".join(f"faults[{k}]" for k in chain + [j])
            out.append((f"faults[{j}].when.after", f"the faults wait for each other in a cycle ({loop}): none "
                        "of them would ever fire", "drop after from one of them"))
            break
    return out


def races(s: Scenario) -> list[tuple[int, int, Process, Process]]:
    """Pairs (i, j), i < j, of faults of one launch that fire on the events of different processes
    (or of any rank, which may be either) with no chain of ``after`` between them."""
    procs = [process(s, f) for f in s.faults]
    out = []
    for j, b in enumerate(s.faults):
        for i in range(j):
            a = s.faults[i]
            if a.attempt != b.attempt or _same_event(a, b):
                continue
            if procs[i] == procs[j] and procs[i][0] in ("uploader", "harness"):
                continue
            if procs[i] == procs[j] and procs[i][1] is not None:
                continue
            if _ordered(s, i, j) or _ordered(s, j, i):
                continue
            out.append((i, j, procs[i], procs[j]))
    return out


def race_problems(s: Scenario) -> list[tuple[str, str, str]]:
    """Each race as (key, problem, fix), the fix being the order to declare."""
    out = []
    for i, j, pi, pj in races(s):
        a, b = s.faults[i], s.faults[j]
        where = (f"fault {j} ({b.kind}) fires on {describe(pj)}'s {b.when.point} and fault {i} ({a.kind}) on "
                 f"{describe(pi)}'s {a.when.point}" if pi != pj else
                 f"faults {i} ({a.kind}) and {j} ({b.kind}) both fire on {describe(pi)}'s events, which may come "
                 f"from different ranks")
        out.append((f"faults[{j}].when", f"{where}, in launch {a.attempt}, with no order declared: which fires "
                    "first depends on which process is quicker, so on the machine's load",
                    f"declare the order the scenario means: after = {i} in faults[{j}].when (the harness holds "
                    f"fault {j}'s trigger until fault {i} has fired), or after = {j} in faults[{i}].when"
                    + ("; or set when.rank on both" if pi == pj else "")))
    return out
