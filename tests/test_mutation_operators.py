"""The checkpoint mutation operators (ckpt_chaos/mutation/operators.py): for small snippets, the
positions each finds and the source each mutant becomes; their registration with cosmic-ray; and
how `make mutation` picks them and caches their verdicts. Pure: nothing is trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("cosmic_ray")

from cosmic_ray.ast import ast_nodes, get_ast  # noqa: E402
from cosmic_ray.mutating import mutate_code  # noqa: E402

from ckpt_chaos import mutation  # noqa: E402
from ckpt_chaos.mutation import operators as ops  # noqa: E402
from ckpt_chaos.mutation.cache import remember  # noqa: E402
from ckpt_chaos.mutation.driver import annotate  # noqa: E402
from ckpt_chaos.mutation.results import collect, figures, results_name, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def positions(op: type, source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    o = op()
    return [p for node in ast_nodes(get_ast(source)) for p in o.mutation_positions(node)]


def mutants(op: type, source: str) -> list[str]:
    """Every mutant ``op`` makes of ``source``, in occurrence order; each must still compile."""
    out = [mutate_code(source, op(), i) for i in range(len(positions(op, source)))]
    for m in out:
        compile(m, "<mutant>", "exec")
    return out


@pytest.mark.parametrize("op", list(ops.OPERATORS.values()), ids=list(ops.OPERATORS))
def test_each_operator_s_own_examples_hold(op):
    for ex in op.examples():
        assert mutate_code(ex.pre_mutation_code, op(**ex.operator_args), ex.occurrence) == ex.post_mutation_code


def test_the_operators_are_registered_with_cosmic_ray_as_the_checkpoint_provider():
    from cosmic_ray.plugins import get_operator, operator_names

    names = [n for n in operator_names() if n.startswith("checkpoint/")]
    assert sorted(names) == sorted(f"checkpoint/{n}" for n in ops.OPERATORS)
    assert get_operator("checkpoint/DropDurabilityCall") is ops.DropDurabilityCall


WRITE_DURABLY = '''\
def write_durably(path, data):
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    fsync_path(path.parent)
'''


def test_drop_durability_call_finds_each_flush_fsync_and_rename_statement():
    assert [p[0] for p in positions(ops.DropDurabilityCall, WRITE_DURABLY)] == [(5, 8), (6, 8), (7, 4), (8, 4)]
    got = mutants(ops.DropDurabilityCall, WRITE_DURABLY)
    assert "        pass\n        os.fsync(f.fileno())" in got[0]
    assert "    pass\n    fsync_path(path.parent)" in got[2]
    # a call inside an expression, or a write, is not a durability statement
    assert positions(ops.DropDurabilityCall, "x = os.fsync(fd)\nf.write(b)\n") == []


COMMIT = '''\
def commit(self, tmp, name):
    write_durably(tmp / MANIFEST, body)
    probe.point("ckpt.manifest")
    final = self.root / name
    if final.exists():
        self._quarantine(final, "superseded")
    os.rename(tmp, final)
    fsync_path(self.root)
    write_durably(self.root / LATEST, name.encode())
'''


def test_publish_before_write_moves_the_rename_and_what_it_reads_before_the_write():
    assert [p[0] for p in positions(ops.PublishBeforeWrite, COMMIT)] == [(7, 4), (9, 4)]
    rename, latest = mutants(ops.PublishBeforeWrite, COMMIT)
    body = [line.strip() for line in rename.split("\n")[1:7]]
    assert body == ["final = self.root / name", "os.rename(tmp, final)", "write_durably(tmp / MANIFEST, body)",
                    'probe.point("ckpt.manifest")', "if final.exists():", 'self._quarantine(final, "superseded")']
    # the pointer moves before the rename that makes its checkpoint visible
    assert [line.strip() for line in latest.split("\n")[6:9]] == [
        "write_durably(self.root / LATEST, name.encode())", "os.rename(tmp, final)", "fsync_path(self.root)"]


def test_publish_before_write_makes_no_mutant_where_the_write_binds_what_it_publishes():
    source = "def f():\n    tmp = write(data)\n    os.replace(tmp, dest)\n"
    assert positions(ops.PublishBeforeWrite, source) == []
    # nor where a name it reads comes from a compound statement in between
    source = "def f():\n    write(a)\n    with x() as tmp:\n        pass\n    os.replace(tmp, dest)\n"
    assert positions(ops.PublishBeforeWrite, source) == []


STATE = '''\
def rank_state(ts):
    return {"rng": capture_rng(), "loader": ts.loader.state_dict()}


def other():
    phases = {"write_s": 0.0, "sync_s": 1.0}
    return {k: v for k, v in phases.items()}


def restore(ts, meta, state):
    ts.scheduler.load_state_dict(meta["scheduler"])
    restore_loader(ts, meta["loader"])
    state["grads"] = {}
    phases["x"] = 1
'''


def test_drop_state_entry_drops_a_state_dict_s_entries_restore_calls_and_state_assignments():
    assert [p[0][0] for p in positions(ops.DropStateEntry, STATE)] == [2, 2, 11, 12, 13]
    got = mutants(ops.DropStateEntry, STATE)
    assert '    return {"loader": ts.loader.state_dict()}' in got[0]
    assert '    return {"rng": capture_rng()}' in got[1]
    assert "def restore(ts, meta, state):\n    pass\n    restore_loader" in got[2]
    assert '    restore_loader(ts, meta["loader"])\n    pass\n' in got[4]


def test_drop_state_entry_empties_a_one_entry_dict_and_leaves_multiline_ones_tidy():
    assert mutants(ops.DropStateEntry, 'x = {"model": m}\n') == ["x = {}\n"]
    source = 's = {\n    "model": m,\n    "optim": o,\n    "meta": b,\n}\n'
    assert mutants(ops.DropStateEntry, source)[1] == 's = {\n    "model": m,\n    "meta": b,\n}\n'


SLICES = '''\
keep = set(ckpts[: cfg.keep_last])
for skipped in names[:-1]:
    pass
for i in range(1, n, 2):
    pass
err = f"{e}"[:500]
x = step + 1
y = 1 + total - 1
first = names[0]
'''


def test_off_by_one_moves_slice_bounds_range_stops_and_drops_a_plus_one():
    got = mutants(ops.OffByOne, SLICES)
    changed = [next(b for a, b in zip(SLICES.split("\n"), m.split("\n")) if a != b) for m in got]
    assert changed == ["keep = set(ckpts[: cfg.keep_last + 1])", "keep = set(ckpts[: cfg.keep_last - 1])",
                       "for skipped in names[:-1 + 1]:", "for skipped in names[:-1 - 1]:",
                       "for i in range(1, n + 1, 2):", "for i in range(1, n - 1, 2):",
                       "x = step", "y = total - 1", "y = 1 + total"]
    assert [m.split("\n")[5] for m in got] == [SLICES.split("\n")[5]] * len(got)  # a message's length: untouched


def test_drop_collection_name_removes_one_name_and_keeps_a_tuple_a_tuple():
    source = 'if p.startswith((TMP_PREFIX, TRASH_PREFIX)):\n    pass\nk = {"a", "b", "c"}\nm = ("a", 1)\n'
    assert [p[0] for p in positions(ops.DropCollectionName, source)] == [(1, 17), (1, 29), (3, 5), (3, 10), (3, 15)]
    got = mutants(ops.DropCollectionName, source)
    assert got[0].startswith("if p.startswith((TRASH_PREFIX,)):")
    assert got[1].startswith("if p.startswith((TMP_PREFIX,)):")
    assert 'k = {"a", "c"}' in got[3]
    assert positions(ops.DropCollectionName, 'x = ("a",)\ny = [k for k in ("a", "b")]\n')[0][0] == (2, 17)


def test_swallow_exception_turns_each_raise_into_pass_and_wraps_each_i_o_call_statement():
    source = "try:\n    load()\nexcept OSError as e:\n    log(e)\n    raise\nif bad:\n    raise SaveFailed(x) from e\n"
    got = mutants(ops.SwallowException, source)
    assert got == [source.replace("    load()\n", "    try:\n        load()\n    except Exception:\n        pass\n"),
                   source.replace("    raise\n", "    pass\n"), source.replace("raise SaveFailed(x) from e", "pass")]
    # a call that does no I/O, or one inside an expression or on an ``if`` line, is not wrapped
    assert positions(ops.SwallowException, "log(x)\nrestore_rng(r)\nok = validate(p)\nif x: fsync_path(p)\n") == []


LOAD = '''\
def load(ts, state):
    restore_model_and_optimizer(ts, state["model"], state["optim"])
    restore_meta(ts, _unblob(state["meta"]))
    per_rank = _unblob(state["rank"])
    restore_loader(ts, per_rank["loader"])
    restore_rank_rng(ts, per_rank["rng"])
'''


def test_swap_restore_calls_swaps_neighbours_but_not_past_what_the_later_one_reads():
    assert [p[0][0] for p in positions(ops.SwapRestoreCalls, LOAD)] == [2, 5]  # not meta <-> loader: per_rank
    first, second = mutants(ops.SwapRestoreCalls, LOAD)
    assert first.split("\n")[1:3] == ['    restore_meta(ts, _unblob(state["meta"]))',
                                      '    restore_model_and_optimizer(ts, state["model"], state["optim"])']
    assert second.split("\n")[4:6] == ['    restore_rank_rng(ts, per_rank["rng"])',
                                       '    restore_loader(ts, per_rank["loader"])']


def test_the_reference_trainer_s_checkpoint_path_has_the_mutants_the_operators_are_for():
    def lines(op, file):
        source = (ROOT / file).read_text()
        text = source.split("\n")
        return {text[p[0][0] - 1].strip() for p in positions(op, source)}

    ckpt, state = "reference_trainer/checkpoint.py", "reference_trainer/state.py"
    assert {"os.rename(tmp, final)", "write_durably(self.root / LATEST, name.encode())"} <= lines(ops.PublishBeforeWrite, ckpt)
    assert {"os.rename(tmp, final)", "fsync_path(self.root)"} <= lines(ops.DropDurabilityCall, ckpt)
    assert "keep = set(ckpts[: self.cfg.keep_last])" in lines(ops.OffByOne, ckpt)
    assert 'restore_meta(ts, _unblob(state["meta"]))' in lines(ops.DropStateEntry, state)
    assert 'return {"rng": capture_rng(), "loader": ts.loader.state_dict()}' in lines(ops.DropStateEntry, state)
    assert "restore_model_and_optimizer(ts, state[\"model\"], state[\"optim\"])" in lines(ops.SwapRestoreCalls, state)


# ---- how `make mutation` picks them and caches their verdicts ----------------------------------------

CKPT = "reference_trainer/checkpoint.py"


def _session(tmp_path):
    """A session with one core and one checkpoint mutant of the commit's rename line."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import MutationSpec, WorkItem

    source = (ROOT / CKPT).read_text()
    line = next(n for n, t in enumerate(source.split("\n"), 1) if t.strip() == "os.rename(tmp, final)")
    drop = positions(ops.DropDurabilityCall, source)
    occurrence = next(i for i, p in enumerate(drop) if p[0][0] == line)
    tmp_path.mkdir(parents=True, exist_ok=True)
    session = tmp_path / "s.sqlite"
    with use_db(str(session), WorkDB.Mode.create) as db:
        db.add_work_item(WorkItem(job_id="core", mutations=[MutationSpec(CKPT, "core/NumberReplacer", 0,
                                                                         (line, 8), (line, 9))]))
        db.add_work_item(WorkItem(job_id="ckpt", mutations=[MutationSpec(
            CKPT, "checkpoint/DropDurabilityCall", occurrence, drop[occurrence][0], drop[occurrence][1])]))
    return session, line


