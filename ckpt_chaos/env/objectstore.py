"""The remote tier of a run: an S3 endpoint on loopback, and the harness's own view of what it holds.

A run needs no S3 server installed beside it: it starts moto's standalone server (``python -m
moto.server``, of the ``remote`` extra), a real HTTP server that speaks the S3 REST API, as a child
of the harness that dies with it. The trainer reaches it through the fault proxy
(``toxiproxy_server/__init__.py``), so the upload link can be cut, slowed or reset; the harness reads the
bucket directly, never through the proxy.

Nothing here is moto-specific beyond starting it: to run against MinIO or a cloud bucket, set
``CKPT_CHAOS_S3_ENDPOINT`` (and the usual ``AWS_*`` credentials) and the harness uses that
endpoint instead of starting a server; each run then writes under its own prefix.

``snapshot`` is the checker's evidence: every checkpoint under the run's prefix, whether it is
durable (its ``manifest.json`` exists) and, for a durable one, whether every object the manifest
lists is there with the right size and checksum, downloaded and hashed by the harness itself.

Every process started here (the S3 server, the rendezvous store) carries the harness's pid in
``CKPT_CHAOS_OBJECTSTORE_OWNER`` and every proxy route its pid in its name, so ``remove_leftovers``
can clear what a harness that died without cleaning up left behind (children normally die with it).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from ckpt_chaos.env.lifetime import die_with_parent
from ckpt_chaos.extras import missing_extra
from ckpt_chaos.probe.layout import CHECKSUMS
from toxiproxy_server import ENV_URL, connect, free_port

ENV_ENDPOINT = "CKPT_CHAOS_S3_ENDPOINT"
OWNER_ENV = "CKPT_CHAOS_OBJECTSTORE_OWNER"  # in the environment of each process started here
BUCKET = "ckpt-chaos"
# moto accepts any credentials; a real endpoint uses whatever the environment provides.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "ckpt-chaos", "AWS_SECRET_ACCESS_KEY": "ckpt-chaos",
               "AWS_DEFAULT_REGION": "us-east-1"}


def missing() -> str | None:
    """Why this machine cannot give a run its remote tier (None: it can)."""
    return missing_extra("remote")


def _owned_env() -> dict[str, str]:
    return {**os.environ, OWNER_ENV: str(os.getpid())}


def _wait_for_port(host: str, port: int, proc: subprocess.Popen | None, what: str, log: Path,
                   timeout: float = 60.0) -> None:
    """Until ``host:port`` accepts connections; fails at once if ``proc`` (the server) exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; its log: {log}")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} at {host}:{port} did not answer within {timeout:.0f}s; its log: {log}")


def _serve(argv, what: str, log: Path, preexec_fn, attempts: int = 3) -> tuple[subprocess.Popen, int]:
    """A child server started on a free loopback port (``argv(port)``), answering. Another process can
    bind the chosen port first ("Address already in use" in the log): then again, on another port."""
    log.parent.mkdir(parents=True, exist_ok=True)
    for attempt in itertools.count(1):
        port = free_port()
        start = log.stat().st_size if log.exists() else 0
        with open(log, "ab") as out:
            proc = subprocess.Popen(argv(port), stdout=out, stderr=subprocess.STDOUT, preexec_fn=preexec_fn,
                                    env=_owned_env())
        try:
            _wait_for_port("127.0.0.1", port, proc, what, log)
            return proc, port
        except RuntimeError:
            with open(log, "rb") as f:
                f.seek(start)
                taken = b"in use" in f.read().lower()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if not taken or attempt == attempts:
                raise


def _background() -> None:
    """In the S3 server's process: die with the harness, and yield the CPU to the job under test (a
    real object store would not share the node's cores)."""
    die_with_parent()
    os.nice(10)


def _client(endpoint: str):
    import boto3
    from botocore.config import Config

    env = {k: os.environ.get(k, v) for k, v in CREDENTIALS.items()}
    return boto3.client("s3", endpoint_url=endpoint, region_name=env["AWS_DEFAULT_REGION"],
                        aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                        config=Config(retries={"max_attempts": 3}, connect_timeout=5, read_timeout=30))


