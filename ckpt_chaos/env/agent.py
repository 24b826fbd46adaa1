"""A launcher agent that starts with torch already imported: the ranks of a launch are forked from it.

``torchrun`` costs a launch two interpreter starts and two imports of torch in a row: its own, then
each worker's. On a small machine that is most of the time to a first step. This agent is started
ahead of need (a *spare*), imports torch, ``torch.distributed`` and the trainer's package, and waits
for a launch. It then forks one process per rank, hosts the job's c10d store as torchrun's
agent does (``TORCHELASTIC_USE_AGENT_STORE``), and supervises the ranks the way torchrun does with
``--max-restarts=0``:

* every rank gets torchrun's environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
  ``MASTER_ADDR``/``MASTER_PORT``, ``TORCHELASTIC_*``) and runs ``python -m MODULE ARGS`` in a
  session of its own, and exits as an interpreter does: threads that are not daemons waited for,
  ``atexit`` functions run;
* when a rank fails, the others get SIGTERM, then SIGKILL 30 s later (torchrun's
  ``PContext.close``), with torchrun's log line for it, which the harness reads to reap stopped
  ranks; the agent then exits 1;
* SIGTERM to the agent (a preemption notice) is passed to the ranks the same way, and the agent
  then exits 1, as torchrun does;
* the agent exits 0 when every rank exited 0.

What torchrun itself does (restarts, elastic membership, its rendezvous) is not imitated: scenarios
that test it run under torchrun (``ckpt_chaos.env.launcher``).

One spare serves many launches: it is a *zygote*. Each launch forks a copy of it, which becomes
that launch's agent, so no launch waits for torch to be imported again and no import competes with
the ranks for the CPU. Forking is only safe while the spare has a single thread; a spare that has
more (a preloaded ``libfiu`` starts one before any import, an import may start others) serves one
launch itself and then exits, and its ranks start with ``exec``. One that has them from its start
imports nothing ahead: its ranks import everything themselves.

Protocol: the harness holds one end of a ``SOCK_SEQPACKET`` pair whose other end is the control fd.
The spare writes ``{"ready": 1, "forkable": bool, "sources": {path: mtime}}`` on its status pipe
once warm (``sources``: the project files it imported, so that the harness can retire a spare whose
code changed). A launch is one message on the control socket: a JSON spec (``nproc``, ``module``,
``argv``, ``env``, ``log``, ``run_id``) with the write end of the launch's own status pipe attached
(``SCM_RIGHTS``). The spare answers ``{"agent": pid}`` on the control socket; the agent writes
``{"ranks": {rank: pid}}`` on the launch's pipe once it forked them, and the spare writes
``{"exit": status}`` there once it reaped the agent.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import traceback

from ckpt_chaos.env.lifetime import die_with_parent

CLOSE_TIMEOUT_S = 30.0  # torchrun's PContext.close(timeout=30)
POLL_S = 0.05


def _imports_of(module: str) -> list[str]:
    """The modules that ``python -m MODULE`` imports by name in its file, at any depth of it (a
    trainer often imports torch late, inside ``main``), found with ``ast`` without running the file."""
    import ast
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.submodule_search_locations:  # a package runs its __main__
            spec = importlib.util.find_spec(f"{module}.__main__")
        origin, package = spec.origin, spec.name.rpartition(".")[0]
        with open(origin) as fh:
            tree = ast.parse(fh.read())
    except (ImportError, AttributeError, TypeError, OSError, SyntaxError, ValueError):
        return []
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names.append(base)
    return [n for n in dict.fromkeys(names) if n and n != "__main__"]


def _entry_imports(module: str, depth: int = 3) -> list[str]:
    """``_imports_of`` the entry module, and of those of its imports that are the project's own code
    (not installed under the interpreter's prefix), ``depth`` levels down."""
    import importlib.util

    installed = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
    found: dict[str, None] = {}
    frontier = [module]
    for _ in range(depth):
        following = []
        for name in frontier:
            for imported in _imports_of(name):
                if imported in found:
                    continue
                found[imported] = None
                try:
                    spec = importlib.util.find_spec(imported)
                except (ImportError, ValueError):
                    continue
                if spec is not None and spec.origin and not spec.origin.startswith(installed):
                    following.append(imported)
        frontier = following
    return list(found)


# Imported by a call, not at import: FSDP2's ``fully_shard`` imports torch._dynamo on its first call (a
# second of a rank's time). Warmed only for a trainer that imports FSDP: importing torch._dynamo into a
# plain DDP trainer's ranks changes how they end (gloo's process group then deadlocked at exit in one
# launch in ten, never under torchrun).
IMPORTED_BY_CALLS = {"torch.distributed.fsdp": ("torch._dynamo",)}


def warm_imports(module: str) -> list[str]:
    """What a spare imports ahead for ``module``: the trainer's package, the modules its entry file
    imports, and what those import when called (``IMPORTED_BY_CALLS``); never a module the ranks would
    not import themselves, since an import can change what a process does."""
    names = [module.split(".")[0], *_entry_imports(module)]
    later = [m for n in names for prefix, more in IMPORTED_BY_CALLS.items()
             if n == prefix or n.startswith(prefix + ".") for m in more]
    # A package's ``__main__`` is run as ``__main__`` by ``python -m PACKAGE``: a second copy imported
    # under its own name ahead would be another module.
    return [n for n in dict.fromkeys(names + later) if not n.endswith(".__main__")]


def _warm(module: str) -> None:
    """Import what the ranks will import (``warm_imports``), but not the entry file itself (its top
    level may start training)."""
    import importlib

    import torch  # noqa: F401

    for name in warm_imports(module):
        try:
            importlib.import_module(name)
        except BaseException:  # the rank imports it again and reports the error where it belongs, in the log
            pass


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _status(fd: int, **what) -> None:
    try:
        os.write(fd, (json.dumps(what) + "\n").encode())
    except OSError:  # the harness stopped listening; the ranks go on regardless
        pass


def _as_fresh_process() -> None:
    """What a fresh interpreter would have that a fork of the spare shares with its siblings: NumPy's
    global random stream, seeded from the OS at its import (Python's own ``random`` is reseeded at
    every fork by CPython). A trainer that never seeds it draws other numbers on each rank and launch,
    as under torchrun. The hash seed cannot be changed after start: the ranks of a launch share it."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _finalize(code: int) -> int:
    """An interpreter's exit, as ``python`` would make it: wait for the threads that are not daemons,
    then run the ``atexit`` functions (a trainer's last upload, its logger's flush)."""
    import atexit
    import threading

    try:
        threading._shutdown()
    except BaseException:
        traceback.print_exc()
    try:
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    return code


def _run_rank(spec: dict, env: dict[str, str], listen: socket.socket, status_fd: int) -> None:
    """In the forked child: become ``python -m MODULE ARGV`` for one rank. Never returns."""
    import runpy

    code = 1
    try:
        os.setsid()  # torchrun starts each worker in a session of its own
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        listen.close()
        os.close(status_fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.environ.clear()
        os.environ.update(env)
        _as_fresh_process()
        sys.argv = [spec["module"], *spec["argv"]]
        runpy.run_module(spec["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            code = _finalize(code)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _signal_name(status: int) -> str:
    try:
        return signal.Signals(-status).name
    except ValueError:
        return f"signal {-status}"


def _sources() -> dict[str, float]:
    """The imported modules' files that are not installed under the interpreter's prefix, with their
    modification times: the project's code, which a fork would run as it was when imported."""
    installed = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
    found = {}
    for mod in list(sys.modules.values()):
        path = getattr(mod, "__file__", None)
        if (path and not path.startswith(installed) and os.path.isfile(path)
                and not any(d in path for d in ("/site-packages/", "/dist-packages/"))):
            try:
                found[path] = os.stat(path).st_mtime
            except OSError:
                pass
    return found


def serve(module: str, status_fd: int, control_fd: int) -> int:
    """Warm up, then serve launches from the control socket until the harness closes it."""
    # A library preloaded into the interpreter may start a thread before any import (libfiu's remote
    # control): such a spare can never fork, its ranks import everything themselves, and importing it
    # here too would only cost the CPU the other launches need.
    forkable = _threads() == 1
    if forkable:
        _warm(module)
        forkable = _threads() == 1
    _status(status_fd, ready=1, forkable=forkable, sources=_sources())
    os.close(status_fd)
    control = socket.socket(fileno=control_fd)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the harness went away (PDEATHSIG): so do we
    children: dict[int, int] = {}  # agent pid -> its launch's status fd
    while True:
        readable = select.select([control], [], [], POLL_S if children else None)[0]
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if not pid:
                break
            fd = children.pop(pid, None)
            if fd is not None:
                _status(fd, exit=os.waitstatus_to_exitcode(status))
                os.close(fd)
        if not readable:
            continue
        try:
            msg, fds, _, _ = socket.recv_fds(control, 1 << 20, 1)
        except OSError:
            msg, fds = b"", []
        if not msg:
            return 0  # the harness closed the socket: a spare no longer needed
        spec, launch_fd = json.loads(msg), fds[0]
        if not forkable:
            control.send(json.dumps({"agent": os.getpid()}).encode())
            control.close()
            return _agent(spec, launch_fd, forkable=False)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                control.close()
                for fd in children.values():
                    os.close(fd)
                os.setsid()  # the agent, like torchrun, leads a session of its own
                die_with_parent()  # the spare's death ends the launch
                code = _agent(spec, launch_fd, forkable=True)
            except BaseException:
                traceback.print_exc()
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)  # no finalization: the store's thread would abort on a closed socket
        children[pid] = launch_fd
        control.send(json.dumps({"agent": pid}).encode())


