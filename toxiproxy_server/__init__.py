"""A Toxiproxy-compatible fault proxy, in pure Python.

`Toxiproxy <https://github.com/Shopify/toxiproxy>`_ is a TCP proxy with an HTTP API that puts
"toxics" (latency, a bandwidth cap, a cut, a reset...) on the links between a client and its
server. The harness uses it on the trainer's upload link to S3 and on the rendezvous store's
link. The real server is a Go binary that none of the package registries reachable here carries,
so this module is a server of our own that speaks the same HTTP API (v2): ``toxiproxy-python``
and the other clients drive it unchanged, and ``tests/test_toxiproxy_contract.py`` runs the same
suite against the real server when one is available (``TOXIPROXY_URL``, or ``toxiproxy-server``
on PATH), so the two cannot drift apart unnoticed.

Public API::

    start_server(host="127.0.0.1", port=0) -> ToxiproxyServer   # ours, as a child process
    connect(url=None) -> ToxiproxyServer     # TOXIPROXY_URL, else toxiproxy-server on PATH, else ours
    server.url, server.host, server.port, server.close(), server.client(); `with server: ...`
    ApiServer(host, port).start()            # the same server in this process (a daemon thread)
    python -m toxiproxy_server --help       # the server itself (accepts toxiproxy-server's flags)

The proxy's threads run in the child process, so they do not compete for the harness's GIL;
without toxics it carries about 1 GB/s on loopback. The child exits when the harness does, even
on SIGKILL (PR_SET_PDEATHSIG, and EOF on a pipe from the parent).

What it reproduces (read from the Go source: api.go, proxy.go, link.go, toxic_collection.go,
toxics/*.go):

* the endpoints: GET /version, GET/POST /proxies, POST /populate, GET/POST/PATCH/DELETE
  /proxies/{proxy}, GET/POST /proxies/{proxy}/toxics, GET/POST/PATCH/DELETE
  /proxies/{proxy}/toxics/{toxic}, POST /reset; their JSON bodies (same keys, same order), status
  codes (201 on proxy creation, 204 on deletes and reset, 400 for a bad body, stream or toxic type,
  404 for an unknown proxy or toxic, 409 for a duplicate name, 405 for a wrong method, 500 when a
  listen address cannot be bound) and error bodies ``{"error": ..., "status": ...}``;
* proxies: ``listen`` with port 0 binds a free port and reports it, and a re-enabled proxy listens
  on that same address; disabling closes the listener and every live connection; changing
  ``listen`` or ``upstream`` restarts the proxy; /populate keeps a proxy whose addresses match and
  replaces one whose addresses differ; TCP_NODELAY on both sides of a connection, as Go sets it;
* toxics, with the real semantics: latency (+/- jitter, measured from when the proxy read the data,
  so consecutive chunks are delayed in a pipeline rather than one after another), bandwidth (KB/s
  of 1000 bytes, larger chunks cut into 100 ms slices), slow_close, timeout (drops the data, closes
  after ``timeout`` ms, never when 0; and, like the real one, closes the connection when the toxic
  is removed), reset_peer (after the first data or the end of the stream, waits ``timeout`` ms then
  closes with SO_LINGER 0, i.e. a TCP RST), slicer, limit_data (the byte count survives an update
  of the toxic), noop; toxics of a stream run in the order they were added; a closing toxic lets
  the toxics after it finish the stream (a slow_close after a limit_data still delays the close);
  toxicity is drawn once per connection and toxic; toxics added, updated or removed while a
  connection is live act on it at once, and data a removed toxic was holding is passed on at once;
* a proxied connection is torn down as the Go server does: when one direction ends, the proxy
  closes that direction's destination outright (no TCP half-close), which ends the other direction.

What it does not reproduce:

* no /metrics (Prometheus) endpoint, no request logging at info level, no ``X-Toxiproxy-Request-Id``,
  no 25 s handler timeout; error messages for malformed JSON are Python's, not Go's;
* the toxics of one direction run one after another in one thread, where the real server runs
  each in a goroutine of its own with channels between them; reading stays concurrent (and
  latency counts from the read), so delays add up the same way, but a toxic does not start on
  the next chunk while a later toxic still holds the previous one;
* the real server draws a toxic's toxicity again, and restarts its timers, whenever the toxic's
  neighbour in the chain is added or removed (an artefact of how it interrupts its goroutines);
  here a toxic keeps its draw and its timers for the life of the connection (an update of the
  toxic itself draws again and restarts them, as there);
* the real reset_peer sets SO_LINGER 0 only on connections that had the toxic when they opened,
  so one added to a live connection ends it with a FIN; here it always ends with a RST;
* inputs that crash or hang the real server are tamed: a slicer with ``average_size`` < 1 (here
  it slices into single bytes) or a ``size_variation`` larger than half a chunk (here the cut is
  kept inside the chunk), and a slow_close removed while it waits (the real one then never closes
  the connection; here it closes at once);
* the proxy holds at most a few chunks of 64 KiB per direction (1024 more per latency toxic, like
  the real buffers), so the sender feels back-pressure about as it would through the real one,
  but the exact amount of data in flight differs;
* an upstream is dialled in a thread of its own, so a slow upstream does not hold up accepting the
  next client (the real server dials in its accept loop).
"""

