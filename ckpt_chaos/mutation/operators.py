"""Mutation operators that plant the bugs checkpoint code really has (`make mutation-checkpoint`).

cosmic-ray's own operators change numbers, comparisons and binary operators; a checkpoint path
breaks in other ways: a durability call left out, a rename that publishes before the write is
done, a piece of state not saved or not restored, a bound off by one, a name missing from a
collection, an error swallowed, two restores in the wrong order. Each class below is a cosmic-ray
``Operator`` over parso nodes, registered under the entry point ``cosmic_ray.operator_providers``
as the provider ``checkpoint`` (pyproject.toml), so its mutants are named
``checkpoint/<Operator>`` and made, applied and recorded by cosmic-ray like its own.

An operator that moves or drops whole statements works on the block that holds them (a
``suite`` or the module): the visitor sees one node at a time, and only the block can reorder
its children. The prefix of each statement slot (its indentation, blank lines and comments)
stays where it was, so a diff shows the statements that moved and nothing else.

Only cosmic-ray (started by ``ckpt_chaos.mutation.driver``) imports this module, through the entry
point; it needs the ``mutation`` extra.
"""

from __future__ import annotations

import re
from typing import Iterator

from cosmic_ray.operators.operator import Example, Operator
from parso.python.tree import Name, Operator as OperatorLeaf
from parso.tree import BaseNode, Leaf, NodeOrLeaf

# A call statement whose callee ends in one of these makes data durable or visible.
DURABLE = frozenset({"fsync", "fdatasync", "flush", "sync", "replace", "rename"})
# Callees that write data (the write a rename or a pointer publishes).
WRITES = frozenset({"write", "writelines", "write_bytes", "write_text", "write_durably", "save", "async_save",
                    "dump", "copy", "copy2", "copyfile", "copytree", "upload_file", "upload_fileobj", "put_object"})
PUBLISH = frozenset({"rename", "replace"})
# Callees that read a checkpoint back (with the restores, what a swallowed error hides on load).
LOADS = frozenset({"load", "load_checkpoint", "read_manifest", "validate", "download_file"})
POINTER = re.compile(r"latest|pointer", re.IGNORECASE)
# Keys that name a part of a training job's state (what a checkpoint must carry).
STATE_KEYS = frozenset({"rng", "loader", "dataloader", "sampler", "scheduler", "progress", "counters", "step",
                        "micro", "microbatches", "tokens_seen", "epoch", "model", "optim", "optimizer", "meta",
                        "grads", "torch", "cuda", "numpy", "python", "config", "best_loss", "partial_loss",
                        "partial_ids"})
RESTORE_EXACT = frozenset({"set_state_dict", "set_rng_state", "set_rng_state_all", "set_state", "setstate"})
CONSTANT = re.compile(r"^[A-Z][A-Z0-9_]*$")


# ---- reading parso nodes ----------------------------------------------------------------------

def _text(node: NodeOrLeaf, code: str) -> Leaf:
    """A leaf that prints as ``code`` in ``node``'s place, with ``node``'s prefix. Only the code is
    read after a mutation (cosmic-ray writes ``get_code()``), so a leaf may hold an expression."""
    return Name(code, node.start_pos, prefix=node.get_first_leaf().prefix)


def _is_op(node: NodeOrLeaf, *values: str) -> bool:
    return node.type in ("operator", "keyword") and node.value in values


def _is_one(node: NodeOrLeaf) -> bool:
    return node.type == "number" and node.value == "1"


def _bare(node: NodeOrLeaf) -> str:
    return node.get_code(include_prefix=False)


def _callee(node: NodeOrLeaf) -> str | None:
    """The last name of the callee when ``node`` is a call (``os.fsync(fd)`` -> ``fsync``)."""
    if node.type not in ("atom_expr", "power") or len(node.children) < 2:
        return None
    last, before = node.children[-1], node.children[-2]
    if last.type != "trailer" or last.children[0].value != "(":
        return None
    if before.type == "name":
        return before.value
    if before.type == "trailer" and before.children[0].value == "." and before.children[1].type == "name":
        return before.children[1].value
    return None


def _call_args(node: NodeOrLeaf) -> str:
    return _bare(node.children[-1])[1:-1]


def _walk(node: NodeOrLeaf) -> Iterator[NodeOrLeaf]:
    yield node
    if isinstance(node, BaseNode):
        for child in node.children:
            yield from _walk(child)