def _agent(spec: dict, status_fd: int, forkable: bool) -> int:
    """Run one launch: fork (or exec) its ranks, host their store, supervise them; the exit status."""
    term = []
    signal.signal(signal.SIGTERM, lambda *_: term.append(signal.SIGTERM))
    log = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    # The store's socket is bound before the fork so its port is known to every rank; the store
    # itself (threads) starts after the fork, in the agent only.
    listen = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listen.bind(("127.0.0.1", 0))
    listen.listen(128)
    port = listen.getsockname()[1]
    nproc = int(spec["nproc"])
    # Forking a process that runs threads copies their locks in whatever state they are: if an import
    # started one (an OpenMP pool without OMP_NUM_THREADS=1, a library's monitor), the ranks start
    # from a fresh interpreter instead, which costs their imports again but nothing else.
    if not forkable:
        print(f"[ckpt-chaos agent] {_threads()} threads (a preloaded library's, or the imports'): starting the "
              "ranks with exec, not fork", flush=True)
    base = {**os.environ, **spec["env"]}
    ranks: dict[int, int] = {}
    started: list[subprocess.Popen] = []
    for rank in range(nproc):
        env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
               "ROLE_NAME": "default", "LOCAL_WORLD_SIZE": str(nproc), "WORLD_SIZE": str(nproc),
               "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
               "TORCHELASTIC_RUN_ID": spec.get("run_id", "none"), "TORCHELASTIC_USE_AGENT_STORE": "True",
               "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")}
        if forkable:
            pid = os.fork()
            if pid == 0:
                _run_rank(spec, env, listen, status_fd)
        else:
            popen = subprocess.Popen([sys.executable, "-m", spec["module"], *spec["argv"]], env=env,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
            started.append(popen)  # referenced, so that Popen's own reaping never takes a status from waitpid
            pid = popen.pid
        ranks[rank] = pid
    _status(status_fd, ranks=ranks)
    import torch.distributed as dist

    # The store owns the socket from here on (detach: Python must not close it under the store's thread).
    store = dist.TCPStore("127.0.0.1", port, nproc, is_master=True, wait_for_workers=False,  # noqa: F841
                          master_listen_fd=listen.detach(), use_libuv=False)
    code = _supervise(ranks, term)
    if not forkable:
        _status(status_fd, exit=code)
    return code


def _supervise(ranks: dict[int, int], term: list) -> int:
    exits: dict[int, int] = {}  # rank -> exit status as Popen.returncode reads it
    pid_rank = {pid: rank for rank, pid in ranks.items()}
    failed = terminated = False
    while len(exits) < len(ranks):
        for pid, rank in pid_rank.items():
            if rank in exits:
                continue
            got, status = os.waitpid(pid, os.WNOHANG)
            if got:
                exits[rank] = os.waitstatus_to_exitcode(status)
        if any(rc != 0 for rc in exits.values()) and not failed:
            failed = True
            _close(ranks, exits, signal.SIGTERM)
        elif term and len(exits) < len(ranks):
            print(f"[ckpt-chaos agent] received {term[0].name}, shutting down workers", flush=True)
            term.clear()
            terminated = True
            _close(ranks, exits, signal.SIGTERM)
        elif len(exits) < len(ranks):
            time.sleep(POLL_S)
    bad = {r: rc for r, rc in exits.items() if rc != 0}
    for rank, rc in sorted(bad.items()):
        why = f"Signal {-rc} ({_signal_name(rc)}) received by PID {ranks[rank]}" if rc < 0 else f"exitcode {rc}"
        print(f"[ckpt-chaos agent] rank {rank} (pid {ranks[rank]}) failed: {why}", flush=True)
    return 1 if bad or failed or terminated else 0  # torchrun exits 1 on SIGTERM


def _close(ranks: dict[int, int], exits: dict[int, int], sig: signal.Signals) -> None:
    """torchrun's ``SubprocessContext._close``: the signal to every live rank, then SIGKILL after 30 s."""
    live = [r for r in ranks if r not in exits]
    for r in live:
        print(f"[ckpt-chaos agent] Sending process {ranks[r]} closing signal {sig.name}", flush=True)
        try:
            os.kill(ranks[r], sig)
        except ProcessLookupError:
            pass
    end = time.monotonic() + CLOSE_TIMEOUT_S
    while time.monotonic() < end and any(r not in exits for r in live):
        for r in live:
            if r not in exits:
                got, status = os.waitpid(ranks[r], os.WNOHANG)
                if got:
                    exits[r] = os.waitstatus_to_exitcode(status)
        time.sleep(POLL_S)
    for r in live:
        if r not in exits:
            print(f"[ckpt-chaos agent] Unable to shutdown process {ranks[r]} via {sig.name}, "
                  f"forcefully exiting via SIGKILL", flush=True)
            try:
                os.kill(ranks[r], signal.SIGKILL)
            except ProcessLookupError:
                pass
            _, status = os.waitpid(ranks[r], 0)
            exits[r] = os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    code = serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no finalization: the store's thread would abort on a closed socket