from __future__ import annotations

import argparse
import ctypes  # noqa: F401  (imported here so that no child has to import it after a fork)
import http.client
import itertools
import json
import logging
import os
import random
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator
from urllib.parse import unquote, urlsplit


logger = logging.getLogger(__name__)


def _load_prctl():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:
        return None


# Loaded in the parent: in a preexec_fn, between fork and exec in a process with threads, an import
# or a dlopen may wait forever on a lock another thread held at the fork.
_PRCTL = _load_prctl()


def _term_when_parent_dies() -> None:
    """In the child: exit with SIGTERM when the process that started it dies (Linux PR_SET_PDEATHSIG)."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


VERSION = "2.12.0"  # the Toxiproxy release whose API this server follows
DEFAULT_PORT = 8474
ENV_URL = "TOXIPROXY_URL"
UPSTREAM, DOWNSTREAM = "upstream", "downstream"

READ_SIZE = 64 * 1024
# How long a socket call may block before it looks again whether its connection was torn down.
# Teardown also shuts the sockets down, which wakes blocked calls at once; this bounds the rest
# (a send to a peer that stopped reading).
POLL_S = 0.25
BASE_BUFFER = 4  # chunks a link holds before the reader stops reading: back-pressure
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
INT64 = (-(2**63), 2**63 - 1)


# --------------------------------------------------------------------------------------------
# API errors and JSON decoding with Go's rules


class ApiError(Exception):
    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.message, self.status = message, status

    def to_json(self) -> dict[str, Any]:
        return {"error": self.message, "status": self.status}


def _bad_body(detail: str) -> ApiError:
    return ApiError(f"bad request body: {detail}", 400)


def _missing(what: str) -> ApiError:
    return ApiError(f"missing required field: {what}", 400)


PROXY_NOT_FOUND = ("proxy not found", 404)
PROXY_EXISTS = ("proxy already exists", 409)
INVALID_STREAM = ("stream was invalid, can be either upstream or downstream", 400)
INVALID_TOXIC_TYPE = ("invalid toxic type", 400)
TOXIC_EXISTS = ("toxic already exists", 409)
TOXIC_NOT_FOUND = ("toxic not found", 404)


def _decode(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError as e:  # Go says "EOF" for an empty body; any message will do
        raise _bad_body(str(e) if body.strip() else "EOF") from None


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad_body(f"json: cannot unmarshal {_json_kind(value)} into Go value of type {what}")
    return value


def _json_kind(value: Any) -> str:
    return {bool: "bool", str: "string", list: "array", dict: "object"}.get(type(value), "number")


def _get(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any) -> Any:
    """obj[key] checked like Go's decoder does: case-insensitive key, null keeps the default,
    bool is no number, and an integer field takes no fraction."""
    matches = [k for k in obj if k == key] or [k for k in obj if k.lower() == key.lower()]
    if not matches or obj[matches[-1]] is None:
        return default
    value = obj[matches[-1]]
    ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)
    if ok and kind is int and not INT64[0] <= value <= INT64[1]:
        ok = False
    if not ok:
        go_type = {str: "string", bool: "bool", int: "int64"}.get(kind, "float32")  # type: ignore[arg-type]
        raise _bad_body(f"json: cannot unmarshal {_json_kind(value)} into Go struct field .{key} of type {go_type}")
    return float(value) if kind == (int, float) else value


# --------------------------------------------------------------------------------------------
# Toxics: what the API stores, and what each does to the data of one connection


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


# --------------------------------------------------------------------------------------------
# Links and connections: the data path


def _shutdown(sock: socket.socket, how: int) -> None:
    try:
        sock.shutdown(how)
    except OSError:
        pass


class Link:
    """One direction of a proxied connection: a reader thread that reads the source into an
    inbox, and a writer thread that passes each chunk through the toxics and writes it to the
    destination. Two threads, so that data keeps being read (and timestamped) while a toxic holds
    earlier data back, as the real server's goroutines do. Only the writer touches the effects."""

    def __init__(self, conn: Connection, direction: str, source: socket.socket, dest: socket.socket):
        self.conn, self.direction, self.source, self.dest = conn, direction, source, dest
        self._cond = threading.Condition()
        self._inbox: deque[Chunk | None] = deque()  # None: the source ended
        self._capacity = BASE_BUFFER
        self._taking = False  # the writer waits for the inbox (and only then needs a wake-up)
        self._closed = False  # the connection is torn down: stop everything
        self._writer_done = False
        self._closing = False  # the writer is finishing the stream: no more closes from toxics
        self._chain: tuple[Toxic, ...] | None = None  # the proxy's chain that _effects were built from
        self._effects: list[Effect] = []

    # -- called from other threads

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- the reader thread

    def read_loop(self) -> None:
        while True:
            try:
                data = self.source.recv(READ_SIZE)
            except TimeoutError:
                if self._closed or self._writer_done:
                    return
                continue
            except OSError:  # a reset: for the chain it is the end of the stream, as in Go
                data = b""
            if not data:
                self._put(None)
                return
            if not self._put(Chunk(data, time.monotonic())):
                return

    def _put(self, chunk: Chunk | None) -> bool:
        with self._cond:
            while len(self._inbox) >= self._capacity and not (self._closed or self._writer_done):
                self._cond.wait(POLL_S)
            if self._closed or self._writer_done:
                return False
            self._inbox.append(chunk)
            if self._taking:
                self._cond.notify_all()
            return True

    # -- the writer thread

    def write_loop(self) -> None:
        try:
            try:
                while (chunk := self._take()) is not None:
                    self._deliver(chunk, after=-1)
                self._finish(after=-1)
            except CloseLink as close:
                self._finish(after=close.seq)
        except ResetConnection:
            self.conn.reset()
        except Dropped:
            pass
        finally:
            with self._cond:
                self._writer_done = True
                self._cond.notify_all()

    def _take(self) -> Chunk | None:
        with self._cond:
            self._taking = True
            try:
                while True:
                    self._check()
                    if self._inbox:
                        chunk = self._inbox.popleft()
                        self._cond.notify_all()  # the reader may be waiting for room
                        return chunk
                    self._cond.wait(self._wait_time(None))
            finally:
                self._taking = False

    def _deliver(self, chunk: Chunk, after: float) -> None:
        effect = self._next_effect(after)
        if effect is None:
            self._write(chunk.data)
        elif not effect.applies:
            self._deliver(chunk, effect.seq)
        else:
            for piece in effect.pipe(chunk):
                self._deliver(piece, effect.seq)

    def _finish(self, after: float) -> None:
        """The end of the stream goes through the toxics after ``after``, then the destination
        closes. Go closes the socket outright (no half-close), and so do we: the peer's other
        direction then ends too."""
        self._closing = True
        effect = self._next_effect(after)
        while effect is not None:
            if effect.applies:
                effect.on_end()
            effect = self._next_effect(effect.seq)
        _shutdown(self.dest, socket.SHUT_RDWR)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                sent = self.dest.send(view)
            except TimeoutError:
                if self._closed:
                    raise Dropped from None
                continue
            except OSError:
                _shutdown(self.dest, socket.SHUT_RDWR)
                raise Dropped from None
            view = view[sent:]

    def _next_effect(self, after: float) -> Effect | None:
        # Looked up afresh for every chunk, so a toxic added while data is in flight applies to it.
        return next((e for e in self._effects if e.seq > after), None)

    def sleep_for(self, seconds: float, owner: Effect | None) -> bool:
        return self.sleep_until(time.monotonic() + seconds, owner)

    def sleep_until(self, target: float, owner: Effect | None) -> bool:
        """Wait until ``target``; False if ``owner`` was removed or replaced meanwhile. Toxic
        changes, deadlines and teardown are handled while waiting."""
        with self._cond:
            while True:
                self._check()
                if owner is not None and owner.interrupted:
                    return False
                if time.monotonic() >= target:
                    return True
                self._cond.wait(self._wait_time(target))

    def _check(self) -> None:
        """With the lock held: raise if the link must stop, and follow changes of the toxics."""
        if self._closed:
            raise Dropped
        if self._chain is not self.conn.proxy.chain(self.direction):
            self._sync()
        if not self._closing:
            now = time.monotonic()
            for effect in self._effects:
                deadline = effect.applies and effect.deadline()
                if deadline and now >= deadline:
                    raise CloseLink(effect.seq)

    def _sync(self) -> None:
        chain = self.conn.proxy.chain(self.direction)
        old = {e.seq: e for e in self._effects}
        effects = []
        for toxic in chain:
            previous = old.pop(toxic.seq, None)
            if previous is not None and previous.toxic is toxic:
                effects.append(previous)
                continue
            if previous is not None:
                previous.interrupted = True
            effects.append(EFFECTS[toxic.type](toxic, self, previous))
        self._chain, self._effects = chain, effects
        self._capacity = BASE_BUFFER + sum(e.buffer for e in effects)
        self._cond.notify_all()
        for gone in old.values():
            gone.interrupted = True
        for gone in sorted(old.values(), key=lambda e: e.seq):
            if gone.closes_when_removed and not self._closing:
                raise CloseLink(gone.seq)

    def _wait_time(self, target: float | None) -> float | None:
        times = [target] if target is not None else []
        if not self._closing:
            times += [d for e in self._effects if e.applies and (d := e.deadline())]
        return max(0.0, min(times) - time.monotonic()) if times else None