def _called(node: NodeOrLeaf) -> Iterator[tuple[str, NodeOrLeaf]]:
    """Every call in ``node``, as (last name of the callee, the trailer's owner up to the call)."""
    for n in _walk(node):
        if n.type not in ("atom_expr", "power"):
            continue
        for k in range(1, len(n.children)):
            t = n.children[k]
            if t.type == "trailer" and t.children[0].value == "(":
                before = n.children[k - 1]
                if before.type == "name":
                    yield before.value, t
                elif before.type == "trailer" and before.children[0].value == "." and before.children[1].type == "name":
                    yield before.children[1].value, t


def _statements(block: NodeOrLeaf) -> list[NodeOrLeaf]:
    """The statements of a block (a ``suite`` or the module), in order; [] for any other node."""
    if block.type not in ("suite", "file_input"):
        return []
    return [c for c in block.children if c.type not in ("newline", "endmarker")]


def _only_small(stmt: NodeOrLeaf) -> NodeOrLeaf | None:
    """The statement of a line that holds just one (``x()`` but not ``x(); y()``)."""
    if stmt.type == "simple_stmt" and len(stmt.children) == 2 and stmt.children[1].type == "newline":
        return stmt.children[0]
    return None


def _call_statement(stmt: NodeOrLeaf) -> str | None:
    """The callee's last name when ``stmt`` is a statement that is only a call."""
    small = _only_small(stmt)
    return None if small is None else _callee(small)


def _small_statements(node: NodeOrLeaf) -> list[NodeOrLeaf]:
    """The statements of one line (``a(); b()`` has two), when ``node`` is such a line."""
    if node.type != "simple_stmt":
        return []
    return [c for c in node.children if c.type != "newline" and not (c.type == "operator" and c.value == ";")]


def _is_restore(name: str | None) -> bool:
    return name is not None and ("restore" in name or name.endswith("load_state_dict") or name in RESTORE_EXACT)


def _assigned(stmt: NodeOrLeaf) -> set[str]:
    """The names a statement (or any statement inside it) binds with ``=``, ``as`` or ``for``."""
    out = set()
    for n in _walk(stmt):
        targets: list[NodeOrLeaf] = []
        if n.type == "expr_stmt":
            ops = [i for i, c in enumerate(n.children) if c.type == "operator" and c.value == "="]
            targets = n.children[:ops[-1]] if ops else n.children[:1]
        elif n.type in ("with_item", "for_stmt", "comp_for", "sync_comp_for"):
            targets = [n.children[2] if n.type == "with_item" else n.children[1]]
        out |= {x.value for t in targets for x in _walk(t) if x.type == "name"}
    return out


def _used(stmt: NodeOrLeaf) -> set[str]:
    return {n.value for n in _walk(stmt) if n.type == "name"}


def _ends_line(stmts: list[NodeOrLeaf]) -> bool:
    """Whether each statement ends its line: only then can statements trade places."""
    return all(s.get_code().endswith("\n") for s in stmts)


def _reorder(block: BaseNode, order: list[int]) -> BaseNode:
    """Put the block's statements in ``order`` (indexes into ``_statements``), each statement slot
    keeping its own prefix."""
    stmts = _statements(block)
    prefixes = [s.get_first_leaf().prefix for s in stmts]
    moved = [stmts[i] for i in order]
    for s, prefix in zip(moved, prefixes):
        s.get_first_leaf().prefix = prefix
    it = iter(moved)
    block.children = [next(it) if c.type not in ("newline", "endmarker") else c for c in block.children]
    for s in moved:
        s.parent = block
    return block


def _drop_small(node: NodeOrLeaf, small: NodeOrLeaf) -> NodeOrLeaf:
    """``small``, one statement of the line ``node``, replaced by ``pass``."""
    node.children[node.children.index(small)] = _text(small, "pass")
    return node


class _StatementDropper(Operator):
    """Replace with ``pass`` each statement of a line that ``wanted`` picks."""

    def _picked(self, node) -> list[NodeOrLeaf]:
        return [s for s in _small_statements(node) if self.wanted(s)]

    def wanted(self, small: NodeOrLeaf) -> bool:
        raise NotImplementedError

    def mutation_positions(self, node):
        for s in self._picked(node):
            yield s.start_pos, s.end_pos

    def mutate(self, node, index):
        return _drop_small(node, self._picked(node)[index])


