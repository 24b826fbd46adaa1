"""The Toxiproxy contract: what the harness relies on from the fault proxy.

The suite runs against whatever ``toxiproxy_server.connect()`` returns: the real Go server when
``TOXIPROXY_URL`` names one or ``toxiproxy-server`` is on PATH, our Python server otherwise. It
drives the server only through ``toxiproxy-python`` (its ``Toxiproxy``/``Proxy`` objects, and its
``APIConsumer`` where the high-level client checks on its own side instead of asking the server)
and plain sockets, so the same assertions hold for both servers.

Behaviours of the real server checked here:

* API: GET /version; POST /proxies (201; ``listen`` 127.0.0.1:0 binds a real port and reports it),
  GET /proxies and /proxies/{name} (fields and toxics), DELETE /proxies/{name}; 409 for a proxy or
  toxic name that exists; 404 for an unknown proxy or toxic; 400 for an unknown toxic type, an
  invalid stream or an attribute of the wrong type; a toxic's defaults (name ``<type>_<stream>``,
  stream downstream, toxicity 1) and a partial update of its attributes; POST /populate keeps a
  proxy whose addresses match and replaces one whose upstream changed; POST /reset re-enables
  proxies and removes every toxic.
* Data path: bytes pass unchanged both ways with no toxics; disabling a proxy drops its live
  connections and refuses new ones, enabling it listens again on the same port.
* Toxics: latency delays by at least its value; bandwidth caps the rate; timeout 0 holds the data
  without closing; timeout N closes after N ms; reset_peer ends the connection with a RST
  (ECONNRESET); slicer delivers every byte in order, with its delay between slices; limit_data
  closes after exactly its byte count; slow_close delays the close; toxicity 0 never applies; an
  upstream toxic acts only on client->server data and a downstream one only on server->client
  data; toxics added to a live connection act on it; removing a timeout toxic closes the live
  connections it held.

Timing checks are lower bounds only: a loaded machine makes things slower, never faster.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from typing import Callable

import pytest
from toxiproxy import Toxiproxy
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from toxiproxy_server import connect

pytestmark = pytest.mark.timeout(60)

IO_TIMEOUT = 5.0  # no socket call in these tests may hang the suite


# --------------------------------------------------------------------------------------------
# Upstream servers and socket helpers


class Upstream:
    """A TCP server on a free port of 127.0.0.1; each connection runs ``handler`` in a thread."""

    def __init__(self, handler: Callable[[socket.socket], None]):
        self.handler = handler
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(30)
        with conn:
            try:
                self.handler(conn)
            except OSError:
                pass

    def close(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()


def echo(conn: socket.socket) -> None:
    while data := conn.recv(65536):
        conn.sendall(data)


def sender(payload: bytes, then_close: bool) -> Callable[[socket.socket], None]:
    """Sends ``payload`` at once; then closes, or waits for the peer to close."""

    def handler(conn: socket.socket) -> None:
        conn.sendall(payload)
        if not then_close:
            while conn.recv(65536):
                pass

    return handler


class Greeter:
    """Says hello, then records whatever it receives: shows which direction data got through."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.upstream = Upstream(self._handle)

    def _handle(self, conn: socket.socket) -> None:
        conn.sendall(b"hello")
        while data := conn.recv(65536):
            self.received += data

    def wait_for(self, data: bytes, timeout: float = IO_TIMEOUT) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if data in self.received:
                return True
            time.sleep(0.01)
        return False


def dial(proxy) -> socket.socket:
    host, port = proxy.listen.rsplit(":", 1)
    return socket.create_connection((host.strip("[]"), int(port)), timeout=IO_TIMEOUT)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError(f"connection closed after {len(data)} of {n} bytes")
        data += chunk
    return bytes(data)


def recv_to_eof(sock: socket.socket) -> bytes:
    data = bytearray()
    while chunk := sock.recv(65536):
        data += chunk
    return bytes(data)


def roundtrip(sock: socket.socket, payload: bytes) -> bytes:
    """Send while receiving (an echo of a large payload would otherwise fill both buffers)."""
    sending = threading.Thread(target=sock.sendall, args=(payload,), daemon=True)
    sending.start()
    data = recv_exactly(sock, len(payload))
    sending.join()
    return data


def nothing_arrives(sock: socket.socket, within: float = 0.3) -> bool:
    """True if no byte and no end of stream arrives within ``within`` seconds."""
    sock.settimeout(within)
    try:
        sock.recv(1)
    except TimeoutError:
        return True
    finally:
        sock.settimeout(IO_TIMEOUT)
    return False


# --------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def server():
    """The server under test, with toxiproxy-python pointed at it (its address is class-global)."""
    saved = APIConsumer.host, APIConsumer.port
    srv = connect()
    APIConsumer.host, APIConsumer.port = srv.host, srv.port
    try:
        yield srv
    finally:
        APIConsumer.host, APIConsumer.port = saved
        srv.close()


