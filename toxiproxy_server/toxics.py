"""Toxics: what the API stores (toxics/toxic.go's ToxicWrapper, parsed as toxic_collection.go does),
and what each does to the data of one connection (toxics/*.go).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol

from toxiproxy_server.errors import (INVALID_STREAM, INVALID_TOXIC_TYPE, TOXIC_EXISTS, ApiError, _bad_body, _get,
                                     _object)


class Link(Protocol):
    """What an effect needs of the link it acts on (``link.Link``, which imports this module): to wait
    until a time or for a while, False where the effect was removed or replaced meanwhile."""

    def sleep_until(self, target: float, owner: Effect | None) -> bool: ...

    def sleep_for(self, seconds: float, owner: Effect | None) -> bool: ...


UPSTREAM, DOWNSTREAM = "upstream", "downstream"
LATENCY_BUFFER = 1024  # the real latency toxic's channel buffer, in chunks

# Each toxic type's attributes and their defaults, as the Go structs in toxics/*.go declare them.
TOXIC_ATTRIBUTES: dict[str, dict[str, int]] = {
    "noop": {},
    "latency": {"latency": 0, "jitter": 0},
    "bandwidth": {"rate": 0},
    "slow_close": {"delay": 0},
    "timeout": {"timeout": 0},
    "reset_peer": {"timeout": 0},
    "slicer": {"average_size": 0, "size_variation": 0, "delay": 0},
    "limit_data": {"bytes": 0},
}


@dataclass(frozen=True, eq=False)
class Toxic:
    name: str
    type: str
    stream: str  # as the client spelled it (the real server keeps the spelling)
    toxicity: float
    attributes: dict[str, int]
    seq: int  # toxics of a stream run in the order they were added; an update keeps the place

    @property
    def direction(self) -> str:
        return self.stream.lower()

    def to_json(self) -> dict[str, Any]:
        toxicity = int(self.toxicity) if self.toxicity.is_integer() else self.toxicity
        return {"attributes": dict(self.attributes), "name": self.name, "type": self.type,
                "stream": self.stream, "toxicity": toxicity}


def _attributes(toxic_type: str, raw: Any, current: dict[str, int]) -> dict[str, int]:
    """The toxic's attributes after decoding ``raw`` over ``current``; unknown keys are ignored."""
    if raw is None:
        return dict(current)
    raw = _object(raw, f"toxics.{toxic_type}")
    return {key: _get(raw, key, int, value) for key, value in current.items()}


def parse_toxic(body: Any, seq: int, taken: Callable[[str], bool]) -> Toxic:
    """A new toxic from a POST body, with the real server's checks in the real server's order."""
    body = _object(body, "toxics.ToxicWrapper")
    stream = _get(body, "stream", str, DOWNSTREAM)
    toxic_type = _get(body, "type", str, "")
    name = _get(body, "name", str, "")
    toxicity = _get(body, "toxicity", (int, float), 1.0)
    if body.get("attributes") is not None and not isinstance(body["attributes"], dict):
        raise _bad_body("json: cannot unmarshal attributes into Go struct field ToxicWrapper.attributes")
    if stream.lower() not in (UPSTREAM, DOWNSTREAM):
        raise ApiError(*INVALID_STREAM)
    if toxic_type not in TOXIC_ATTRIBUTES:
        raise ApiError(*INVALID_TOXIC_TYPE)
    name = name or f"{toxic_type}_{stream}"
    if taken(name):
        raise ApiError(*TOXIC_EXISTS)
    attributes = _attributes(toxic_type, body.get("attributes"), TOXIC_ATTRIBUTES[toxic_type])
    return Toxic(name=name, type=toxic_type, stream=stream, toxicity=toxicity, attributes=attributes, seq=seq)


def updated_toxic(toxic: Toxic, body: Any) -> Toxic:
    """The toxic after a POST/PATCH of new attributes and toxicity (what is not given stays)."""
    body = _object(body, "toxics.ToxicWrapper")
    return Toxic(name=toxic.name, type=toxic.type, stream=toxic.stream, seq=toxic.seq,
                 toxicity=_get(body, "toxicity", (int, float), toxic.toxicity),
                 attributes=_attributes(toxic.type, body.get("attributes"), toxic.attributes))


@dataclass(slots=True)
class Chunk:
    data: bytes
    stamp: float  # time.monotonic() when the proxy read it: latency counts from here


class CloseLink(Exception):
    """Close the link's destination; the toxics after position ``seq`` still see the end."""

    def __init__(self, seq: float):
        self.seq = seq


class ResetConnection(Exception):
    """End the whole connection with a TCP RST."""


class Dropped(Exception):
    """The connection was torn down from outside (proxy disabled, deleted, peer gone)."""


