"""Ordered faults (``when.after``) and the race check: a scenario whose faults fire on the events of
different processes declares their order, and the harness holds a later trigger until the fault it
waits for has fired, so no verdict depends on which process is quicker (docs/scenarios.md)."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from ckpt_chaos.config import builtin_scenarios
from ckpt_chaos.run.triggers import Generator
from ckpt_chaos.scenario import Fault, ScenarioError, Trigger, catalogue, load
from tests.helpers import REPO

HEAD = """
world_size = 2
[trainer]
max_steps = 8
ckpt_every_steps = 4
dataset_size = 96
global_batch = 16
grad_accum = 2
"""


def scenario(tmp_path, faults: str, head: str = HEAD):
    path = tmp_path / "s.toml"
    path.write_text(textwrap.dedent(head) + textwrap.dedent(faults))
    return path


TWO_RANKS = """
[[faults]]
kind = "kill"
target = "all"
when = {{ point = "step.end", rank = 0, step = 5{a0} }}

[[faults]]
kind = "kill"
target = "rank:1"
when = {{ point = "step.end", rank = 1, step = 6{a1} }}
"""


def test_two_faults_on_different_ranks_with_no_order_are_refused_with_the_fix(tmp_path):
    with pytest.raises(ScenarioError) as e:
        load(scenario(tmp_path, TWO_RANKS.format(a0="", a1="")))
    message = str(e.value)
    assert message.startswith(f"{tmp_path / 's.toml'}: faults[1].when: "), message
    assert "rank 1's step.end" in message and "rank 0's step.end" in message, message
    assert "depends on which process is quicker" in message, message
    assert "after = 0 in faults[1].when" in message and "after = 1 in faults[0].when" in message, message


def test_the_uploader_against_a_rank_is_a_race_and_after_settles_it(tmp_path):
    head = HEAD + "\n[remote]\n"
    faults = """
    [[faults]]
    kind = "toxic"
    toxic = "timeout"
    attributes = {{ timeout = 0 }}
    when = {{ point = "upload.begin"{a} }}

    [[faults]]
    kind = "kill"
    target = "all"
    when = {{ point = "step.end", rank = 0, step = 6 }}
    """
    with pytest.raises(ScenarioError, match=r"faults\[1\]\.when: fault 1 \(kill\) fires on rank 0's step.end and "
                                            r"fault 0 \(toxic\) on the uploader's upload.begin"):
        load(scenario(tmp_path, faults.format(a=""), head))
    # the toxic waits for the kill: the order is declared, whichever it is
    assert load(scenario(tmp_path, faults.format(a=", after = 1"), head)).faults[0].when.after == 1


@pytest.mark.parametrize("faults", [
    # one process: its events arrive in its program order
    """
    [[faults]]
    kind = "disk_full"
    when = { point = "step.end", rank = 0, step = 3 }
    [[faults]]
    kind = "kill"
    target = "all"
    when = { point = "step.end", rank = 0, step = 6 }
    """,
    # different launches: ordered by the launches
    """
    [[faults]]
    kind = "kill"
    target = "all"
    when = { point = "step.end", rank = 0, step = 5 }
    [[faults]]
    kind = "kill"
    target = "rank:0"
    attempt = 1
    when = { point = "load.begin", rank = 1 }
    """,
    # one event, whichever rank reaches it: the faults fire on it together, in index order
    """
    [[faults]]
    kind = "corrupt"
    when = { point = "step.begin", step = 7 }
    [[faults]]
    kind = "kill"
    target = "all"
    when = { point = "step.begin", step = 7 }
    """,
])
def test_faults_one_process_or_launch_orders_are_no_race(tmp_path, faults):
    load(scenario(tmp_path, faults, HEAD + "\n[storage]\nfs = \"tmpfs\"\nsize_mb = 16\n"))


def test_an_order_through_a_chain_of_after_or_a_shared_event_is_declared(tmp_path):
    faults = """
    [[faults]]
    kind = "kill"
    target = "all"
    when = { point = "step.end", rank = 0, step = 2 }
    [[faults]]
    kind = "kill"
    target = "all"
    when = { point = "step.end", rank = 0, step = 2 }
    [[faults]]
    kind = "kill"
    target = "rank:1"
    when = { point = "step.end", rank = 1, step = 4, after = 0 }
    [[faults]]
    kind = "kill"
    target = "all"
    when = { point = "upload.durable", after = 2 }
    """
    s = load(scenario(tmp_path, faults, HEAD + "\n[remote]\n"))
    assert [f.when.after for f in s.faults] == [None, None, 0, 2]


@pytest.mark.parametrize("faults, key, problem, fix", [
    (TWO_RANKS.format(a0="", a1=", after = 2"), "faults[1].when.after", "no fault 2: the scenario has 2",
     "name the index of the fault this one waits for"),
    (TWO_RANKS.format(a0="", a1=", after = 1"), "faults[1].when.after", "a fault cannot wait for itself",
     "name another fault"),
    (TWO_RANKS.format(a0=", after = 1", a1=", after = 0"), "faults[0].when.after",
     "in a cycle (faults[0] -> faults[1] -> faults[0])", "drop after from one of them"),
])
def test_after_that_names_no_fault_itself_or_a_cycle_is_refused(tmp_path, faults, key, problem, fix):
    with pytest.raises(ScenarioError) as e:
        load(scenario(tmp_path, faults))
    message = str(e.value)
    assert message.startswith(f"{tmp_path / 's.toml'}: {key}: "), message
    assert problem in message and fix in message, message


def test_after_a_fault_of_a_later_launch_or_on_an_external_point_is_refused(tmp_path):
    later = """
    [[faults]]
    kind = "kill"
    target = "all"
    attempt = 1
    when = { point = "step.end", rank = 0, step = 7 }
    [[faults]]
    kind = "kill"
    target = "all"
    when = { point = "step.end", rank = 0, step = 5, after = 0 }
    """
    with pytest.raises(ScenarioError, match=r"faults\[1\]\.when\.after: fault 0 belongs to launch 1, which starts "
                                            r"after this fault's launch 0 has ended; name a fault of launch 0"):
        load(scenario(tmp_path, later))
    external = """
    probe = true
    [[faults]]
    kind = "kill"
    target = "all"
    when = { point = "step.end", rank = 0, step = 5 }
    [[faults]]
    kind = "kill"
    target = "all"
    when = { point = "fs.created", path = "checkpoints/*", after = 0 }
    """
    with pytest.raises(ScenarioError, match=r"faults\[1\]\.when\.after: fs.created is observed from outside: no "
                                            r"process waits at it"):
        load(scenario(tmp_path, external))


def test_the_catalogue_and_the_examples_declare_every_order_they_need():
    """Every built-in and example scenario loads, so none races; the one the issue found racing waits
    for its stop before its upload point's faults."""
    assert len(catalogue(builtin_scenarios())) > 100
    examples = sorted((REPO / "examples").glob("*/scenarios/*.toml"))
    assert examples and all(load(p) for p in examples)
    rot = load(builtin_scenarios() / "remote" / "local-rot-then-durable-copy-restored.toml")
    assert [f.when.after for f in rot.faults] == [None, 0, 0]


