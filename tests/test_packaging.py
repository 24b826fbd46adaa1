"""ckpt-chaos as a user installs it: a wheel in a fresh virtual environment, used from a directory
that has nothing to do with this checkout.

The fresh venv gets the heavy third-party packages (torch, ...) from the project venv through a
``.pth`` file, to stay fast and offline; ckpt-chaos itself, the reference trainer and the proxy
come only from the wheel (the test shows where they were imported from), and the packages of
the ``storage`` extra are left out, to see a scenario that needs it skipped with one line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from ckpt_chaos.extras import EXTRAS, missing_extra
from tests.helpers import REPO

OURS = ("ckpt_chaos", "reference_trainer", "toxiproxy_server")
LEFT_OUT = EXTRAS["storage"]  # the fresh venv lacks this extra
SCENARIO = "kill-rank1-mid-shard-write"
STORAGE_SCENARIO = "errno-eio-on-shard-fsync"  # faultfs: the storage extra


def _distribution_names(entry: Path) -> set[str]:
    """Import names and distribution names an entry of site-packages stands for (lower case)."""
    name = entry.name.lower()
    for suffix in (".dist-info", ".egg-info", ".pth", ".py"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return {name, name.split("-")[0].replace("_", "-"), name.split("-")[0]}


def _deps_dir(tmp: Path) -> Path:
    """The project venv's third-party packages, as links, without this project (its editable
    install would put the checkout on the path) and without the left-out extra."""
    site = Path(next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_relative_to(sys.prefix)))
    deps = tmp / "deps"
    deps.mkdir()
    skip = {*OURS, "ckpt-chaos", *LEFT_OUT}
    for entry in site.iterdir():
        names = _distribution_names(entry)
        if names & skip or "__editable__" in entry.name or entry.name == "__pycache__":
            continue
        (deps / entry.name).symlink_to(entry)
    return deps


def _site_listing(site: Path) -> dict[str, tuple[int, int]]:
    """Every file under site-packages with its size and modification time."""
    return {str(p.relative_to(site)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in sorted(site.rglob("*"))}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """(python of a fresh venv with the wheel installed, its site-packages, a clean environment)."""
    tmp = tmp_path_factory.mktemp("packaging")
    assert not tmp.resolve().is_relative_to(REPO), "the fresh venv must lie outside the checkout"
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources.
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for name in OURS:
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    dist = tmp / "dist"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(dist), str(src)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    wheel = next(dist.glob("ckpt_chaos-*.whl"))

    # Without pip of its own: ensurepip costs half the fixture's CPU, and its old setuptools would shadow
    # the one torch needs (and the constraints pin). The project's pip installs into it (--python).
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "project-deps.pth").write_text(f"{_deps_dir(tmp)}\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CKPT_CHAOS", "VIRTUAL_ENV"))}
    clean["CKPT_CHAOS_CACHE"] = str(tmp / "cache")
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index",
                                "-c", str(REPO / "constraints.txt"), str(wheel)],
                               capture_output=True, text=True, env=clean, cwd=tmp, timeout=300)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return python, site, clean


@pytest.mark.slow
@pytest.mark.nightly
def test_wheel_runs_a_scenario_from_an_unrelated_directory(fresh, tmp_path):
    python, site, env = fresh
    bin_dir = python.parent
    where = subprocess.run([str(python), "-c", "import ckpt_chaos, reference_trainer, toxiproxy_server as t; "
                            "print(ckpt_chaos.__file__); print(reference_trainer.__file__); print(t.__file__)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    for path in where.stdout.split():
        assert Path(path).is_relative_to(site), f"imported from {path}, not from the installed wheel"

    listed = subprocess.run([str(bin_dir / "ckpt-chaos"), "list"], capture_output=True, text=True, env=env,
                            cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    names = {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}
    assert {SCENARIO, STORAGE_SCENARIO, "docker-kill-node-mid-shard-write"} <= names, listed.stdout

    before = _site_listing(site)
    ran = subprocess.run([str(bin_dir / "ckpt-chaos"), "run", SCENARIO], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=500)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    results = list(tmp_path.rglob("results.json"))
    assert results, f"no results.json under {tmp_path}: {ran.stdout[-2000:]}"
    assert SCENARIO in results[0].read_text() and '"pass"' in results[0].read_text()
    assert list(tmp_path.rglob(f"{SCENARIO}/history.jsonl")), "the run's history is not in the current directory"
    assert list((Path(env["CKPT_CHAOS_CACHE"]) / "golden").iterdir()), "the golden run was not cached in the cache"
    assert _site_listing(site) == before, "the run wrote under site-packages"


@pytest.mark.nightly  # make test: the core-without-extras test
@pytest.mark.slow
def test_a_scenario_needing_a_missing_extra_is_skipped_with_one_line(fresh, tmp_path):
    python, _, env = fresh
    line = "needs the 'storage' extra: pip install 'ckpt-chaos[storage]'"
    said = subprocess.run([str(python), "-c", "from ckpt_chaos.extras import missing_extra; "
                           "print(missing_extra('storage')); print(missing_extra('search'))"],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert said.stdout.splitlines() == [line, "None"], said.stdout + said.stderr
    ran = subprocess.run([str(python.parent / "ckpt-chaos"), "run", STORAGE_SCENARIO], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=120)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "SKIPPED" in ran.stdout and line in " ".join(ran.stdout.split()), ran.stdout  # the console wraps
    rows = [r for f in tmp_path.rglob("results.json") for r in json.loads(f.read_text())["results"]]
    assert [r["verdict"] for r in rows] == ["skipped"] and line in rows[0]["reason"], rows
    strict = subprocess.run([str(python.parent / "ckpt-chaos"), "run", STORAGE_SCENARIO, "--strict"],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert strict.returncode == 3, strict.stdout  # cannot run here (ckpt-chaos --help)


def test_missing_extra_names_the_extra_only_when_a_module_is_absent(monkeypatch):
    assert missing_extra("search") is None  # the project venv has every extra
    monkeypatch.setitem(EXTRAS, "search", ("hypothesis", "no_such_module_for_ckpt_chaos"))
    assert missing_extra("search") == "needs the 'search' extra: pip install 'ckpt-chaos[search]'"
    with pytest.raises(ValueError, match="unknown extra 'gpu'"):
        missing_extra("gpu")


@pytest.mark.slow
def test_the_core_imports_and_runs_without_any_extra(tmp_path, golden_root):
    """With every extra's modules made unimportable (but the reference trainer's torch, which the
    scenario trains), the runner imports and a process scenario passes; each extra then reports
    itself missing."""
    blocked = sorted({m for extra, mods in EXTRAS.items() if extra != "trainer" for m in mods})
    code = f"""
