"""A Toxiproxy-compatible fault proxy, in pure Python.

`Toxiproxy <https://github.com/Shopify/toxiproxy>`_ is a TCP proxy with an HTTP API that puts
"toxics" (latency, a bandwidth cap, a cut, a reset...) on the links between a client and its
server. The harness uses it on the trainer's upload link to S3 and on the rendezvous store's
link. The real server is a Go binary that none of the package registries reachable here carries,
so this package is a server of our own that speaks the same HTTP API (v2): ``toxiproxy-python``
and the other clients drive it unchanged, and ``toxiproxy_server/tests/test_contract.py`` runs the same
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

Its modules, and the Go files of upstream Toxiproxy each one follows (their public names are all
re-exported here, so ``from toxiproxy_server import ...`` is the way in):

* ``api.py``: api.go, the HTTP API (``Api``, its routes and handlers) and ``ApiServer``;
* ``proxy.py``: proxy.go and proxy_collection.go (``Proxy``, ``ProxyCollection``, Go's address
  handling) and the toxic list of toxic_collection.go (a proxy's toxics per direction);
* ``link.py``: link.go, the data path (``Link``: one direction of a connection; ``Connection``);
* ``toxics.py``: toxics/*.go (the ``Toxic`` the API stores, parsed as toxic_collection.go does,
  and the ``Effect`` each type has on a link);
* ``errors.py``: api.go's ``ApiError`` and error bodies, and JSON decoding with Go's rules;
* ``cli.py``: cmd/server/server.go, ``python -m toxiproxy_server`` (``main``);
* ``harness.py``: no Go counterpart; the harness's side (``start_server``, ``connect``,
  ``ToxiproxyServer``).

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


from toxiproxy_server.api import DEFAULT_PORT, VERSION, Api, ApiServer, Handler, Text
from toxiproxy_server.cli import main
from toxiproxy_server.errors import (INT64, INVALID_STREAM, INVALID_TOXIC_TYPE, PROXY_EXISTS, PROXY_NOT_FOUND,
                                     TOXIC_EXISTS, TOXIC_NOT_FOUND, ApiError)
from toxiproxy_server.harness import (ENV_URL, ToxiproxyServer, connect, free_port, free_ports, start_server,
                                      start_toxiproxy_server)
from toxiproxy_server.link import BASE_BUFFER, POLL_S, READ_SIZE, Connection, Link
from toxiproxy_server.proxy import (Proxy, ProxyAlreadyStarted, ProxyCollection, format_address, resolve_address,
                                    split_address)
from toxiproxy_server.toxics import (DOWNSTREAM, EFFECTS, LATENCY_BUFFER, TOXIC_ATTRIBUTES, UPSTREAM, Bandwidth,
                                     Chunk, CloseLink, Dropped, Effect, Latency, LimitData, ResetConnection,
                                     ResetPeer, Slicer, SlowClose, Timeout, Toxic, parse_toxic, updated_toxic)

__all__ = [
    "Api", "ApiError", "ApiServer", "BASE_BUFFER", "Bandwidth", "Chunk", "CloseLink", "Connection",
    "DEFAULT_PORT", "DOWNSTREAM", "Dropped", "EFFECTS", "ENV_URL", "Effect", "Handler", "INT64",
    "INVALID_STREAM", "INVALID_TOXIC_TYPE", "LATENCY_BUFFER", "Latency", "LimitData", "Link", "POLL_S",
    "PROXY_EXISTS", "PROXY_NOT_FOUND", "Proxy", "ProxyAlreadyStarted", "ProxyCollection", "READ_SIZE",
    "ResetConnection", "ResetPeer", "Slicer", "SlowClose", "TOXIC_ATTRIBUTES", "TOXIC_EXISTS",
    "TOXIC_NOT_FOUND", "Text", "Timeout", "Toxic", "ToxiproxyServer", "UPSTREAM", "VERSION", "connect",
    "format_address", "free_port", "free_ports", "main", "parse_toxic", "resolve_address", "split_address",
    "start_server", "start_toxiproxy_server", "updated_toxic",
]