def test_a_run_of_the_checkpoint_operators_leaves_cosmic_ray_s_own_out_of_scope(tmp_path):
    from cosmic_ray.work_db import WorkDB, use_db

    session, line = _session(tmp_path)
    base = {"walls": {"quick": 1.0}, "reached": {CKPT: {str(line): ["quick"]}}}
    counts = annotate(session, base, [CKPT], None, 0, [], operators="checkpoint")
    assert (counts["out of scope"], counts["to run"]) == (1, 1)
    with use_db(str(session), WorkDB.Mode.open) as db:
        assert [i.job_id for i in db.pending_work_items] == ["ckpt"]
    m = next(m for m in collect(session) if m["job"] == "ckpt")
    assert "-        os.rename(tmp, final)" in m["diff"] and "+        pass" in m["diff"]
    assert results_name("checkpoint") == "mutation-checkpoint" and results_name("core") == "mutation"


def test_a_verdict_is_cached_by_mutated_file_and_operator_and_reused_by_the_next_run(tmp_path):
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

    session, line = _session(tmp_path)
    base = {"walls": {"quick": 1.0}, "reached": {CKPT: {str(line): ["quick"]}}}
    cache = tmp_path / "cache"
    verdict = {"status": "killed", "scenario": "quick", "checks": ["durability"], "wall_s": 4.0}
    with use_db(str(session), WorkDB.Mode.open) as db:
        db.set_result("ckpt", WorkResult(output=mutation.OUTCOME + json.dumps(verdict),
                                         worker_outcome=WorkerOutcome.NORMAL, test_outcome=TestOutcome.KILLED))
    done = [m for m in collect(session) if m["job"] == "ckpt"]
    assert remember(cache, done, "print-1") == 1
    assert remember(cache, done, "print-1") == 0  # kept once

    again, _ = _session(tmp_path / "next")
    counts = annotate(again, base, [CKPT], None, 0, [], operators="checkpoint", cache=cache, print_="print-1")
    assert (counts["cached"], counts["to run"]) == (1, 0)
    m = next(m for m in collect(again) if m["job"] == "ckpt")
    assert m["status"] == "killed" and m["cached"] and m["checks"] == ["durability"]
    f = figures([m])
    assert f["mutants_run"] == 0 and f["mutants_cached"] == 1
    assert f["operators"]["checkpoint/DropDurabilityCall"]["killed"] == 1
    # the trainer or the harness changed: the verdict no longer applies
    third, _ = _session(tmp_path / "third")
    counts = annotate(third, base, [CKPT], None, 0, [], operators="checkpoint", cache=cache, print_="print-2")
    assert (counts["cached"], counts["to run"]) == (0, 1)


def test_a_checkpoint_run_reports_its_score_per_operator_in_a_file_of_its_own(tmp_path):
    session, _ = _session(tmp_path)
    done = [{**m, "status": "survived", "ran": ["quick"], "wall_s": 5.0} for m in collect(session)
            if m["job"] == "ckpt"]
    sample = {"limit": None, "seed": 0, "files": [CKPT], "named": None, "operators": "checkpoint", "to run": 1,
              "not reached": 0, "equivalent": 0, "not sampled": 0, "cached": 0}
    path = write_results(done, "python -m ckpt_chaos.mutation --operators checkpoint",
                                  {"sample": sample, "exec_wall_s": 5.0}, results=tmp_path / "results")
    assert path.name == "mutation-checkpoint.json"
    md = (tmp_path / "results" / "mutation-checkpoint.md").read_text()
    assert "the checkpoint operators' mutants" in md and "By operator" in md
    assert "`checkpoint/DropDurabilityCall`" in md and "-        os.rename(tmp, final)" in md  # the survivor's diff