# ---- the operators ----------------------------------------------------------------------------

class DropDurabilityCall(_StatementDropper):
    """A call statement that makes data durable or visible (``os.fsync``, ``fdatasync``, a
    ``flush``, ``os.replace``/``os.rename`` and a path's ``replace``/``rename``, or a helper whose
    name says fsync) becomes ``pass``."""

    def wanted(self, small):
        name = _callee(small)
        return name is not None and (name in DURABLE or "fsync" in name or "fdatasync" in name)

    @classmethod
    def examples(cls):
        return (Example("def f(fd):\n    os.fsync(fd)\n", "def f(fd):\n    pass\n"),
                Example("f.write(b); f.flush()\n", "f.write(b); pass\n"),
                Example("os.replace(a, b)\nfsync_path(d)\n", "os.replace(a, b)\npass\n", occurrence=1))


class PublishBeforeWrite(Operator):
    """A rename (``os.rename``, ``os.replace``, a path's ``rename``/``replace``) or a write of a
    pointer (a write whose arguments name ``latest`` or a pointer) moves to just before the nearest
    earlier statement of its block that writes or publishes: the published name appears before
    what it names is written. Assignments between the two that the moved statement reads move
    with it; where one of them depends on another statement in between, there is no mutant."""

    @staticmethod
    def _publishes(stmt: NodeOrLeaf) -> bool:
        small = _only_small(stmt)
        name = None if small is None else _callee(small)
        return name is not None and (name in PUBLISH or name in WRITES and bool(POINTER.search(_call_args(small))))

    @staticmethod
    def _writes(stmt: NodeOrLeaf) -> bool:
        return any(name in WRITES or name in PUBLISH for name, _ in _called(stmt))

    def _moves(self, node) -> list[tuple[int, list[int]]]:
        """(index of the write, indexes of the statements that move before it, in order)."""
        stmts = _statements(node)
        out = []
        for i, s in enumerate(stmts):
            if not self._publishes(s):
                continue
            j = next((j for j in range(i - 1, -1, -1) if self._writes(stmts[j])), None)
            if j is None or _assigned(stmts[j]) & _used(s):
                continue
            between = range(j + 1, i)
            group, needs, ok = [], _used(s), True
            for k in reversed(between):  # the assignments the moved statement reads, and theirs
                bound = _assigned(stmts[k])
                if bound & needs:
                    if stmts[k].type != "simple_stmt" or _assigned(stmts[j]) & _used(stmts[k]):
                        ok = False
                        break
                    group.insert(0, k)
                    needs |= _used(stmts[k])
            if not ok or not _ends_line([stmts[k] for k in range(j, i + 1)]):
                continue
            out.append((j, [*group, i]))
        return out

    def mutation_positions(self, node):
        stmts = _statements(node)
        for _, group in self._moves(node):
            yield stmts[group[-1]].start_pos, stmts[group[-1]].end_pos

    def mutate(self, node, index):
        j, group = self._moves(node)[index]
        n = len(_statements(node))
        rest = [k for k in range(n) if k not in group]
        at = rest.index(j)
        return _reorder(node, rest[:at] + group + rest[at:])

    @classmethod
    def examples(cls):
        return (Example("def f():\n    write(tmp)\n    log()\n    os.rename(tmp, p)\n",
                        "def f():\n    os.rename(tmp, p)\n    write(tmp)\n    log()\n"),
                Example("os.rename(t, f)\nfsync(r)\nwrite_durably(root / LATEST, n)\n",
                        "write_durably(root / LATEST, n)\nos.rename(t, f)\nfsync(r)\n"))