@dataclass
class S3Server:
    """An S3 endpoint for one run: moto on a free loopback port (or ``CKPT_CHAOS_S3_ENDPOINT``)."""

    log_path: Path
    endpoint: str = ""
    bucket: str = BUCKET
    proc: subprocess.Popen | None = None
    env: dict = field(default_factory=dict)  # what the trainer needs to reach it (credentials)

    def __enter__(self) -> "S3Server":
        external = os.environ.get(ENV_ENDPOINT)
        self.env = {k: os.environ.get(k, v) for k, v in CREDENTIALS.items()} if not external else {}
        if external:
            self.endpoint = external
            _wait_for_port(*self.address, None, "the S3 server", self.log_path)
        else:
            self.proc, port = _serve(lambda p: [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(p)],
                                     "the S3 server (moto)", self.log_path, _background)
            self.endpoint = f"http://127.0.0.1:{port}"
        client = _client(self.endpoint)
        try:
            client.create_bucket(Bucket=self.bucket)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) of the endpoint, whatever the form of its URL (an external one may omit the port)."""
        parts = urlsplit(self.endpoint)
        return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


def snapshot(endpoint: str, url: str) -> dict:
    """The remote tier under ``url`` right now, checked by the harness: ``checkpoints`` maps each
    durable checkpoint to why it is not complete (None: every object matches its manifest),
    ``partial`` lists names with objects but no manifest (uploads that never became durable),
    ``bytes`` the size of each durable checkpoint's objects other than its manifest."""
    from ckpt_chaos.probe.layout import MANIFEST, parse_name

    bucket, _, prefix = url[len("s3://"):].partition("/")
    prefix = prefix.strip("/")
    client = _client(endpoint)
    start = prefix + "/" if prefix else ""
    objects: dict[str, dict[str, int]] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=start):
        for obj in page.get("Contents", []):
            name, _, file = obj["Key"][len(start):].partition("/")
            if parse_name(name) and file:
                objects.setdefault(name, {})[file] = obj["Size"]
    checkpoints: dict[str, str | None] = {}
    for name, files in objects.items():
        if MANIFEST not in files:
            continue
        checkpoints[name] = _problem(client, bucket, f"{start}{name}/", files)
    order = sorted(checkpoints, key=parse_name, reverse=True)
    complete = [n for n in order if checkpoints[n] is None]
    return {"checkpoints": {n: checkpoints[n] for n in order},
            "partial": sorted(n for n, f in objects.items() if MANIFEST not in f),
            "newest_durable": complete[0] if complete else None,
            "bytes": {n: sum(size for f, size in objects[n].items() if f != MANIFEST) for n in order}}


def _problem(client, bucket: str, key_prefix: str, sizes: dict[str, int]) -> str | None:
    """Why a durable remote checkpoint is not what its manifest says (None: it is)."""
    try:
        manifest = json.loads(client.get_object(Bucket=bucket, Key=key_prefix + "manifest.json")["Body"].read())
    except ValueError as e:
        return f"manifest.json is unreadable: {e}"
    checksum = CHECKSUMS.get(manifest.get("format"))
    if checksum is None:
        return f"manifest format {manifest.get('format')!r} is not one of {sorted(CHECKSUMS)}"
    for file, want in manifest.get("files", {}).items():
        if file not in sizes:
            return f"{file} is missing"
        if sizes[file] != want["size"]:
            return f"{file} has {sizes[file]} bytes, manifest says {want['size']}"
        h = checksum.new()
        h.update(client.get_object(Bucket=bucket, Key=key_prefix + file)["Body"].read())
        if h.hexdigest() != want.get(checksum.key):
            return f"{file} fails its {checksum.label} checksum"
    return None