import importlib.abc, sys
BLOCKED = {blocked!r}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in BLOCKED:
            raise ModuleNotFoundError(name)
        return None
sys.meta_path.insert(0, Block())
from pathlib import Path
from ckpt_chaos.config import builtin_scenarios
from ckpt_chaos.extras import EXTRAS, missing_extra
from ckpt_chaos.run.runner import run_scenario
from ckpt_chaos.scenario import load
assert all(missing_extra(e) for e in EXTRAS if e != "trainer"), [missing_extra(e) for e in EXTRAS]
r = run_scenario(load(builtin_scenarios() / "process" / "{SCENARIO}.toml"), Path(sys.argv[1]), Path(sys.argv[2]))
print(r.verdict, r.reason)
"""
    # the session's golden run of the scenario: making one runs the same launch the chaos run does
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out"), str(golden_root)],
                       capture_output=True, text=True, cwd=REPO, timeout=500)
    assert p.returncode == 0 and p.stdout.startswith("pass"), p.stdout + p.stderr[-3000:]


def test_constraints_pin_a_version_inside_every_range_of_pyproject():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name.lower().replace("_", "-")] = version.strip()
    requirements = [Requirement(r) for r in project["dependencies"]]
    requirements += [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra
                     if not r.startswith("ckpt-chaos[")]
    for req in requirements:
        name = req.name.lower().replace("_", "-")
        assert name in pins, f"constraints.txt has no pin for {req.name}; regenerate it (see its header)"
        assert req.specifier.contains(pins[name], prereleases=True), \
            f"constraints.txt pins {name}=={pins[name]}, outside pyproject.toml's {req}"
    assert pins["torch"].startswith("2.13."), "CI must run the torch series pyproject.toml states"
