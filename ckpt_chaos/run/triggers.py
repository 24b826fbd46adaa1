"""When faults fire: count probe events against each fault's trigger. No clocks, no randomness.

The generator sees the probe events in the order the controller receives them and answers,
for each event, which faults fire on it. Each fault fires at most once. Counting per rank (a
trigger with ``rank``) is deterministic because one rank's events arrive in program order;
counting over all ranks is deterministic in *where* it fires, not in which rank gets there first.
"""

from __future__ import annotations

import fnmatch
from collections import defaultdict

from ckpt_chaos.scenario import Fault, Trigger


def launch_of(event: dict) -> int:
    """The launch an event belongs to: harness relaunches and torchrun restarts both count."""
    return int(event.get("attempt", 0)) + int(event.get("restart", 0))


class Generator:
    def __init__(self, faults: list[Fault]):
        self.faults = list(faults)
        self.fired: dict[int, dict] = {}  # fault index -> the event it fired on
        self._matches: dict[int, int] = defaultdict(int)
        self._saves: dict[tuple[int, int], int] = defaultdict(int)  # (launch, rank) -> saves begun
        self._saving: dict[tuple[int, int], str] = {}  # (launch, rank) -> name of the save in progress

    def observe(self, event: dict) -> list[tuple[int, Fault]]:
        """The faults that fire on this event (usually none)."""
        launch, rank = launch_of(event), event["rank"]
        if event["point"] == "ckpt.stage":
            self._saves[(launch, rank)] += 1
            self._saving[(launch, rank)] = event.get("info", {}).get("name")
        due = []
        for i, fault in enumerate(self.faults):
            if i in self.fired or fault.attempt != launch:
                continue
            if not self._matches_trigger(fault.when, event, self._saves[(launch, rank)],
                                         self._saving.get((launch, rank))):
                continue
            self._matches[i] += 1
            if self._matches[i] == fault.when.nth:
                self.fired[i] = event
                due.append((i, fault))
        return due

    @staticmethod
    def _matches_trigger(t: Trigger, event: dict, saves_begun: int, saving: str | None) -> bool:
        info = event.get("info", {})
        name = info.get("name", saving)  # shard events belong to the save in progress
        return (event["point"] == t.point
                and (t.rank is None or event["rank"] == t.rank)
                and (t.step is None or info.get("step") == t.step)
                and (t.name is None or name == t.name)
                and (t.save is None or saves_begun == t.save)
                and (t.min_fraction is None or info.get("fraction", 0.0) >= t.min_fraction)
                and (t.path is None or fnmatch.fnmatch(info.get("path", ""), t.path)))

    def unfired(self) -> list[tuple[int, Fault]]:
        return [(i, f) for i, f in enumerate(self.faults) if i not in self.fired]