@pytest.fixture(scope="module")
def toxiproxy(server) -> Toxiproxy:
    return Toxiproxy()


@pytest.fixture(scope="module")
def echo_server():
    upstream = Upstream(echo)
    yield upstream
    upstream.close()


@pytest.fixture
def make_proxy(toxiproxy):
    """Create proxies with names no other test (or xdist worker sharing a server) uses; destroy
    them afterwards."""
    created = []

    def make(upstream: str, **kwargs):
        name = f"contract-{uuid.uuid4().hex[:10]}"
        proxy = toxiproxy.create(upstream=upstream, name=name, listen="127.0.0.1:0", **kwargs)
        created.append(name)
        return proxy

    yield make
    for name in created:
        try:
            APIConsumer.delete(f"/proxies/{name}")
        except NotFound:
            pass


@pytest.fixture
def echo_proxy(make_proxy, echo_server):
    return make_proxy(echo_server.address)


# --------------------------------------------------------------------------------------------
# The API


def test_version(toxiproxy):
    assert json.loads(toxiproxy.version())["version"]


def test_create_list_get_destroy(toxiproxy, echo_proxy, echo_server):
    name = echo_proxy.name
    host, port = echo_proxy.listen.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0, "listen 127.0.0.1:0 must report the bound port"
    assert echo_proxy.enabled is True and echo_proxy.upstream == echo_server.address

    listed = toxiproxy.proxies()[name]
    assert (listed.listen, listed.upstream, listed.enabled) == (echo_proxy.listen, echo_server.address, True)
    shown = APIConsumer.get(f"/proxies/{name}").json()  # the real server adds "Logger": {}
    assert {k: shown[k] for k in ("name", "listen", "upstream", "enabled", "toxics")} == {
        "name": name, "listen": echo_proxy.listen, "upstream": echo_server.address, "enabled": True, "toxics": []}
    with dial(echo_proxy) as sock:
        assert roundtrip(sock, b"ping") == b"ping"

    assert echo_proxy.destroy()
    assert name not in toxiproxy.proxies()
    with pytest.raises(ConnectionRefusedError):
        dial(echo_proxy)
    with pytest.raises(NotFound):
        echo_proxy.destroy()


def test_duplicate_names_are_409(echo_proxy, echo_server):
    # toxiproxy.create() refuses a duplicate on the client side; ask the server itself.
    with pytest.raises(ProxyExists):
        APIConsumer.post("/proxies", json={"name": echo_proxy.name, "upstream": echo_server.address,
                                           "listen": "127.0.0.1:0"})
    echo_proxy.add_toxic(type="latency", attributes={"latency": 1})
    with pytest.raises(ProxyExists):
        echo_proxy.add_toxic(type="latency", attributes={"latency": 2})
    assert echo_proxy.toxics()["latency_downstream"].attributes["latency"] == 1


def test_unknown_names_are_404(echo_proxy):
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(NotFound):
        APIConsumer.get(f"/proxies/{missing}")
    with pytest.raises(NotFound):
        APIConsumer.get(f"/proxies/{missing}/toxics")
    with pytest.raises(NotFound):
        APIConsumer.post(f"/proxies/{missing}/toxics", json={"type": "latency"})
    with pytest.raises(NotFound):
        APIConsumer.get(f"/proxies/{echo_proxy.name}/toxics/{missing}")
    with pytest.raises(NotFound):
        echo_proxy.destroy_toxic(missing)


@pytest.mark.parametrize("toxic", [
    {"type": "no_such_toxic"},
    {"type": "latency", "stream": "sideways"},
    {"type": "latency", "attributes": {"latency": "slow"}},
], ids=["type", "stream", "attribute"])
def test_bad_toxics_are_400(echo_proxy, toxic):
    with pytest.raises(InvalidToxic):
        APIConsumer.post(f"/proxies/{echo_proxy.name}/toxics", json=toxic)
    assert echo_proxy.toxics() == {}