class Connection:
    """A client's connection through a proxy: its two sockets and the two links between them."""

    def __init__(self, proxy: Proxy, client: socket.socket, upstream: socket.socket):
        self.proxy = proxy
        self.sockets = (client, upstream)
        for sock in self.sockets:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # Go's default for TCP
            sock.settimeout(POLL_S)
        self.links = (Link(self, UPSTREAM, client, upstream), Link(self, DOWNSTREAM, upstream, client))
        self._lock = threading.Lock()
        self._threads_left = 0

    def start(self) -> None:
        loops = [loop for link in self.links for loop in (link.read_loop, link.write_loop)]
        self._threads_left = len(loops)
        for loop in loops:
            threading.Thread(target=self._run, args=(loop,), daemon=True, name=f"toxiproxy-{self.proxy.name}").start()

    def _run(self, loop: Callable[[], None]) -> None:
        try:
            loop()
        except Exception:
            logger.exception("proxy %s: link failed", self.proxy.name)
            self.drop()
        finally:
            with self._lock:
                self._threads_left -= 1
                last = self._threads_left == 0
            if last:
                # Closed only when no thread can still be in a call on them: a closed descriptor
                # number can be reused at once by a new connection.
                for sock in self.sockets:
                    sock.close()
                self.proxy.forget(self)

    def wake(self) -> None:
        for link in self.links:
            link.wake()

    def drop(self) -> None:
        """Close both sides (FIN), as the real server does when a proxy is disabled."""
        for link in self.links:
            link.close()
        for sock in self.sockets:
            _shutdown(sock, socket.SHUT_RDWR)

    def reset(self) -> None:
        """Close both sides with a RST. SHUT_RD wakes the readers without sending anything; the
        RST goes out when the last thread closes the sockets (SO_LINGER 0)."""
        for sock in self.sockets:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            except OSError:
                pass
        for link in self.links:
            link.close()
        for sock in self.sockets:
            _shutdown(sock, socket.SHUT_RD)