def event(point: str, rank: int = 0, role: str = "rank", **info) -> dict:
    return {"point": point, "rank": rank, "role": role, "attempt": 0, "restart": 0, "info": info}


def test_a_held_trigger_fires_on_the_event_it_matched_once_its_fault_has_fired():
    """The uploader reaches the durable point of step 8 before rank 0 ends step 9: the trigger is held
    on that event, and both faults that wait fire on it, in index order, when the stop fires."""
    g = Generator([Fault(kind="stop", target="all", when=Trigger(point="step.end", rank=0, step=9)),
                   Fault(kind="corrupt", when=Trigger(point="upload.durable", name="step_00000008", after=0)),
                   Fault(kind="kill", target="all", when=Trigger(point="upload.durable", name="step_00000008",
                                                                 after=0))])
    durable = event("upload.durable", role="uploader", name="step_00000008")
    assert g.observe(durable) == [] and g.waiting(durable) == [1, 2]
    assert not g.ready(1) and g.hopeless(1, 0) is None
    assert g.observe(event("step.end", step=8)) == []
    stop = event("step.end", step=9)
    assert [i for i, _ in g.observe(stop)] == [0]
    assert g.ready(1) and g.ready(2)
    assert [g.release(i).kind for i in g.waiting(durable)] == ["corrupt", "kill"]
    assert g.fired[1] is durable and g.fired[2] is durable and g.fired[0] is stop
    # a later event matching the same trigger is not counted again: the fault fired once
    assert g.observe(event("upload.durable", role="uploader", name="step_00000008")) == []


def test_without_a_hold_the_faults_of_one_event_fire_in_index_order_whatever_after_says():
    g = Generator([Fault(kind="kill", target="all", when=Trigger(point="step.end", rank=0, step=3, after=1)),
                   Fault(kind="corrupt", when=Trigger(point="step.end", rank=0, step=3))])
    assert [i for i, _ in g.observe(event("step.end", step=3))] == [1, 0]


def test_a_hold_whose_fault_belongs_to_an_ended_launch_is_hopeless():
    g = Generator([Fault(kind="kill", target="all", when=Trigger(point="step.end", rank=0, step=30)),
                   Fault(kind="kill", target="all", attempt=1, when=Trigger(point="step.end", rank=0, step=3,
                                                                            after=0))])
    e = {**event("step.end", step=3), "attempt": 1}
    assert g.observe(e) == [] and g.waiting(e) == [1]
    assert g.hopeless(1, 1) == "fault 0 belongs to launch 0, which ended without it firing"
    g.give_up(1, "gone")
    assert g.waiting(e) == [] and g.given_up == {1: "gone"}


