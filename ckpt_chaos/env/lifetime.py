"""Processes that die with the process that started them, even when it dies by SIGKILL.

Linux's PR_SET_PDEATHSIG: the kernel signals a process when its parent ends. Every process the
harness starts and must not outlive it (torchrun, the launcher agent's forks, the S3 server, a
cluster's nodes, a parallel run's workers) asks for it through ``die_with_parent``; elsewhere than
on Linux it does nothing, and ``close`` paths remain what ends them.
"""

from __future__ import annotations

import os
import signal

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def _load_prctl():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:
        return None


# Loaded at import, in the parent: a preexec_fn runs between fork and exec in a copy of a process that
# has threads (the probe server, an import in the background), and a fork of the launcher agent runs
# without exec, so neither may import nor dlopen, whose locks another thread may have held at the fork
# (a child hung in preexec_fn was seen).
_PRCTL = _load_prctl()


def die_with_parent(sig: int = signal.SIGTERM, parent: int | None = None) -> None:
    """This process gets ``sig`` when its parent ends. Usable as a ``preexec_fn`` as it is (SIGTERM:
    torchrun and the servers shut down on it and take their own children with them).

    ``parent``: the pid of the parent, for a process that asks once it runs (after exec) rather than
    in a preexec_fn: the parent may have died before it asked, and then no signal would ever come, so
    it gets ``sig`` at once."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, sig)
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)