# --------------------------------------------------------------------------------------------
# Proxies


def split_address(address: str) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host, port), as Go's net.SplitHostPort."""
    if not address:  # Go listens on every interface, on a free port
        return "", 0
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise OSError(f"address {address}: missing or invalid port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def resolve_address(address: str) -> str:
    """The address as Go's net.ResolveTCPAddr prints it (names resolved, IPv4 first)."""
    host, port = split_address(address)
    if not host:
        return f":{port}"
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    return format_address(infos[0][4][0], port)


def _listen(address: str) -> socket.socket:
    host, port = split_address(address)
    if not host:  # Go's "" is every interface, IPv4 and IPv6
        if socket.has_dualstack_ipv6():
            return socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=True)
        host = "0.0.0.0"
    family = socket.AF_INET6 if ":" in resolve_address(address).rpartition(":")[0] else socket.AF_INET
    # create_server sets SO_REUSEADDR (Go does too): a re-enabled proxy gets its port back even
    # while the connections it dropped sit in TIME_WAIT.
    return socket.create_server((host, port), family=family, backlog=128)


def _dial(address: str) -> socket.socket:
    host, port = split_address(address)
    return socket.create_connection((host or "localhost", port))


class ProxyAlreadyStarted(Exception):
    """Not an API error: /reset starts every proxy and skips those already running."""


