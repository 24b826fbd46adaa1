"""The optional parts of ckpt-chaos, and the one line that says which one to install.

The core (process faults on the local backend, checks, the HTML table) needs only the base
dependencies, torch not among them: the harness never imports it, and a trainer of one's own runs
on the project's torch. Each extra below brings the modules one fault family or tool needs (the
``trainer`` extra: the reference trainer's torch); code that uses them imports them inside
functions and asks ``missing_extra`` first, so a missing extra skips a scenario (or stops a
command) with that line instead of an ImportError.
"""

from __future__ import annotations

import importlib.util

DISTRIBUTION = "ckpt-chaos"

# extra -> the top-level modules it provides (import names, not distribution names)
EXTRAS: dict[str, tuple[str, ...]] = {
    "trainer": ("torch", "torchdata"),  # the reference trainer (the built-in catalogue's); not the harness
    "storage": ("mfusepy",),  # faultfs, the FUSE layer of storage faults
    "cluster": ("docker",),  # the Docker backend (the netns backend needs no Python package)
    "remote": ("boto3", "moto", "flask", "toxiproxy"),  # S3 tier: client, moto's server, the proxy's client
    "search": ("hypothesis",),  # ckpt-chaos explore
    "report": ("matplotlib",),  # plots in reports, cadence, benchmarks
    "coverage": ("coverage",),  # run --coverage: which lines of the trainer the scenarios reach
    "mutation": ("cosmic_ray",),  # make mutation: the mutation score of the trainer's checkpoint path
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or half-removed installation counts as absent
        return False


def missing_extra(name: str) -> str | None:
    """None when every module of extra ``name`` can be imported, else the line to show."""
    if name not in EXTRAS:
        raise ValueError(f"unknown extra {name!r}; extras: {', '.join(EXTRAS)}")
    absent = [m for m in EXTRAS[name] if not _installed(m)]
    if not absent:
        return None
    return f"needs the '{name}' extra: pip install '{DISTRIBUTION}[{name}]'"
