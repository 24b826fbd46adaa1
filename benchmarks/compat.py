"""ckpt-chaos beside another torch release: the same verdicts, and its torch left alone (`make compat`).

ckpt-chaos installs next to a training project's own torch. This check takes two virtual
environments: ``.venv`` (``make setup``: the torch release CI runs) and a second one holding
another torch release with the Lightning, Accelerate and transformers releases beside it (``make
compat`` makes ``.venv-compat``). It

1. builds the ckpt-chaos wheel from a copy of this checkout and installs it, with the core extras
   (``storage,cluster,remote,search,report``: not ``trainer`` or ``examples``), into the second
   environment, and fails if that installs, replaces or removes any torch (``pip list`` before and
   after, and pip's own output, are kept in ``build/compat/install.log``);
2. runs the plain PyTorch and Lightning examples' kill-mid-write and SIGTERM scenarios with each
   environment's ``ckpt-chaos``, from a folder that holds only a link to ``examples/`` (so that the
   second one's trainers import ckpt-chaos from its wheel, not from the checkout);
3. writes ``benchmarks/results/compat.json`` and the table ``compat.md``: each scenario's verdict
   under each torch, and the releases the probe layer found in the trainers' processes; and exits 1
   when a verdict differs between the two (or the install touched torch).

    python benchmarks/compat.py --venv .venv --venv .venv-compat
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
WORK = ROOT / "build" / "compat"
OURS = ("ckpt_chaos", "reference_trainer", "toxiproxy_server")
CORE_EXTRAS = "storage,cluster,remote,search,report"
FOLDERS = ("examples/plain_ddp/scenarios", "examples/lightning/scenarios")
SCENARIOS = ("plain-ddp-kill-rank0-mid-file-write", "plain-ddp-term-rank1-only",
             "lightning-kill-rank0-mid-checkpoint-write", "lightning-term-rank1-only")
FRAMEWORKS = ("torch", "lightning", "accelerate", "transformers")
TORCHISH = ("torch", "torchdata", "torchvision", "torchaudio", "triton")


def sh(*cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)


def torch_packages(venv: Path) -> dict[str, str]:
    """The torch-family distributions installed in ``venv``: name -> version."""
    out = sh(venv / "bin" / "python", "-m", "pip", "list", "--format=json", "--disable-pip-version-check")
    if out.returncode != 0:
        raise SystemExit(f"compat: pip list in {venv} failed: {out.stderr.strip()}")
    return {p["name"].lower(): p["version"] for p in json.loads(out.stdout)
            if p["name"].lower() in TORCHISH or p["name"].lower().startswith("torch")}


def releases(venv: Path) -> dict[str, str | None]:
    """Python and the framework releases installed in ``venv`` (from their metadata: no import)."""
    code = ("import importlib.metadata as m, json, platform\n"
            "def v(d):\n"
            "    try: return m.version(d)\n"
            "    except m.PackageNotFoundError: return None\n"
            f"print(json.dumps({{'python': platform.python_version(), **{{d: v(d) for d in {FRAMEWORKS!r}}}}}))")
    return json.loads(sh(venv / "bin" / "python", "-c", code, check=True).stdout)


def build_wheel(python: Path) -> Path:
    """The wheel, built from a copy of the checkout (setuptools writes build/ and *.egg-info beside
    the sources it builds), without build isolation: offline, with the setuptools of ``python``."""
    src, dist = WORK / "src", WORK / "dist"
    for d in (src, dist):
        shutil.rmtree(d, ignore_errors=True)
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in OURS:
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    built = sh(python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, src)
    if built.returncode != 0:
        raise SystemExit(f"compat: building the wheel failed:\n{built.stdout}{built.stderr}")
    return next(dist.glob("ckpt_chaos-*.whl"))


def install(venv: Path, wheel: Path, log: Path) -> dict:
    """Installs the wheel with the core extras into ``venv`` (a version installed there before is
    removed first, so pip resolves the wheel's requirements afresh); the torch packages before and
    after, and what pip printed about torch."""
    before = torch_packages(venv)
    pip = venv / "bin" / "python", "-m", "pip"
    sh(*pip, "uninstall", "-y", "ckpt-chaos")
    started = time.monotonic()
    done = sh(*pip, "install", "--progress-bar", "off", f"{wheel}[{CORE_EXTRAS}]")
    wall = time.monotonic() - started
    after = torch_packages(venv)
    lines = (done.stdout + done.stderr).splitlines()
    log.write_text("\n".join([f"$ pip list | grep torch  (before)", *(f"{k} {v}" for k, v in sorted(before.items())),
                              f"$ pip install '{wheel.name}[{CORE_EXTRAS}]'  ({wall:.1f} s, exit {done.returncode})",
                              *(line for line in lines if "is ignored" not in line),
                              "$ pip list | grep torch  (after)", *(f"{k} {v}" for k, v in sorted(after.items()))]) + "\n")
    if done.returncode != 0:
        raise SystemExit(f"compat: pip install of the wheel into {venv} failed; see {log}")
    about_torch = [line.strip() for line in lines if "torch" in line.lower() and "is ignored" not in line]
    return {"before": before, "after": after, "unchanged": before == after, "pip_about_torch": about_torch,
            "wall_s": round(wall, 1)}


def run(venv: Path, out: Path) -> dict:
    """The scenarios under ``venv``'s ckpt-chaos, from a folder with only ``examples`` in it."""
    here = WORK / "work"
    here.mkdir(parents=True, exist_ok=True)
    link = here / "examples"
    if not link.is_symlink():
        link.symlink_to(ROOT / "examples")
    shutil.rmtree(out, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    started = time.monotonic()
    done = sh(venv / "bin" / "ckpt-chaos", "run", *SCENARIOS, *(a for f in FOLDERS for a in ("--scenarios", f)),
              "--out", out, "--json", cwd=here, env=env, timeout=3600)
    wall = time.monotonic() - started
    (out.parent / f"{out.name}.log").write_text(done.stderr)
    try:
        data = json.loads(done.stdout)
    except ValueError:
        raise SystemExit(f"compat: ckpt-chaos run under {venv} gave no results (exit {done.returncode}):\n"
                         f"{done.stderr[-3000:]}")
    rows = {}
    for r in data["results"]:
        versions = next((c for c in r.get("checks", []) if c["name"] == "probe_versions"), None)
        rows[r["scenario"]] = {"verdict": r["verdict"], "reason": r.get("reason", ""), "wall_s": round(r["wall_s"], 1),
                               "probe_versions": versions and {"verdict": versions["verdict"],
                                                               "detail": versions["detail"]}}
    return {"exit_status": done.returncode, "wall_s": round(wall, 1), "results": rows}


def markdown(d: dict) -> str:
    envs = d["venvs"]
    names = [f"torch {e['releases']['torch']}" for e in envs]
    out = ["<!-- generated by `make compat` (benchmarks/compat.py) from `compat.json`; do not edit by hand -->",
           "# The example scenarios under two torch releases", "",
           f"`make compat`, {d['date']} ({d['cpus']} CPUs, no GPU: the CUDA build runs on the CPU). The plain PyTorch "
           "and Lightning examples' kill-mid-write and SIGTERM scenarios, run by each environment's own ckpt-chaos "
           "(in the second, the wheel with the core extras, installed beside its torch). A verdict that differs "
           "fails `make compat`.", "",
           "| environment | Python | torch | Lightning | Accelerate | transformers | wall |", "|---|---|---|---|---|---|---|"]
    for e in envs:
        r = e["releases"]
        out.append(f"| `{e['venv']}` | {r['python']} | {r['torch']} | {r['lightning']} | {r['accelerate']} | "
                   f"{r['transformers']} | {e['run']['wall_s']:.0f} s |")
    out += ["", "| scenario | " + " | ".join(names) + " | same |", "|---|" + "---|" * len(names) + "---|"]
    for s in SCENARIOS:
        got = [e["run"]["results"].get(s, {}).get("verdict", "missing") for e in envs]
        out.append(f"| {s} | " + " | ".join(got) + f" | {'yes' if len(set(got)) == 1 else '**no**'} |")
    out += ["", "What the probe layer found in the trainers' processes (the `probe_versions` check):", ""]
    for e in envs:
        seen = sorted({v["probe_versions"]["detail"] for v in e["run"]["results"].values() if v["probe_versions"]})
        out.append(f"* `{e['venv']}`: " + ("; ".join(seen) or "nothing reported"))
    i = d["install"]
    after = ", ".join(f"{k} {v}" for k, v in sorted(i["after"].items()))
    out += ["", f"Installing the wheel with `[{CORE_EXTRAS}]` into `{envs[-1]['venv']}` "
            f"({i['wall_s']:.0f} s): torch packages before and after: {after}; "
            + ("unchanged." if i["unchanged"] else "**changed** (see build/compat/install.log).")
            + (f" pip on torch: {'; '.join(i['pip_about_torch'])}." if i["pip_about_torch"] else
               " pip's output names no torch package: the wheel requires none."), ""]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--venv", action="append", type=Path, required=True,
                    help="an environment to run the scenarios in (twice: the first is the reference; the wheel "
                         "is installed into the others)")
    args = ap.parse_args()
    venvs = [v if v.is_absolute() else ROOT / v for v in args.venv]
    if len(venvs) != 2:
        ap.error("give --venv twice: the reference environment, then the one with the other torch")
    for v in venvs:
        if not (v / "bin" / "python").exists():
            ap.error(f"{v}: no virtual environment there")
    WORK.mkdir(parents=True, exist_ok=True)
    base, other = venvs
    wheel = build_wheel(base / "bin" / "python")
    installed = install(other, wheel, WORK / "install.log")
    print(f"compat: installed {wheel.name}[{CORE_EXTRAS}] into {other.name}: torch packages "
          f"{'unchanged' if installed['unchanged'] else 'CHANGED'}: {installed['after']} (log: {WORK / 'install.log'})",
          flush=True)
    data = {"date": datetime.date.today().isoformat(), "cpus": os.cpu_count(), "host_python": platform.python_version(),
            "scenarios": list(SCENARIOS), "install": installed, "venvs": []}
    for v in venvs:
        rel = releases(v)
        print(f"compat: {v.name}: torch {rel['torch']}, running {len(SCENARIOS)} scenarios ...", flush=True)
        result = run(v, WORK / f"out-{v.name.lstrip('.')}")
        print(f"compat: {v.name}: " + ", ".join(f"{s} {r['verdict']}" for s, r in result["results"].items()),
              flush=True)
        data["venvs"].append({"venv": v.name, "releases": rel, "run": result})
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "compat.json").write_text(json.dumps(data, indent=1) + "\n")
    (RESULTS / "compat.md").write_text(markdown(data))
    differ = [s for s in SCENARIOS if len({e["run"]["results"].get(s, {}).get("verdict") for e in data["venvs"]}) != 1]
    print(f"compat: table: {(RESULTS / 'compat.md').relative_to(ROOT)}")
    if not installed["unchanged"]:
        print(f"compat: FAILED: installing the wheel changed torch in {other.name}: {installed['before']} -> "
              f"{installed['after']}", file=sys.stderr)
    for s in differ:
        print(f"compat: FAILED: {s}: " + ", ".join(
            f"{e['venv']} {e['run']['results'].get(s, {}).get('verdict', 'missing')}" for e in data["venvs"]),
            file=sys.stderr)
    return 1 if differ or not installed["unchanged"] else 0


if __name__ == "__main__":
    sys.exit(main())