class Effect:
    """One toxic acting on one link. The default acts as the real ``noop`` toxic."""

    buffer = 0  # extra chunks the link may hold for this toxic
    closes_when_removed = False

    def __init__(self, toxic: Toxic, link: Link, previous: Effect | None):
        self.toxic, self.link, self.seq = toxic, link, toxic.seq
        self.attrs = toxic.attributes
        self.applies = random.random() < toxic.toxicity
        self.interrupted = False  # removed or replaced: whatever it holds must flow on at once

    def pipe(self, chunk: Chunk) -> Iterator[Chunk]:
        yield chunk

    def on_end(self) -> None:
        """The stream ended (or an earlier toxic closed it)."""

    def deadline(self) -> float | None:
        """When this toxic closes the link by itself, on the monotonic clock."""
        return None


class Latency(Effect):
    buffer = LATENCY_BUFFER

    def pipe(self, chunk: Chunk) -> Iterator[Chunk]:
        delay, jitter = self.attrs["latency"], self.attrs["jitter"]
        if jitter > 0:
            delay += random.randrange(-jitter, jitter)
        target = chunk.stamp + delay / 1000
        if self.link.sleep_until(target, self):
            chunk.stamp = target  # a latency toxic after this one counts from here
        yield chunk


class Bandwidth(Effect):
    def __init__(self, toxic: Toxic, link: Link, previous: Effect | None):
        super().__init__(toxic, link, previous)
        self.debt = 0.0  # seconds of sending time owed; negative after oversleeping

    def pipe(self, chunk: Chunk) -> Iterator[Chunk]:
        rate = self.attrs["rate"]  # bytes per millisecond, i.e. KB/s with K = 1000
        if rate <= 0:
            self.debt = 0.0
            yield chunk
            return
        self.debt += len(chunk.data) / (rate * 1000)
        data, slice_size = chunk.data, rate * 100
        # A chunk larger than 100 ms worth goes out in 100 ms slices, so the rate holds at a fine grain.
        while len(data) > slice_size:
            if not self.link.sleep_for(0.1, self):
                yield Chunk(data, chunk.stamp)
                return
            yield Chunk(data[:slice_size], chunk.stamp)
            data = data[slice_size:]
            self.debt -= 0.1
        start = time.monotonic()
        if self.link.sleep_for(self.debt, self):
            self.debt -= time.monotonic() - start
        yield Chunk(data, chunk.stamp)


class SlowClose(Effect):
    def on_end(self) -> None:
        self.link.sleep_for(self.attrs["delay"] / 1000, self)


class Timeout(Effect):
    closes_when_removed = True  # the real toxic's Cleanup closes the stub

    def __init__(self, toxic: Toxic, link: Link, previous: Effect | None):
        super().__init__(toxic, link, previous)
        self.started = time.monotonic()

    def pipe(self, chunk: Chunk) -> Iterator[Chunk]:
        yield from ()  # the data is dropped

    def deadline(self) -> float | None:
        timeout = self.attrs["timeout"]
        return self.started + timeout / 1000 if timeout > 0 else None


class ResetPeer(Effect):
    def pipe(self, chunk: Chunk) -> Iterator[Chunk]:
        self._reset()
        yield from ()

    def on_end(self) -> None:
        self._reset()

    def _reset(self) -> None:
        # Not interruptible by the toxic's removal: the real toxic, once triggered, always resets.
        self.link.sleep_for(self.attrs["timeout"] / 1000, None)
        raise ResetConnection


class Slicer(Effect):
    def pipe(self, chunk: Chunk) -> Iterator[Chunk]:
        data, delay = chunk.data, self.attrs["delay"] / 1e6
        for start, end in self._bounds(0, len(data)):
            yield Chunk(data[start:end], chunk.stamp)
            if not self.link.sleep_for(delay, self):
                if end < len(data):
                    yield Chunk(data[end:], chunk.stamp)
                return

    def _bounds(self, start: int, end: int) -> list[tuple[int, int]]:
        """Halve [start, end) until pieces are about average_size (the real toxic's recursion)."""
        average, variation = self.attrs["average_size"], self.attrs["size_variation"]
        if (end - start) - average <= variation or end - start <= 1:
            return [(start, end)]
        mid = start + (end - start) // 2
        if variation > 0:
            mid += random.randrange(-variation, variation)
        mid = min(max(mid, start + 1), end - 1)  # the real one can slice out of range and panic
        return self._bounds(start, mid) + self._bounds(mid, end)


class LimitData(Effect):
    def __init__(self, toxic: Toxic, link: Link, previous: Effect | None):
        super().__init__(toxic, link, previous)
        self.sent = previous.sent if isinstance(previous, LimitData) else 0  # state survives updates

    def pipe(self, chunk: Chunk) -> Iterator[Chunk]:
        limit = self.attrs["bytes"]
        data = chunk.data[: max(0, limit - self.sent)]
        if data:
            self.sent += len(data)
            yield Chunk(data, chunk.stamp)
        if self.sent >= limit:
            raise CloseLink(self.seq)


EFFECTS: dict[str, type[Effect]] = {
    "noop": Effect, "latency": Latency, "bandwidth": Bandwidth, "slow_close": SlowClose, "timeout": Timeout,
    "reset_peer": ResetPeer, "slicer": Slicer, "limit_data": LimitData,
}
assert EFFECTS.keys() == TOXIC_ATTRIBUTES.keys()