def test_toxic_defaults_and_update(echo_proxy):
    name = echo_proxy.name
    created = APIConsumer.post(f"/proxies/{name}/toxics", json={"type": "latency", "attributes": {"latency": 50}})
    assert created.status_code == 200
    assert created.json() == {"name": "latency_downstream", "type": "latency", "stream": "downstream",
                              "toxicity": 1, "attributes": {"latency": 50, "jitter": 0}}
    echo_proxy.add_toxic(type="bandwidth", stream="upstream", toxicity=0.5, attributes={"rate": 10})
    toxics = echo_proxy.toxics()
    assert set(toxics) == {"latency_downstream", "bandwidth_upstream"}
    assert (toxics["bandwidth_upstream"].stream, toxics["bandwidth_upstream"].toxicity) == ("upstream", 0.5)

    updated = APIConsumer.post(f"/proxies/{name}/toxics/latency_downstream", json={"attributes": {"jitter": 5}})
    assert updated.json()["attributes"] == {"latency": 50, "jitter": 5}, "attributes not given must stay"
    shown = APIConsumer.get(f"/proxies/{name}/toxics/latency_downstream").json()
    assert shown["attributes"] == {"latency": 50, "jitter": 5}
    in_proxy = APIConsumer.get(f"/proxies/{name}").json()["toxics"]
    assert sorted(in_proxy, key=lambda t: t["name"]) == [
        APIConsumer.get(f"/proxies/{name}/toxics/{t}").json() for t in ("bandwidth_upstream", "latency_downstream")]

    assert echo_proxy.destroy_toxic("latency_downstream")
    assert set(echo_proxy.toxics()) == {"bandwidth_upstream"}


def test_populate_keeps_matching_and_replaces_changed(toxiproxy, make_proxy, echo_server):
    other = Upstream(echo)
    name = f"contract-{uuid.uuid4().hex[:10]}"
    try:
        created = APIConsumer.post("/populate", json=[{"name": name, "listen": "127.0.0.1:0",
                                                       "upstream": echo_server.address}])
        assert created.status_code == 201
        (proxy,) = created.json()["proxies"]
        assert proxy["name"] == name and not proxy["listen"].endswith(":0")

        again = APIConsumer.post("/populate", json=[{"name": name, "listen": proxy["listen"],
                                                     "upstream": echo_server.address}])
        assert again.json()["proxies"][0]["listen"] == proxy["listen"]

        APIConsumer.post(f"/proxies/{name}/toxics", json={"type": "latency"})
        replaced = APIConsumer.post("/populate", json=[{"name": name, "listen": proxy["listen"],
                                                        "upstream": other.address}])
        assert replaced.json()["proxies"][0]["upstream"] == other.address
        assert replaced.json()["proxies"][0]["toxics"] == [], "a replaced proxy starts without toxics"
        assert toxiproxy.proxies()[name].upstream == other.address
    finally:
        APIConsumer.delete(f"/proxies/{name}")
        other.close()


def test_reset_enables_proxies_and_removes_toxics(server, toxiproxy, make_proxy, echo_server):
    if server.kind == "external":
        pytest.skip("POST /reset would disturb the other users of a shared server")
    first, second = make_proxy(echo_server.address), make_proxy(echo_server.address)
    first.add_toxic(type="latency", attributes={"latency": 1000})
    second.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 0})
    second.disable()

    assert toxiproxy.reset()
    for proxy in (first, second):
        assert toxiproxy.proxies()[proxy.name].enabled is True
        assert proxy.toxics() == {}
        with dial(proxy) as sock:
            assert roundtrip(sock, b"after reset") == b"after reset"


# --------------------------------------------------------------------------------------------
# The data path


def test_data_passes_unchanged_both_ways(echo_proxy):
    payload = os.urandom(2 * 2**20)
    with dial(echo_proxy) as sock:
        assert roundtrip(sock, payload) == payload
        assert roundtrip(sock, b"x") == b"x"


def test_disable_drops_live_connections_and_enable_restores(toxiproxy, echo_proxy):
    live = dial(echo_proxy)
    assert roundtrip(live, b"before") == b"before"

    echo_proxy.disable()
    assert toxiproxy.proxies()[echo_proxy.name].enabled is False
    try:
        assert live.recv(1) == b"", "a live connection must be closed when its proxy is disabled"
    except ConnectionResetError:
        pass
    finally:
        live.close()
    with pytest.raises(ConnectionRefusedError):
        dial(echo_proxy)

    echo_proxy.enable()
    assert toxiproxy.proxies()[echo_proxy.name].listen == echo_proxy.listen, "re-enabled on the same port"
    with dial(echo_proxy) as sock:
        assert roundtrip(sock, b"after") == b"after"


# --------------------------------------------------------------------------------------------
# Toxics


def test_latency_delays_at_least_its_value(echo_proxy):
    echo_proxy.add_toxic(type="latency", attributes={"latency": 300})
    with dial(echo_proxy) as sock:
        start = time.monotonic()
        assert roundtrip(sock, b"ping") == b"ping"
        assert time.monotonic() - start >= 0.29


def test_bandwidth_caps_the_rate(make_proxy):
    payload = os.urandom(200_000)
    source = Upstream(sender(payload, then_close=True))
    try:
        proxy = make_proxy(source.address)
        proxy.add_toxic(type="bandwidth", attributes={"rate": 100})  # KB/s: 200 KB take 2 s
        start = time.monotonic()
        with dial(proxy) as sock:
            assert recv_to_eof(sock) == payload
        assert time.monotonic() - start >= 1.5
    finally:
        source.close()


