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
from dataclasses import dataclass, field
from pathlib import Path

# the fault families generate.py writes scenarios for (docs/audit.md); here, so that the command line's
# parser names them without importing the generator
FAMILIES = ("mid-write", "commit", "power-loss", "term", "disk-full", "errno", "kill", "load", "corrupt")
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
