"""``ckpt-chaos audit``: a trainer's resilience matrix from its command line alone.

The trainer's command (with ``{ckpt_dir}`` where its checkpoint folder goes) runs fault-free under
the probe layer and fanotify, as the golden run of any ``[command]`` scenario does
(``run/command.py``). ``discover.py`` reads that run into a profile (the saves, their files and
writers, how each commits, the cadence, the retention, the ``complete`` rule); ``generate.py`` turns
the profile into ordinary scenario files; ``ckpt-chaos run``'s own suite runner runs them, and
``matrix.py`` reads its results into the fault × point matrix. The command line is in
``ckpt_chaos/subcommands/audit.py``; the reference is docs/audit.md.
"""

from __future__ import annotations

import glob
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# the fault families generate.py writes scenarios for (docs/audit.md); here, so that the command line's
# parser names them without importing the generator
FAMILIES = ("mid-write", "commit", "power-loss", "term", "disk-full", "errno", "kill", "load", "resize", "corrupt")
# corrupt only when asked: its check (faults/storage.py, corruption_detected) counts a rejection by the
# reference trainer's ckpt_rejected event, which a [command] trainer never writes, so a trainer that
# passes over the damaged checkpoint and resumes from the one before would fail it
DEFAULT_FAMILIES = tuple(f for f in FAMILIES if f != "corrupt")


@dataclass
class Spec:
    """The trainer as the audit is told of it: what a scenario's ``[command]`` table says, and the
    keys it cannot infer when declared (``complete``, ``save_every``, ``keep_last``)."""

    argv: list[str]
    nproc: int = 2
    launcher: str = "torchrun"
    relaunch_argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    key: list[str] = field(default_factory=list)
    declared: dict = field(default_factory=dict)
    source: str = "ckpt-chaos audit"
    """Where it was given (the command line, or the pyproject.toml), for messages."""

    def command_table(self) -> dict:
        table = {"argv": self.argv, "key": self.key or default_key(self.argv), "complete": "*"}
        if self.launcher != "torchrun":
            table["launcher"] = self.launcher
        if self.relaunch_argv:
            table["relaunch_argv"] = self.relaunch_argv
        if self.env:
            table["env"] = self.env
        return table

    def scenario(self):
        """The fault-free scenario of the trainer, validated as a scenario file's ``[command]`` is
        (a bad placeholder or launcher is a ScenarioError naming the key)."""
        from ckpt_chaos.scenario import from_dict

        return from_dict({"command": self.command_table(), "world_size": self.nproc, "suites": []},
                         self.source, "audit-golden")


def default_key(argv: list[str]) -> list[str]:
    """The files of the command line that key its golden run: the arguments that are files here (its
    script), so that an edit of the trainer makes a new one."""
    return [a for a in argv if "{" not in a and not a.startswith("-") and Path(a).is_file()
            and not glob.has_magic(a)]


def golden(spec: Spec, root: Path | None = None) -> Path:
    """The trainer's fault-free run (made, or found in the cache): ``command.golden_run``."""
    from ckpt_chaos.run.command import golden_run

    return golden_run(spec.scenario(), root)


# ---- the audit's scenario files: TOML as generate.py and changes.py write it ----------------------------

def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {toml_value(x)}" for k, x in v.items()) + " }"
    return "[" + ", ".join(toml_value(x) for x in v) + "]"


def _key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def toml_text(data: dict, comment: str = "") -> str:
    """A scenario's tables as a scenario file: its keys, then its tables, then its arrays of tables."""
    def tables_of(v: Any) -> bool:
        return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)

    lines = [f"# {line}" if not line.startswith("#") else line for line in comment.splitlines()]
    lines += [f"{_key(k)} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, dict) and not tables_of(v)]
    for k, v in data.items():
        if isinstance(v, dict):
            lines += ["", f"[{k}]"] + [f"{_key(x)} = {toml_value(y)}" for x, y in v.items()]
    for k, v in data.items():
        if tables_of(v):
            for t in v:
                lines += ["", f"[[{k}]]"] + [f"{_key(x)} = {toml_value(y)}" for x, y in t.items()]
    return "\n".join(lines) + "\n"
