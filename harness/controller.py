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
    def __init__(self, on_event: OnEvent, directory: Path | None = None):
        self.on_event = on_event
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
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True, name="probe-conn").start()

    def _serve(self, conn: socket.socket) -> None:
        f = conn.makefile("rwb", buffering=0)
        try:
            for line in f:
                event = json.loads(line)
                event["received"] = time.time()
                answer = self.on_event(event) or {"do": "continue"}
                try:
                    f.write(json.dumps(answer).encode() + b"\n")
                except OSError:
                    return  # the sender was killed while we acted: expected
        except (OSError, ValueError):
            return
        finally:
            conn.close()

    def close(self) -> None:
        self._closed.set()
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