class Proxy:
    def __init__(self, name: str, listen: str, upstream: str):
        self.name, self.listen, self.upstream = name, listen, upstream
        self.enabled = False
        self._admin = threading.RLock()  # start, stop, update: one at a time
        self._lock = threading.Lock()  # the toxics and the live connections
        self._chains: dict[str, tuple[Toxic, ...]] = {UPSTREAM: (), DOWNSTREAM: ()}
        self._seq = itertools.count()
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._generation = 0  # bumped on stop: a connection being set up for an older one is dropped
        self._connections: set[Connection] = set()

    def to_json(self) -> dict[str, Any]:
        # "Logger": {} is the real server's zerolog field, which Go's encoder shows as an empty object.
        return {"name": self.name, "listen": self.listen, "upstream": self.upstream, "enabled": self.enabled,
                "Logger": {}, "toxics": [t.to_json() for t in self.toxics()]}

    # -- listening

    def start(self) -> None:
        with self._admin:
            if self.enabled:
                raise ProxyAlreadyStarted
            try:
                listener = _listen(self.listen)
            except OSError as e:
                raise ApiError(f"listen tcp {self.listen}: {e.strerror or e}", 500) from None
            host, port = listener.getsockname()[:2]
            self.listen = format_address(host, port)
            self._listener = listener
            self._acceptor = threading.Thread(target=self._accept_loop, args=(listener, self._generation),
                                              daemon=True, name=f"toxiproxy-accept-{self.name}")
            self._acceptor.start()
            self.enabled = True
            logger.info("proxy %s listening on %s, upstream %s", self.name, self.listen, self.upstream)

    def stop(self) -> None:
        with self._admin:
            if not self.enabled:
                return
            self.enabled = False
            with self._lock:
                self._generation += 1
                connections = list(self._connections)
            _shutdown(self._listener, socket.SHUT_RDWR)  # wakes accept() on Linux
            self._acceptor.join()
            self._listener.close()
            self._listener = self._acceptor = None
            for conn in connections:
                conn.drop()
            logger.info("proxy %s stopped", self.name)

    def differs(self, listen: str, upstream: str) -> bool:
        try:
            resolved = resolve_address(listen)
        except OSError as e:
            raise ApiError(str(e), 500) from None
        return self.listen != resolved or self.upstream != upstream

    def update(self, listen: str, upstream: str, enabled: bool) -> None:
        with self._admin:
            if self.differs(listen, upstream):
                self.stop()
                self.listen, self.upstream = listen, upstream
            if enabled and not self.enabled:
                self.start()
            elif not enabled:
                self.stop()

    def _accept_loop(self, listener: socket.socket, generation: int) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # stop() shut the listener down
            threading.Thread(target=self._open, args=(client, generation), daemon=True,
                             name=f"toxiproxy-dial-{self.name}").start()

    def _open(self, client: socket.socket, generation: int) -> None:
        try:
            upstream = _dial(self.upstream)
        except OSError as e:
            logger.warning("proxy %s: cannot reach upstream %s: %s", self.name, self.upstream, e)
            client.close()
            return
        conn = Connection(self, client, upstream)
        with self._lock:
            current = generation == self._generation
            if current:
                self._connections.add(conn)
        if not current:
            client.close()
            upstream.close()
            return
        conn.start()

    def forget(self, conn: Connection) -> None:
        with self._lock:
            self._connections.discard(conn)

    # -- toxics

    def chain(self, direction: str) -> tuple[Toxic, ...]:
        return self._chains[direction]  # replaced, never mutated: readable without the lock

    def toxics(self) -> list[Toxic]:
        return [*self._chains[UPSTREAM], *self._chains[DOWNSTREAM]]

    def get_toxic(self, name: str) -> Toxic:
        for toxic in self.toxics():
            if toxic.name == name:
                return toxic
        raise ApiError(*TOXIC_NOT_FOUND)

    def add_toxic(self, body: Any) -> Toxic:
        with self._lock:
            names = {t.name for t in self.toxics()}
            toxic = parse_toxic(body, seq=next(self._seq), taken=names.__contains__)
            self._chains[toxic.direction] += (toxic,)
            self._wake_links()
            return toxic

    def update_toxic(self, name: str, body: Any) -> Toxic:
        with self._lock:
            old = self.get_toxic(name)
            new = updated_toxic(old, body)
            self._chains[old.direction] = tuple(new if t is old else t for t in self._chains[old.direction])
            self._wake_links()
            return new

    def remove_toxic(self, name: str) -> None:
        with self._lock:
            old = self.get_toxic(name)
            self._chains[old.direction] = tuple(t for t in self._chains[old.direction] if t is not old)
            self._wake_links()

    def reset_toxics(self) -> None:
        with self._lock:
            self._chains = {UPSTREAM: (), DOWNSTREAM: ()}
            self._wake_links()

    def _wake_links(self) -> None:
        # Each link's writer picks the new chain up as soon as it wakes (Link._check).
        for conn in self._connections:
            conn.wake()


def _proxy_fields(body: Any, name: str = "", listen: str = "", upstream: str = "",
                  enabled: bool | None = True) -> dict[str, Any]:
    body = _object(body, "toxiproxy.Proxy")
    return {"name": _get(body, "name", str, name), "listen": _get(body, "listen", str, listen),
            "upstream": _get(body, "upstream", str, upstream), "enabled": _get(body, "enabled", bool, enabled)}


class ProxyCollection:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._proxies: dict[str, Proxy] = {}

    def all(self) -> dict[str, Proxy]:
        with self._lock:
            return dict(self._proxies)

    def get(self, name: str) -> Proxy:
        with self._lock:
            if name not in self._proxies:
                raise ApiError(*PROXY_NOT_FOUND)
            return self._proxies[name]

    def add(self, proxy: Proxy, start: bool) -> None:
        with self._lock:
            if proxy.name in self._proxies:
                raise ApiError(*PROXY_EXISTS)
            if start:
                proxy.start()
            self._proxies[proxy.name] = proxy

    def add_or_replace(self, proxy: Proxy, start: bool) -> Proxy:
        with self._lock:
            existing = self._proxies.get(proxy.name)
            if existing is not None:
                if not existing.differs(proxy.listen, proxy.upstream):
                    return existing
                existing.stop()
            if start:
                proxy.start()
            self._proxies[proxy.name] = proxy
            return proxy

    def remove(self, name: str) -> None:
        with self._lock:
            self.get(name).stop()
            del self._proxies[name]

    def clear(self) -> None:
        with self._lock:
            for name in list(self._proxies):
                self.remove(name)

    def populate(self, body: Any) -> tuple[list[Proxy], ApiError | None]:
        """Create or replace proxies; on an error, the ones done so far stay (as in Go). A bad
        body raises before anything is done."""
        if not isinstance(body, list):
            raise _bad_body(f"json: cannot unmarshal {_json_kind(body)} into Go value of type []struct")
        inputs = [_proxy_fields(item, enabled=None) for item in body]
        for i, fields in enumerate(inputs, 1):
            if not fields["name"]:
                raise _missing(f"name at proxy {i}")
            if not fields["upstream"]:
                raise _missing(f"upstream at proxy {i}")
        done: list[Proxy] = []
        for fields in inputs:
            try:
                proxy = Proxy(fields["name"], fields["listen"], fields["upstream"])
                done.append(self.add_or_replace(proxy, start=fields["enabled"] is not False))
            except ApiError as e:
                return done, e
        return done, None


