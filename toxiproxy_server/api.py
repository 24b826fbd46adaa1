"""The HTTP API (upstream's api.go) and ``ApiServer``, a whole server in this process."""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import unquote, urlsplit

from toxiproxy_server.errors import ApiError, _decode, _missing
from toxiproxy_server.proxy import Proxy, ProxyAlreadyStarted, ProxyCollection, _proxy_fields


logger = logging.getLogger(__name__)

VERSION = "2.12.0"  # the Toxiproxy release whose API this server follows
DEFAULT_PORT = 8474


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