class RemoteTier:
    """A run's remote tier: the S3 endpoint, and (``proxy``) a fault-proxy route to it for the trainer."""

    def __init__(self, run_dir: Path, prefix: str, proxy: bool, store: bool = False):
        self.run_dir, self.prefix, self.use_proxy, self.use_store = run_dir, prefix, proxy, store
        self.s3 = S3Server(run_dir / "s3.log")
        self.proxy_server = None
        self.proxy_name = ""
        self.endpoint = ""  # what the trainer uses
        self.store_proc: subprocess.Popen | None = None
        self.store_endpoint = ""  # with ``store``: the rendezvous store, through the proxy

    def __enter__(self) -> "RemoteTier":
        self.s3.__enter__()
        self.endpoint = self.s3.endpoint
        if self.use_proxy:
            try:
                self.proxy_server = connect()
                host, port = self.s3.address
                self.proxy_name = f"s3-{os.getpid()}-{self.prefix.replace('/', '-')}"
                proxy = self._api().create(upstream=f"{host}:{port}", name=self.proxy_name, listen="127.0.0.1:0")
                self.endpoint = f"http://{proxy.listen}"
                if self.use_store:
                    self._route_store()
            except BaseException:
                self.close()
                raise
        return self

    def _route_store(self) -> None:
        """A c10d TCPStore hosted by the harness, which the job's torchrun and ranks reach only through
        the proxy (``link = "store"`` toxics)."""
        code = ("import sys, time, torch.distributed as d; "
                "s = d.TCPStore('127.0.0.1', int(sys.argv[1]), is_master=True, wait_for_workers=False); "
                "print('ready', flush=True); time.sleep(1e9)")
        self.store_proc, port = _serve(lambda p: [sys.executable, "-c", code, str(p)], "the rendezvous store",
                                       self.run_dir / "store.log", die_with_parent)
        proxy = self._api().create(upstream=f"127.0.0.1:{port}", name=self.proxy_name + "-store",
                                   listen="127.0.0.1:0")
        self.store_endpoint = proxy.listen

    def _api(self):
        return self.proxy_server.client()

    def proxy_for(self, link: str) -> str:
        return self.proxy_name + ("-store" if link == "store" else "")

    def add_toxic(self, link: str, name: str, kind: str, stream: str, toxicity: float, attributes: dict) -> None:
        self._api().get_proxy(self.proxy_for(link)).add_toxic(name=name, type=kind, stream=stream, toxicity=toxicity,
                                                          attributes=dict(attributes))

    def remove_toxic(self, link: str, name: str) -> None:
        self._api().get_proxy(self.proxy_for(link)).destroy_toxic(name)

    @property
    def url(self) -> str:
        return self.s3.url(self.prefix)

    @property
    def env(self) -> dict:
        return self.s3.env

    def snapshot(self) -> dict:
        return snapshot(self.s3.endpoint, self.url)

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.proxy_server is not None:
            try:
                for name in (self.proxy_name, self.proxy_name + "-store") if self.proxy_name else ():
                    proxy = self._api().get_proxy(name)
                    if proxy is not None:
                        proxy.destroy()
            except Exception:
                pass  # the server goes next anyway (ours), or keeps a dead route (a shared real one)
            self.proxy_server.close()
            self.proxy_server = None
        if self.store_proc is not None and self.store_proc.poll() is None:
            self.store_proc.kill()
            self.store_proc.wait()
        self.s3.close()


# ---- leftovers of harnesses that died without cleaning up ----------------------------------------

_PROXY = re.compile(r"s3-(\d+)-")


def _processes() -> dict[int, int]:
    """pid of each S3 server or store process of ours -> pid of the harness that started it."""
    found = {}
    for p in psutil.process_iter():
        try:
            owner = p.environ().get(OWNER_ENV, "")
        except (psutil.Error, OSError):
            continue
        if owner.isdigit() and p.pid != os.getpid():
            found[p.pid] = int(owner)
    return found


def _shared_proxies() -> dict[str, int]:
    """Route name -> owner pid on a shared proxy server ($TOXIPROXY_URL); ours die with the harness."""
    if not os.environ.get(ENV_URL) or missing():
        return {}
    try:
        names = connect().client().proxies()
    except Exception:  # the shared server is down: nothing of ours to remove there
        return {}
    return {name: int(m.group(1)) for name in names if (m := _PROXY.match(name))}


def leftovers(owner: int | None = None) -> list[str]:
    """S3 server and store processes (``process PID``) and shared proxy routes (``proxy NAME``) that
    harnesses no longer running left behind, or all of those of harness ``owner``."""
    def wanted(o: int) -> bool:
        return o == owner if owner is not None else not (o == os.getpid() or psutil.pid_exists(o))

    return ([f"process {p}" for p, o in sorted(_processes().items()) if wanted(o)]
            + [f"proxy {n}" for n, o in sorted(_shared_proxies().items()) if wanted(o)])


def remove_leftovers() -> list[str]:
    """Kill the processes and delete the proxy routes that dead harnesses left; returns what went."""
    removed = []
    for entry in leftovers():
        kind, name = entry.split(" ", 1)
        try:
            if kind == "process":
                os.kill(int(name), signal.SIGKILL)
            else:
                proxy = connect().client().get_proxy(name)
                if proxy is not None:
                    proxy.destroy()
            removed.append(entry)
        except Exception:  # gone meanwhile
            pass
    return removed