def test_timeout_zero_holds_data_without_closing(echo_proxy):
    echo_proxy.add_toxic(type="timeout", attributes={"timeout": 0})
    with dial(echo_proxy) as sock:
        sock.sendall(b"ping")
        assert nothing_arrives(sock, within=0.5)


def test_timeout_closes_after_its_value(echo_proxy):
    echo_proxy.add_toxic(type="timeout", attributes={"timeout": 300})
    start = time.monotonic()
    with dial(echo_proxy) as sock:
        sock.sendall(b"ping")
        assert recv_to_eof(sock) == b"", "a timeout toxic drops the data"
    assert time.monotonic() - start >= 0.28


def test_reset_peer_resets_the_connection(echo_proxy):
    echo_proxy.add_toxic(type="reset_peer", attributes={"timeout": 0})
    with dial(echo_proxy) as sock:
        sock.sendall(b"ping")
        with pytest.raises(ConnectionResetError):
            recv_to_eof(sock)


def test_slicer_delivers_every_byte_with_delays(echo_proxy):
    # Slices of at most average_size + size_variation = 1100 bytes: 20 KB make 19 slices or more.
    echo_proxy.add_toxic(type="slicer", attributes={"average_size": 1000, "size_variation": 100, "delay": 1000})
    payload = os.urandom(20_000)
    with dial(echo_proxy) as sock:
        start = time.monotonic()
        assert roundtrip(sock, payload) == payload
        assert time.monotonic() - start >= 0.015


def test_limit_data_closes_after_exactly_its_bytes(make_proxy):
    payload = os.urandom(10_000)
    source = Upstream(sender(payload, then_close=False))  # the close can only come from the toxic
    try:
        proxy = make_proxy(source.address)
        proxy.add_toxic(type="limit_data", attributes={"bytes": 1234})
        with dial(proxy) as sock:
            assert recv_to_eof(sock) == payload[:1234]
    finally:
        source.close()


def test_slow_close_delays_the_close(make_proxy):
    source = Upstream(sender(b"bye", then_close=True))
    try:
        proxy = make_proxy(source.address)
        proxy.add_toxic(type="slow_close", attributes={"delay": 400})
        start = time.monotonic()
        with dial(proxy) as sock:
            assert recv_to_eof(sock) == b"bye"
        assert time.monotonic() - start >= 0.39
    finally:
        source.close()


def test_toxicity_zero_never_applies(echo_proxy):
    echo_proxy.add_toxic(type="timeout", toxicity=0.0, attributes={"timeout": 0})
    for i in range(5):
        with dial(echo_proxy) as sock:
            assert roundtrip(sock, b"ping %d" % i) == b"ping %d" % i


def test_upstream_toxic_affects_only_client_to_server(make_proxy):
    greeter = Greeter()
    try:
        proxy = make_proxy(greeter.upstream.address)
        proxy.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 0})
        with dial(proxy) as sock:
            assert recv_exactly(sock, 5) == b"hello", "server->client must flow"
            sock.sendall(b"ping")
            time.sleep(0.3)
            assert greeter.received == b"", "client->server must be held"
    finally:
        greeter.upstream.close()


def test_downstream_toxic_affects_only_server_to_client(make_proxy):
    greeter = Greeter()
    try:
        proxy = make_proxy(greeter.upstream.address)
        proxy.add_toxic(type="timeout", stream="downstream", attributes={"timeout": 0})
        with dial(proxy) as sock:
            sock.sendall(b"ping")
            assert greeter.wait_for(b"ping"), "client->server must flow"
            assert nothing_arrives(sock), "server->client must be held"
    finally:
        greeter.upstream.close()


def test_toxic_added_to_live_connection_applies(echo_proxy):
    with dial(echo_proxy) as sock:
        assert roundtrip(sock, b"before") == b"before"
        echo_proxy.add_toxic(type="latency", attributes={"latency": 300})
        start = time.monotonic()
        assert roundtrip(sock, b"slow") == b"slow"
        assert time.monotonic() - start >= 0.29
        echo_proxy.destroy_toxic("latency_downstream")
        assert roundtrip(sock, b"after") == b"after", "a live connection survives a toxic's removal"


def test_timeout_on_live_connection_holds_data_and_its_removal_closes(echo_proxy):
    with dial(echo_proxy) as sock:
        assert roundtrip(sock, b"before") == b"before"
        echo_proxy.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 0})
        sock.sendall(b"held")
        assert nothing_arrives(sock)
        echo_proxy.destroy_toxic("timeout_upstream")
        # The real timeout toxic closes its link when removed (its Cleanup), ending the connection.
        sock.settimeout(2)
        try:
            assert recv_to_eof(sock) == b""
        except ConnectionResetError:
            pass
    with dial(echo_proxy) as sock:
        assert roundtrip(sock, b"new") == b"new"