# --------------------------------------------------------------------------------------------
# The HTTP API


Handler = Callable[..., tuple[int, Any]]


@dataclass(frozen=True)
class Text:
    """A response body sent as is (anything else is sent as compact JSON)."""

    text: str
    content_type: str = "text/plain; charset=utf-8"


class Api:
    """The endpoints, as (status, JSON-able body or None) from (path arguments, decoded body)."""

    def __init__(self, proxies: ProxyCollection):
        self.proxies = proxies
        self.routes: list[tuple[re.Pattern[str], dict[str, Handler]]] = [
            (re.compile(r"/reset"), {"POST": self.reset}),
            (re.compile(r"/proxies"), {"GET": self.proxy_index, "POST": self.proxy_create}),
            (re.compile(r"/populate"), {"POST": self.populate}),
            (re.compile(r"/proxies/([^/]+)"), {"GET": self.proxy_show, "POST": self.proxy_update,
                                               "PATCH": self.proxy_update, "DELETE": self.proxy_delete}),
            (re.compile(r"/proxies/([^/]+)/toxics"), {"GET": self.toxic_index, "POST": self.toxic_create}),
            (re.compile(r"/proxies/([^/]+)/toxics/([^/]+)"), {
                "GET": self.toxic_show, "POST": self.toxic_update, "PATCH": self.toxic_update,
                "DELETE": self.toxic_delete}),
            (re.compile(r"/version"), {"GET": self.version}),
        ]

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        for pattern, methods in self.routes:
            match = pattern.fullmatch(path)
            if match is None:
                continue
            if method not in methods:
                return 405, None
            args = [unquote(arg) for arg in match.groups()]
            try:
                return methods[method](*args, body=body)
            except ApiError as e:
                return e.status, e.to_json()
            except Exception as e:  # a bug here must not cost the client its connection
                logger.exception("%s %s failed", method, path)
                return 500, ApiError(str(e), 500).to_json()
        return 404, Text("404 page not found\n")

    def version(self, body: bytes) -> tuple[int, Any]:
        return 200, Text(f'{{"version": "{VERSION}"}}\n', "application/json;charset=utf-8")  # the real one's bytes

    def reset(self, body: bytes) -> tuple[int, Any]:
        for proxy in self.proxies.all().values():
            try:
                proxy.start()
            except ProxyAlreadyStarted:
                pass
            proxy.reset_toxics()
        return 204, None

    def proxy_index(self, body: bytes) -> tuple[int, Any]:
        return 200, {name: proxy.to_json() for name, proxy in sorted(self.proxies.all().items())}

    def proxy_create(self, body: bytes) -> tuple[int, Any]:
        fields = _proxy_fields(_decode(body))
        if not fields["name"]:
            raise _missing("name")
        if not fields["upstream"]:
            raise _missing("upstream")
        proxy = Proxy(fields["name"], fields["listen"], fields["upstream"])
        self.proxies.add(proxy, start=fields["enabled"])
        return 201, proxy.to_json()

    def populate(self, body: bytes) -> tuple[int, Any]:
        try:
            proxies, error = self.proxies.populate(_decode(body))
        except ApiError as e:
            proxies, error = [], e
        listed = [p.to_json() for p in proxies] or None  # Go marshals an empty slice here as null
        if error is not None:
            return error.status, {**error.to_json(), "proxies": listed}
        return 201, {"proxies": listed}

    def proxy_show(self, name: str, body: bytes) -> tuple[int, Any]:
        return 200, self.proxies.get(name).to_json()

    def proxy_update(self, name: str, body: bytes) -> tuple[int, Any]:
        proxy = self.proxies.get(name)
        fields = _proxy_fields(_decode(body), proxy.name, proxy.listen, proxy.upstream, proxy.enabled)
        proxy.update(fields["listen"], fields["upstream"], fields["enabled"])
        return 200, proxy.to_json()

    def proxy_delete(self, name: str, body: bytes) -> tuple[int, Any]:
        self.proxies.remove(name)
        return 204, None

    def toxic_index(self, name: str, body: bytes) -> tuple[int, Any]:
        return 200, [t.to_json() for t in self.proxies.get(name).toxics()]

    def toxic_create(self, name: str, body: bytes) -> tuple[int, Any]:
        proxy = self.proxies.get(name)
        return 200, proxy.add_toxic(_decode(body)).to_json()  # 200, not 201: as the real server

    def toxic_show(self, name: str, toxic: str, body: bytes) -> tuple[int, Any]:
        return 200, self.proxies.get(name).get_toxic(toxic).to_json()

    def toxic_update(self, name: str, toxic: str, body: bytes) -> tuple[int, Any]:
        proxy = self.proxies.get(name)
        return 200, proxy.update_toxic(toxic, _decode(body)).to_json()

    def toxic_delete(self, name: str, toxic: str, body: bytes) -> tuple[int, Any]:
        self.proxies.get(name).remove_toxic(toxic)
        return 204, None


