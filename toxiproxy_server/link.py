"""Links and connections, the data path (upstream's link.go): one thread pair per direction of a
proxied connection, passing the data through the toxics of that direction.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import deque
from typing import Callable, Protocol

from toxiproxy_server.toxics import (DOWNSTREAM, EFFECTS, UPSTREAM, Chunk, CloseLink, Dropped, Effect,
                                     ResetConnection, Toxic)


class Proxy(Protocol):
    """What a connection needs of its proxy (``proxy.Proxy``, which imports this module): its name, each
    direction's toxic chain, and to be told when the connection is gone."""

    name: str

    def chain(self, direction: str) -> tuple[Toxic, ...]: ...

    def forget(self, conn: Connection) -> None: ...


logger = logging.getLogger(__name__)

READ_SIZE = 64 * 1024
# How long a socket call may block before it looks again whether its connection was torn down.
# Teardown also shuts the sockets down, which wakes blocked calls at once; this bounds the rest
# (a send to a peer that stopped reading).
POLL_S = 0.25
BASE_BUFFER = 4  # chunks a link holds before the reader stops reading: back-pressure


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
