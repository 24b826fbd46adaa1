"""``python -m toxiproxy_server``: the server's command line (upstream's cmd/server/server.go)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import threading

from toxiproxy_server.api import DEFAULT_PORT, VERSION, ApiServer
from toxiproxy_server.errors import ApiError
from toxiproxy_server.harness import _term_when_parent_dies
from toxiproxy_server.proxy import format_address


logger = logging.getLogger(__name__)


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
