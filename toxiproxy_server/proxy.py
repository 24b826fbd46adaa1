"""Proxies (upstream's proxy.go, with the toxic list of toxic_collection.go) and the collection of
them (proxy_collection.go), with Go's address handling.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
from typing import Any

from toxiproxy_server.errors import (PROXY_EXISTS, PROXY_NOT_FOUND, TOXIC_NOT_FOUND, ApiError, _bad_body, _get,
                                     _json_kind, _missing, _object)
from toxiproxy_server.link import Connection, _shutdown
from toxiproxy_server.toxics import DOWNSTREAM, UPSTREAM, Toxic, parse_toxic, updated_toxic


logger = logging.getLogger(__name__)


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
