"""The harness's side: start a server (ours or the real one) and hand out its address."""

from __future__ import annotations

import ctypes  # noqa: F401  (imported here so that no child has to import it after a fork)
import http.client
import json
import os
import secrets
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from toxiproxy_server.api import DEFAULT_PORT
from toxiproxy_server.proxy import format_address, split_address


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


ENV_URL = "TOXIPROXY_URL"


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


def _ephemeral_range() -> range:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = map(int, f.read().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def free_ports(n: int) -> list[int]:
    """``n`` loopback ports nothing listens on now, for children that must bind known ports, drawn
    below the kernel's ephemeral range: every ``bind(0)`` and outgoing connection of the machine
    (gloo's stores, an HTTP client's requests) takes its port from that range, and with four test
    workers side by side one took a port between this choice and the child's bind ("Address already
    in use"). All are held open together so that they differ; a process that binds one of these by
    number may still take it first, so a caller starts its child again on a new port when it fails."""
    ephemeral = _ephemeral_range()
    pool = [p for p in range(20000, 32768) if p not in ephemeral] or list(range(1024, 65536))
    socks: list[socket.socket] = []
    try:
        for port in secrets.SystemRandom().sample(pool, min(len(pool), 64 * n)):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            socks.append(s)
            if len(socks) == n:
                return [x.getsockname()[1] for x in socks]
        raise RuntimeError(f"no {n} free TCP ports among {pool[0]}-{pool[-1]} on 127.0.0.1")
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    """A loopback port nobody listens on right now (``free_ports``)."""
    return free_ports(1)[0]


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