class DropStateEntry(Operator):
    """One entry of the saved or restored state disappears: a ``key: value`` of a dict literal of
    state whose key names a part of the state (``rng``, ``loader``, ``scheduler``, a counter), is
    computed (``f"rank{r}"``), or whose value is read from a state (``ts.loader.state_dict()``;
    a manifest's ``created`` or ``loss`` is not state), an assignment
    ``state["key"] = ...`` of such a key, or a restore call statement (``restore_*``,
    ``*.load_state_dict``, ``set_state_dict``, ``set_rng_state``, ``setstate``) made ``pass``."""

    @staticmethod
    def _entries(node) -> list[list[NodeOrLeaf]]:
        """A dict literal's entries (each its nodes, ``k : v`` or ``** v``), if it is one of state."""
        if node.type != "dictorsetmaker" or any(c.type in ("comp_for", "sync_comp_for") for c in node.children):
            return []
        entries, cur = [], []
        for c in node.children:
            if c.type == "operator" and c.value == ",":
                entries.append(cur)
                cur = []
            else:
                cur.append(c)
        if cur:
            entries.append(cur)
        if not all(len(e) == 3 and _is_op(e[1], ":") or len(e) == 2 and _is_op(e[0], "**")
                   for e in entries):
            return []  # a set
        keys = {_key(e[0]) for e in entries if len(e) == 3}
        state_valued = any(re.search(r"state|rng", _bare(v), re.IGNORECASE) for e in entries for v in e[-1:])
        return entries if keys & STATE_KEYS or state_valued else []

    @staticmethod
    def _statement(small: NodeOrLeaf) -> bool:
        if _is_restore(_callee(small)):
            return True
        if small.type != "expr_stmt" or len(small.children) != 3 or not _is_op(small.children[1], "="):
            return False
        target = small.children[0]
        if target.type not in ("atom_expr", "power") or target.children[-1].type != "trailer":
            return False
        sub = target.children[-1]
        if not _is_op(sub.children[0], "["):
            return False
        owner = _bare(target)[: -len(_bare(sub))]
        return _key(sub.children[1]) in STATE_KEYS or "state" in owner.lower()

    @staticmethod
    def _of_state(entry: list[NodeOrLeaf]) -> bool:
        if len(entry) == 2:  # ** spread
            return True
        key = _key(entry[0])
        return (key is None or entry[0].type == "fstring" or key in STATE_KEYS
                or bool(re.search(r"state|rng", _bare(entry[2]), re.IGNORECASE)))

    def _positions(self, node) -> list[tuple[str, object]]:
        out: list[tuple[str, object]] = [("entry", i) for i, e in enumerate(self._entries(node)) if self._of_state(e)]
        out += [("statement", s) for s in _small_statements(node) if self._statement(s)]
        return out

    def mutation_positions(self, node):
        entries = self._entries(node)
        for kind, what in self._positions(node):
            if kind == "entry":
                e = entries[what]
                yield e[0].start_pos, e[-1].end_pos
            else:
                yield what.start_pos, what.end_pos

    def mutate(self, node, index):
        kind, what = self._positions(node)[index]
        if kind == "statement":
            return _drop_small(node, what)
        entries = self._entries(node)
        return _drop_item(node, [c for e in entries for c in e], entries, what)

    @classmethod
    def examples(cls):
        return (Example('s = {"rng": r, "loader": l}\n', 's = {"rng": r}\n', occurrence=1),
                Example('s = {"rng": r, "loader": l}\n', 's = {"loader": l}\n'),
                Example("def f(ts, sd):\n    ts.loader.load_state_dict(sd)\n", "def f(ts, sd):\n    pass\n"),
                Example('state["grads"] = g\n', "pass\n"))


def _key(node: NodeOrLeaf) -> str | None:
    """A dict key's text without quotes, a prefix of an f-string's (``f"rank{r}"`` -> ``rank``)."""
    code = _bare(node)
    m = re.match(r"^[rbfuRBFU]*(['\"])([A-Za-z_]*)", code)
    return m.group(2) if m else None


def _drop_item(node: BaseNode, flat: list[NodeOrLeaf], items: list[list[NodeOrLeaf]], index: int) -> NodeOrLeaf:
    """``node`` (a comma-separated list of ``items``) without item ``index`` and one comma by it;
    None when nothing would be left (the container's brackets stay)."""
    children = node.children
    first = children.index(items[index][0])
    last = children.index(items[index][-1])
    if last + 1 < len(children) and _is_op(children[last + 1], ","):
        drop = range(first, last + 2)  # the item and the comma after it
    else:
        drop = range(first - 1 if first > 0 else first, last + 1)  # the last item and the comma before it
    prefix = children[first].get_first_leaf().prefix
    kept = [c for k, c in enumerate(children) if k not in drop]
    if not kept:
        return None
    if first == 0:  # the new first item takes the old first's place
        kept[0].get_first_leaf().prefix = prefix
    node.children = kept
    return node


