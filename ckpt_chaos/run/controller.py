"""The harness end of the probe: a Unix-socket server that hears every rank's points.

Each connection (one per rank process) gets a thread. For every event the server calls
``on_event(event)``; whatever that function does (kill the sender, stop it, hold it by not
returning yet) happens while the sender is blocked at its point. Its return value is the answer
sent back: ``None`` means continue.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

Event = dict
OnEvent = Callable[[Event], "dict | None"]


class ProbeServer:
    def __init__(self, on_event: OnEvent, directory: Path | None = None,
                 on_error: Callable[[str], None] | None = None):
        self.on_event = on_event
        # A rank whose connection breaks goes on unprobed, and its faults never fire: that must
        # show up in the verdict as a harness error, not as a mysterious "never fired".
        self.on_error = on_error or (lambda message: None)
        # Unix socket paths are limited to ~100 bytes: keep them short, unique per server.
        self._dir = Path(tempfile.mkdtemp(prefix="cc-", dir=directory or "/tmp"))
        self.address = str(self._dir / "probe.sock")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.address)
        self._sock.listen(64)
        self._closed = threading.Event()
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True, name="probe-accept")
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError as e:
                if self._closed.is_set():
                    return
                self.on_error(f"probe server: accept failed: {e!r}")
                time.sleep(0.01)
                continue
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True, name="probe-conn").start()

    def _serve(self, conn: socket.socket) -> None:
        f = conn.makefile("rwb", buffering=0)
        event: dict = {}
        try:
            for line in f:
                if not line.endswith(b"\n"):
                    return  # the sender was killed half-way through its message
                event = json.loads(line)
                event["received"] = time.time()
                answer = self.on_event(event) or {"do": "continue"}
                try:
                    conn.sendall(json.dumps(answer).encode() + b"\n")
                except OSError:
                    return  # the sender was killed while we acted: expected
        except ConnectionResetError:
            return  # the sender was killed mid-message
        except (OSError, ValueError) as e:
            if not self._closed.is_set():
                self.on_error(f"probe connection of rank {event.get('rank')} (pid {event.get('pid')}) broke after "
                              f"{event.get('point')}: {e!r}")
        finally:
            conn.close()

    def close(self) -> None:
        self._closed.set()
        # Closing the socket does not wake the thread blocked in accept(2) on it. A SIGSTOP and SIGCONT
        # of the harness (Ctrl-Z and fg, a debugger) restarts that call on the descriptor's number,
        # by then often the next server's socket: it would take a rank of the next run and hand its
        # events to this finished one. shutdown() wakes it; it must be gone before the number is free.
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._thread.join(5)
        try:
            self._sock.close()
        except OSError:
            pass
        for c in self._conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
                c.close()
            except OSError:
                pass
        try:
            os.unlink(self.address)
            self._dir.rmdir()
        except OSError:
            pass

    def __enter__(self) -> "ProbeServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