def test_a_racing_schedule_of_the_search_gets_its_storys_order():
    """The search builds scenarios in Python and the loader's race check applies to them too: a
    schedule whose faults race is given the order of training, an upload's points after its save's."""
    from ckpt_chaos.search.schedule import build

    faults = [Fault(kind="kill", target="uploader", when=Trigger(point="upload.write", name="step_00000004")),
              Fault(kind="disk_full", when=Trigger(point="step.end", rank=1, step=3)),
              Fault(kind="kill", target="all", when=Trigger(point="step.end", rank=0, step=6))]
    s = build(faults, "reference_trainer")
    assert [f.when.after for f in s.faults] == [1, None, 0]
    # a schedule with no race keeps its faults as drawn
    alone = build([Fault(kind="kill", target="all", when=Trigger(point="step.end", rank=0, step=6))],
                  "reference_trainer")
    assert alone.faults[0].when.after is None


HELD = """
description = "rank 1's shard of the step-4 save gets a flipped byte once closed; rank 0, part-way through its own shard, is killed only after that (after = 0), however quick either rank is"
world_size = 2
[trainer]
max_steps = 12
ckpt_every_steps = 4
dataset_size = 96
global_batch = 16
grad_accum = 2

[[faults]]
kind = "corrupt"
corruption = "flip"
file = "__1_0.distcp"
checkpoint = "in_progress"
when = { point = "ckpt.shard.done", rank = 1, save = 1 }

[[faults]]
kind = "kill"
target = "all"
when = { point = "ckpt.shard.write", rank = 0, save = 1, min_fraction = 0.1, after = 0 }

[recovery]
relaunch = "none"
"""


@pytest.mark.nightly  # make test: the quiet ordered-fault tests
@pytest.mark.slow
def test_after_holds_the_later_trigger_until_the_earlier_fault_fired_on_a_loaded_machine(tmp_path, golden_root):
    """Both ranks write their shards of the first save at once; rank 0 mostly reaches a tenth of its
    shard before rank 1 has closed its own, so without an order the kill would come first and the
    flip never. With after = 0 rank 0 waits at its tenth while rank 1 finishes: the flip fires first,
    then the kill on rank 0's held event, rank 0 having gone no further. Under a CPU hog from
    stress-ng where it is installed (the Makefile installs it): one core's worth, as other tests run
    beside this one."""
    from ckpt_chaos.check.history import FaultFired, ProbeEvent, read_history
    from ckpt_chaos.run import load as background
    from ckpt_chaos.run.runner import run_scenario

    path = tmp_path / "held.toml"
    path.write_text(HELD)
    s = load(path)
    if background.missing():
        print(f"no background load: {background.missing()}")
        r = run_scenario(s, tmp_path / "runs", golden_root)
    else:
        with background.Load("cpu", tmp_path / "load", cores=1):
            r = run_scenario(s, tmp_path / "runs", golden_root)
    history = read_history(Path(r.run_dir))
    fired = {h.index: (n, h) for n, h in enumerate(history) if isinstance(h, FaultFired)}
    assert sorted(fired) == [0, 1], (r.reason, r.checks)
    (n0, flip), (n1, kill) = fired[0], fired[1]
    assert n0 < n1 and flip.t <= kill.t
    assert kill.at["point"] == "ckpt.shard.write" and kill.at["rank"] == 0
    assert 0.1 <= kill.at["info"]["fraction"] < 1.0, kill.at
    # rank 0 sent nothing between its held event and the kill: it waited there
    rank0 = [n for n, h in enumerate(history) if isinstance(h, ProbeEvent) and h.rank == 0 and h.role == "rank"
             and h.point == "ckpt.shard.write" and h.info == kill.at["info"]]
    assert rank0 and not [h for h in history[rank0[-1] + 1:n1] if isinstance(h, ProbeEvent) and h.rank == 0
                          and h.role == "rank"]
    done1 = [n for n, h in enumerate(history) if isinstance(h, ProbeEvent) and h.rank == 1
             and h.point == "ckpt.shard.done"]
    assert done1 and done1[0] < n0
    # held exactly when rank 0 got there first, and then for as long as rank 1 took to finish
    assert ("held_s" in kill.detail) == (rank0[-1] < done1[0]), kill.detail
    checks = {c["name"]: c["verdict"] for c in r.checks}
    assert checks["fault_0_fired"] == checks["fault_1_fired"] == "pass", r.checks