class OffByOne(Operator):
    """A bound or a counter off by one: each bound of a slice ``+ 1`` and ``- 1`` (``[:-k]`` ->
    ``[:-k + 1]``), the stop of a ``range`` ``+ 1`` and ``- 1``, and a ``+ 1`` or ``- 1`` of a
    sum dropped (``step + 1`` -> ``step``)."""

    @staticmethod
    def _bounds(node) -> list[NodeOrLeaf]:
        if node.type == "subscript":
            owner = node.parent.parent  # subscript < trailer < the sliced expression
            if owner is not None and owner.children[0].type in ("string", "fstring", "strings"):
                return []  # a message cut to a length: no state is bounded by it
            return [c for c in node.children if not (c.type == "operator" and c.value == ":") and c.type != "sliceop"]
        if _callee(node) == "range" and len(node.children) == 2:
            args = node.children[-1].children[1:-1]
            if len(args) == 1 and args[0].type == "arglist":
                parts = [a for a in args[0].children if not (a.type == "operator" and a.value == ",")]
                return [parts[1]] if len(parts) >= 2 and parts[1].type != "argument" else []
            return [args[0]] if len(args) == 1 and args[0].type != "argument" else []
        return []

    @staticmethod
    def _ones(node) -> list[int]:
        """Indexes of each ``+``/``-`` operator followed by the literal 1 in a sum (or of the 1 that leads it)."""
        if node.type != "arith_expr":
            return []
        c = node.children
        out = [k for k in range(1, len(c) - 1, 2) if _is_op(c[k], "+", "-") and _is_one(c[k + 1])]
        if _is_one(c[0]) and _is_op(c[1], "+"):
            out.insert(0, 0)
        return out

    def mutation_positions(self, node):
        # all of them before the first is yielded: the visitor mutates the node between two
        spans = [(b.start_pos, b.end_pos) for b in self._bounds(node) for _ in "+-"]
        spans += [(node.children[k].start_pos, node.children[k + 1].end_pos) for k in self._ones(node)]
        return spans

    def mutate(self, node, index):
        bounds = self._bounds(node)
        if index < 2 * len(bounds):
            b = bounds[index // 2]
            code = _bare(b)
            if b.type not in ("name", "number", "atom", "atom_expr", "power", "factor"):
                code = f"({code})"
            parent = b.parent
            parent.children[parent.children.index(b)] = _text(b, f"{code} {'+-'[index % 2]} 1")
            return node
        k = self._ones(node)[index - 2 * len(bounds)]
        c = node.children
        if k == 0:  # 1 + x -> x
            rest = c[2:]
            rest[0].get_first_leaf().prefix = c[0].get_first_leaf().prefix
        else:
            rest = c[:k] + c[k + 2:]
        if len(rest) == 1:
            return rest[0]
        node.children = rest
        return node

    @classmethod
    def examples(cls):
        return (Example("x = a[:-k]\n", "x = a[:-k + 1]\n"),
                Example("x = a[:-k]\n", "x = a[:-k - 1]\n", occurrence=1),
                Example("x = a[: n.keep]\n", "x = a[: n.keep - 1]\n", occurrence=1),
                Example("x = step + 1\n", "x = step\n"),
                Example("for i in range(n):\n    pass\n", "for i in range(n - 1):\n    pass\n", occurrence=1),
                Example("for i in range(1, n):\n    pass\n", "for i in range(1, n + 1):\n    pass\n"))


class DropCollectionName(Operator):
    """One element removed from a tuple, set or list literal of names: every element a string, or
    every element a constant's name (``(TMP_PREFIX, TRASH_PREFIX)``), two elements at least."""

    @staticmethod
    def _items(node) -> list[NodeOrLeaf]:
        if node.type != "atom" or len(node.children) != 3 or not _is_op(node.children[0], "(", "[", "{"):
            return []
        inner = node.children[1]
        if inner.type not in ("testlist_comp", "dictorsetmaker"):
            return []
        if any(c.type in ("comp_for", "sync_comp_for") or c.type == "operator" and c.value in (":", "**")
               for c in inner.children):
            return []
        items = [c for c in inner.children if not (c.type == "operator" and c.value == ",")]
        strings = all(i.type in ("string", "fstring") for i in items)
        constants = all(i.type == "name" and CONSTANT.match(i.value) for i in items)
        return items if len(items) >= 2 and (strings or constants) else []

    def mutation_positions(self, node):
        for i in self._items(node):
            yield i.start_pos, i.end_pos

    def mutate(self, node, index):
        items = self._items(node)
        inner = node.children[1]
        _drop_item(inner, items, [[i] for i in items], index)
        left = [c for c in inner.children if not (c.type == "operator" and c.value == ",")]
        if _is_op(node.children[0], "(") and len(left) == 1 and not _is_op(inner.children[-1], ","):
            inner.children.append(OperatorLeaf(",", inner.children[-1].end_pos))  # still a tuple
        return node

    @classmethod
    def examples(cls):
        return (Example('if p.startswith(("a", "b")):\n    pass\n', 'if p.startswith(("b",)):\n    pass\n'),
                Example("x = {'a', 'b', 'c'}\n", "x = {'a', 'c'}\n", occurrence=1),
                Example("x = (TMP, TRASH)\n", "x = (TMP,)\n", occurrence=1))


class SwallowException(Operator):
    """An error on the save or load path is swallowed: a ``raise`` becomes ``pass`` (a handler
    swallows what it caught, ``except ...: raise``, or a guard lets through the failure it found,
    ``if bad: raise ...``), and a call statement that writes, publishes, makes durable or loads (a
    line of its own in a block) is wrapped in ``try: ... except Exception: pass``."""

    @staticmethod
    def _wraps(node) -> bool:
        if node.type != "simple_stmt" or node.parent is None or node.parent.type not in ("suite", "file_input"):
            return False
        name = _call_statement(node)
        # only calls that do I/O: what a fault can make raise (a restore that never raises under any
        # fault would make a mutant nothing can kill)
        return name is not None and (name in WRITES or name in DURABLE or name in LOADS or "fsync" in name)

    def mutation_positions(self, node):
        if node.type == "raise_stmt" or node.type == "keyword" and node.value == "raise" and node.parent.type == "simple_stmt":
            yield node.start_pos, node.end_pos
        elif self._wraps(node):
            yield node.start_pos, node.end_pos

    def mutate(self, node, index):
        if node.type != "simple_stmt":
            return _text(node, "pass")
        indent = node.get_first_leaf().prefix.rpartition("\n")[2]
        return _text(node, f"try:\n{indent}    {_bare(_only_small(node))}\n{indent}except Exception:\n{indent}    pass\n")

    @classmethod
    def examples(cls):
        return (Example("try:\n    f()\nexcept OSError:\n    raise\n", "try:\n    f()\nexcept OSError:\n    pass\n"),
                Example("if bad:\n    raise SaveFailed('x') from e\n", "if bad:\n    pass\n"),
                Example("def f():\n    log()\n    write_durably(p, b)\n",
                        "def f():\n    log()\n    try:\n        write_durably(p, b)\n    except Exception:\n        pass\n"))


class SwapRestoreCalls(Operator):
    """Two restore call statements of a block with no other restore between them trade places
    (the statements between stay), unless the later one reads a name bound between them."""

    def _pairs(self, node) -> list[tuple[int, int]]:
        stmts = _statements(node)
        calls = [i for i, s in enumerate(stmts) if _is_restore(_call_statement(s))]
        out = []
        for i, k in zip(calls, calls[1:]):
            bound = set().union(*(_assigned(stmts[m]) for m in range(i + 1, k)))
            if not bound & _used(stmts[k]) and _ends_line([stmts[i], stmts[k]]):
                out.append((i, k))
        return out

    def mutation_positions(self, node):
        stmts = _statements(node)
        for i, k in self._pairs(node):
            yield stmts[i].start_pos, stmts[k].end_pos

    def mutate(self, node, index):
        i, k = self._pairs(node)[index]
        order = list(range(len(_statements(node))))
        order[i], order[k] = k, i
        return _reorder(node, order)

    @classmethod
    def examples(cls):
        return (Example("def f(ts, sd):\n    restore_meta(ts, m)\n    x = 1\n    restore_loader(ts, l)\n",
                        "def f(ts, sd):\n    restore_loader(ts, l)\n    x = 1\n    restore_meta(ts, m)\n"),)


OPERATORS = {op.__name__: op for op in (DropDurabilityCall, PublishBeforeWrite, DropStateEntry, OffByOne,
                                         DropCollectionName, SwallowException, SwapRestoreCalls)}


class OperatorProvider:
    """cosmic-ray's provider of the checkpoint operators (entry point ``checkpoint``)."""

    def __iter__(self):
        return iter(OPERATORS)

    def __getitem__(self, name):
        return OPERATORS[name]