class _RequestHandler(BaseHTTPRequestHandler):
    server: _HttpServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def _serve(self, method: str) -> None:
        body = self._body()
        if self.headers.get("User-Agent", "").startswith("Mozilla/"):
            # The real server refuses browsers, so that no web page can drive it (CSRF).
            status, payload = 403, Text("User agent not allowed\n")
        else:
            status, payload = self.server.api.handle(method, urlsplit(self.path).path, body)
        self._respond(status, payload)

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            return b"".join(parts)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _respond(self, status: int, payload: Any) -> None:
        self.send_response(status)
        if status == 204:
            self.end_headers()
            return
        if isinstance(payload, Text):
            data, kind = payload.text.encode(), payload.content_type
        elif payload is None:
            data, kind = b"", "text/plain; charset=utf-8"
        else:
            data, kind = json.dumps(payload, separators=(",", ":")).encode(), "application/json"
            if status >= 400:
                data += b"\n"  # Go's http.Error ends the body with a newline
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], api: Api):
        infos = socket.getaddrinfo(address[0] or None, address[1], type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        infos.sort(key=lambda info: info[0] != socket.AF_INET)  # "localhost" is 127.0.0.1, as in Go
        self.address_family = infos[0][0]
        address = (infos[0][4][0], address[1])
        self.api = api
        super().__init__(address, _RequestHandler)


class ApiServer:
    """A whole Toxiproxy server in this process: the proxies and their HTTP API.
    ``start_server`` runs one in a child process; this class is what that child runs."""

    def __init__(self, host: str = "127.0.0.1", port: int = DEFAULT_PORT):
        self.proxies = ProxyCollection()
        self._http = _HttpServer((host, port), Api(self.proxies))
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        return self._http.server_address[0]

    @property
    def port(self) -> int:
        return self._http.server_address[1]

    def serve_forever(self) -> None:
        self._http.serve_forever(poll_interval=0.5)

    def start(self) -> ApiServer:
        """Serve from a daemon thread of this process."""
        self._thread = threading.Thread(target=self.serve_forever, daemon=True, name="toxiproxy-api")
        self._thread.start()
        return self

    def populate_file(self, path: str) -> None:
        with open(path, "rb") as f:
            _, error = self.proxies.populate(_decode(f.read()))
        if error is not None:
            raise error

    def close(self) -> None:
        if self._thread is not None:  # shutdown() waits for serve_forever, which must be running
            self._http.shutdown()
            self._thread.join()
            self._thread = None
        self._http.server_close()
        self.proxies.clear()


# --------------------------------------------------------------------------------------------
# The harness's side: start a server (ours or the real one) and hand out its address


@dataclass
class ToxiproxyServer:
    """A Toxiproxy server's address, and the process behind it when the harness started it."""

    host: str
    port: int
    process: subprocess.Popen | None = field(default=None, repr=False)  # None: not ours to stop
    kind: str = "python"  # python | toxiproxy-server | external

    @property
    def url(self) -> str:
        return f"http://{format_address(self.host, self.port)}"

    def client(self) -> Any:
        """A ``toxiproxy.Toxiproxy`` pointed at this server. toxiproxy-python keeps the address in
        class attributes, so this points every client of the process at it."""
        from toxiproxy import Toxiproxy
        from toxiproxy.api import APIConsumer

        APIConsumer.host, APIConsumer.port = self.host, self.port
        return Toxiproxy()

    def close(self) -> None:
        """Kill the server if the harness started it, and reap it. Idempotent."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()

    def __enter__(self) -> ToxiproxyServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_server(host: str = "127.0.0.1", port: int = 0, timeout: float = 20.0) -> ToxiproxyServer:
    """Start this module's server as a child process (``python -m toxiproxy_server``), with its
    own GIL, that dies with the harness, and wait until its API answers. Port 0: a free port."""
    supervision = ["--supervised"]
    if threading.current_thread() is threading.main_thread():
        # PR_SET_PDEATHSIG fires when the thread that forked the child ends, so only the main
        # thread's children can use it; every child also exits when its stdin pipe closes.
        supervision += ["--parent-pid", str(os.getpid())]
    # The child must import this very package, installed or not.
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
    process = subprocess.Popen([sys.executable, "-m", "toxiproxy_server", "--host", host, "--port", str(port),
                                *supervision], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        address = _read_announcement(process, timeout)
    except BaseException:
        process.kill()
        process.wait()
        raise
    host, port = split_address(address)
    return ToxiproxyServer(host, port, process=process, kind="python")


def _read_announcement(process: subprocess.Popen, timeout: float) -> str:
    """The API address the child prints as its first line on stdout."""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if selector.select(max(0.0, deadline - time.monotonic())):
                line = process.stdout.readline()
                if not line:
                    break
                try:
                    return json.loads(line)["address"]
                except (ValueError, KeyError):
                    continue
    try:
        status = process.wait(1)
    except subprocess.TimeoutExpired:
        status = None
    raise RuntimeError(f"the toxiproxy server did not start (exit status {status}); see its stderr above")


def free_port() -> int:
    """A loopback port nobody listens on right now (for a child that must bind a known port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(host: str, port: int) -> bool:
    conn = http.client.HTTPConnection(host, port, timeout=1)
    try:
        conn.request("GET", "/version")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def start_toxiproxy_server(executable: str, timeout: float = 20.0) -> ToxiproxyServer:
    """Start the real Go server on a free port of 127.0.0.1 and wait until its API answers."""
    preexec = _term_when_parent_dies if threading.current_thread() is threading.main_thread() else None
    for _ in range(3):  # the free port can be taken before the server binds it
        port = free_port()
        process = subprocess.Popen([executable, "-host", "127.0.0.1", "-port", str(port)], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=preexec)
        server = ToxiproxyServer("127.0.0.1", port, process=process, kind="toxiproxy-server")
        deadline = time.monotonic() + timeout
        while process.poll() is None and time.monotonic() < deadline:
            if _answers("127.0.0.1", port):
                return server
            time.sleep(0.05)
        server.close()
    raise RuntimeError(f"{executable} did not start")


def connect(url: str | None = None) -> ToxiproxyServer:
    """The server the harness should use: ``url``, else $TOXIPROXY_URL (a server someone else runs),
    else a ``toxiproxy-server`` on PATH (started here), else this module's (started here)."""
    url = url or os.environ.get(ENV_URL)
    if url:
        parts = urlsplit(url if "//" in url else f"http://{url}")
        return ToxiproxyServer(parts.hostname or "127.0.0.1", parts.port or DEFAULT_PORT, kind="external")
    executable = shutil.which("toxiproxy-server")
    if executable:
        return start_toxiproxy_server(executable)
    return start_server()


# --------------------------------------------------------------------------------------------
# python -m toxiproxy_server


def _watch_parent(parent_pid: int | None) -> None:
    if parent_pid is not None:
        _term_when_parent_dies()
        if os.getppid() != parent_pid:  # it died before prctl could watch it
            os._exit(0)

    def exit_on_eof() -> None:
        # The raw descriptor, not sys.stdin: a daemon thread blocked in a buffered read holds its
        # lock, and the interpreter would abort on it at exit.
        while os.read(0, 4096):  # returns b"" when the parent closes the pipe or dies
            pass
        os._exit(0)

    threading.Thread(target=exit_on_eof, daemon=True, name="toxiproxy-parent-watch").start()


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m toxiproxy_server",
        description="A Toxiproxy-compatible fault proxy (HTTP API v2 of Shopify/toxiproxy) in pure Python. "
                    "Drive it with any Toxiproxy client, e.g. toxiproxy-python or toxiproxy-cli. "
                    "Takes toxiproxy-server's flags, with one dash or two.")
    parser.add_argument("--host", "-host", default="localhost", help="host for the API to listen on (localhost)")
    parser.add_argument("--port", "-port", type=int, default=DEFAULT_PORT,
                        help=f"port for the API to listen on ({DEFAULT_PORT}; 0: a free port, printed at start)")
    parser.add_argument("--config", "-config", help="JSON file of proxies to create at start (as POST /populate)")
    parser.add_argument("--seed", "-seed", type=int, help="seed for the toxics' random draws (toxicity, jitter...)")
    parser.add_argument("--version", "-version", action="store_true", help="print the version and exit")
    parser.add_argument("--verbose", "-v", action="store_true", help="log proxies and requests on stderr")
    parser.add_argument("--supervised", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.version:
        print(f"toxiproxy-server version {VERSION} (toxiproxy_server, Python)")
        return 0
    if args.supervised:
        _watch_parent(args.parent_pid)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s toxiproxy %(levelname)s %(message)s")
    if args.seed is not None:
        random.seed(args.seed)
    try:
        server = ApiServer(args.host, args.port)
    except OSError as e:
        print(f"error: listen tcp {format_address(args.host, args.port)}: {e.strerror or e}", file=sys.stderr)
        return 1
    if args.config:
        try:
            server.populate_file(args.config)
        except (OSError, ApiError) as e:
            logger.error("cannot populate proxies from %s: %s", args.config, e)
    # One JSON line on stdout, like the real server's log line; start_server reads the address from it.
    print(json.dumps({"level": "info", "address": format_address(server.host, server.port),
                      "message": "Starting Toxiproxy HTTP server"}), flush=True)
    if args.supervised:  # nobody reads our stdout any more: never block on a full pipe
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0