def _holds(tmp_path, idle_s: float = 30.0):
    from ckpt_chaos.check.history import History
    from ckpt_chaos.run.triggers import Holds

    g = Generator([Fault(kind="stop", target="all", when=Trigger(point="step.end", rank=0, step=9)),
                   Fault(kind="kill", target="all", when=Trigger(point="upload.durable", after=0))])
    return g, Holds(g, History(tmp_path / "history.jsonl"), idle_s=idle_s)


def test_a_held_sender_is_answered_once_the_fault_it_waits_for_fires_in_another_thread(tmp_path):
    """The runner's two threads as they run: the uploader's connection waits in ``Holds.wait`` while
    rank 0's connection, under the same lock, fires the stop; then the kill fires on the held event."""
    import threading

    g, holds = _holds(tmp_path)
    lock, fired, answers = threading.Lock(), [], []
    durable = event("upload.durable", role="uploader", name="step_00000008")

    def fire(i, fault, held_s):
        fired.append((i, held_s))
        holds.changed()
        return {"do": "continue", "fault": i}

    def uploader():
        with lock:
            assert g.observe(durable) == []
        answers.append(holds.wait(durable, lock, fire))

    t = threading.Thread(target=uploader)
    t.start()
    time.sleep(0.3)
    assert t.is_alive() and fired == []  # held: no answer yet
    stop = event("step.end", step=9)
    holds.heard(stop)
    with lock:
        for i, fault in g.observe(stop):
            fire(i, fault, None)
    t.join(5)
    assert not t.is_alive()
    assert [i for i, _ in fired] == [0, 1] and fired[1][1] >= 0.3
    assert answers == [{"do": "continue", "fault": 1}] and g.fired[1] is durable


@pytest.mark.parametrize("end, why", [
    ("launch", "launch 0 ended before fault 0 fired"),
    ("silence", "no process reported anything for 0 s while it was held"),
])
def test_a_hold_that_cannot_end_in_its_fault_is_let_go_and_recorded(tmp_path, end, why):
    """Nothing waits for ever: the launch's end, or a run where no process says anything (the held one
    is what the earlier trigger needs), lets the sender go without the fault, and says so."""
    import threading

    from ckpt_chaos.check.history import Held, read_history

    g, holds = _holds(tmp_path, idle_s=0.2 if end == "silence" else 30.0)
    durable = event("upload.durable", role="uploader", name="step_00000008")
    lock = threading.Lock()
    g.observe(durable)
    holds.heard(durable)
    if end == "launch":
        threading.Timer(0.2, holds.launch_over, args=(0,)).start()
    started = time.monotonic()
    assert holds.wait(durable, lock, lambda *a: pytest.fail("the fault fired")) is None
    assert time.monotonic() - started < 5
    (held,) = [h for h in read_history(tmp_path) if isinstance(h, Held)]
    assert (held.index, held.after, held.launch, held.at["point"]) == (1, 0, 0, "upload.durable")
    assert held.why.startswith(why) and 0 < held.held_s < 5  # how long it waited, the timer's 0.2 s or so
    assert g.given_up == {1: held.why} and 1 not in g.fired


def test_a_fault_whose_hold_was_let_go_is_unknown_saying_what_it_waited_for(tmp_path):
    from ckpt_chaos.check.outcome import faults_fired as _faults_fired
    from ckpt_chaos.check.history import Exited, FaultFired, Held
    from ckpt_chaos.check.verdict import Report, Run

    s = load(builtin_scenarios() / "remote" / "local-rot-then-durable-copy-restored.toml")
    at = {"point": "upload.durable", "rank": 0, "info": {"name": "step_00000008"}}
    history = [Held(index=i, launch=0, after=0, at=at, held_s=31.5, why="launch 0 ended before fault 0 fired")
               for i in (1, 2)] + [Exited(launch=0, rc=1, snapshot={})]
    report = Report()
    _faults_fired(Run(s, tmp_path, tmp_path, history, []), report)
    verdicts = [(c.verdict, c.detail) for c in report.checks]
    assert [v for v, _ in verdicts] == ["unknown"] * 3
    assert verdicts[1][1] == ("corrupt triggering never fired: its trigger matched upload.durable of the uploader in "
                              "launch 0, where it waited 31.5s for fault 0 (when.after) and was let go: launch 0 "
                              "ended before fault 0 fired; nothing of its effect can be checked")
    # the stop itself: no event matched it, the scenario's own, named as such
    assert "the scenario did not exercise what it states" in verdicts[0][1]
    fired = [FaultFired(index=0, fault="stop", target="all", launch=0, t=1.0,
                        at={"point": "step.end", "rank": 0, "info": {"step": 9}})]
    report = Report()
    _faults_fired(Run(s, tmp_path, tmp_path, fired + history, []), report)
    assert [c.verdict for c in report.checks] == ["pass", "unknown", "unknown"]
