"""The reference trainer on a real CUDA GPU: FSDP2 + DCP under torchrun, one rank, and crash/resume
bit-exact there, checked by the harness itself. Not part of `make test` (CI has no GPU); run it by
hand on a machine with one, from the repository's root (``-m`` puts it on the module path, so the
harness imports where ckpt-chaos is not installed)::

    python3 -m benchmarks.cuda.check_cuda --out DIR                # on the GPU machine
    python3 -m benchmarks.cuda.check_cuda --device cpu --out DIR   # the same path on the CPU

One GPU means one rank: NCCL refuses two ranks on one device. The stages, each with its evidence:

1. ``preflight``: torch, its CUDA build, the GPU, NCCL; with ``--device cuda`` (the default) no GPU
   is a failure (exit 2), never a quiet fall back to the CPU.
2. ``determinism``: two fault-free runs (``torchrun --nproc_per_node=1 -m reference_trainer
   --device cuda``, a full state digest after every step: ``state._gathered``'s all_gather on NCCL)
   must agree bit for bit, step by step, and in their final per-component digests. NCCL's own log
   lines (``NCCL_DEBUG=INFO``) show the collectives ran on the GPU.
3. ``stop-resume``: a run stopped one micro-batch into step 7 (``stop_after_microbatches``: an
   emergency checkpoint with the partial gradients), relaunched, must end on the fault-free run's
   final digests, its steps 7.. bit-exact, its load digests equal to its save digests; the
   checkpoint's per-rank blob must hold a CUDA RNG state (``state.capture_rng``).
4. ``harness``: ``ckpt-chaos run`` over ``benchmarks/cuda/scenarios`` (kill mid shard write, SIGTERM
   mid accumulation, kill mid async save, torchrun's own restart), every launch under torchrun
   (``CKPT_CHAOS_LAUNCHER=torchrun``).
5. ``agent-launcher``: one scenario again under the harness's default launcher, which forks the
   ranks from a process with torch imported (CUDA must not be initialized before the fork).
6. ``cpu-diagnosis``: only where a harness scenario failed: the same scenario with ``device = "cpu"``
   on the same machine, to tell a CUDA problem from one of this machine's torch release.

The trainer asks for no deterministic algorithms; this script sets ``CUBLAS_WORKSPACE_CONFIG=:4096:8``
(cuBLAS's condition for run-to-run reproducible results) for every process unless
``--no-cublas-config``, and says so in its summary.

Writes into ``--out`` (at most 8 files): ``summary.json``, ``summary.txt``, ``junit.xml`` (the
harness's), ``logs.tar.gz`` (every run's logs, trajectories, events and results; no tensor files).
Exit status: 0 every check passed, 1 a check failed, 2 preflight failed (no GPU, a missing package).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
from pathlib import Path

from ckpt_chaos.check.history import read_jsonl  # stdlib only: safe before the preflight

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = Path(__file__).resolve().parent / "scenarios"
# the scenarios' training, also that of the direct runs (stages 2 and 3)
TRAIN = {"max_steps": 12, "ckpt_every_steps": 4, "dataset_size": 96, "global_batch": 16, "grad_accum": 2,
         "collective_timeout_s": 60}
EXACT = ("loss_hex", "grad_norm_hex", "lr_hex", "tokens_seen", "batch_digest", "state_digest")
AGENT_SCENARIO = "cuda-kill-mid-shard-write"
SUPPORTED_TORCH = (2, 13)  # pyproject.toml's trainer extra: torch>=2.13
# Scenarios that fail for a reason of an older torch's own, whatever the device: left out below
# SUPPORTED_TORCH unless --all-scenarios (found on the CPU with torch 2.11.0, the GPU machine's).
NEEDS_SUPPORTED_TORCH = {
    "cuda-kill-async-save-mid-write":
        "torch < 2.13: a DefaultStager's second stage() fails with KeyError: <class 'type'> "
        "(torch/distributed/checkpoint/_state_dict_stager.py, deepcopy_with_tensor_offload), so every async "
        "save after the first is discarded",
}
NEEDED = ("torch", "numpy", "psutil", "filelock", "platformdirs", "jinja2", "rich", "tomli_w", "xxhash", "torchdata")


class Checks:
    def __init__(self):
        self.rows: list[dict] = []

    def add(self, stage: str, name: str, ok: bool | None, detail: str) -> bool:
        verdict = "skip" if ok is None else ("pass" if ok else "FAIL")
        self.rows.append({"stage": stage, "check": name, "verdict": verdict, "detail": detail})
        print(f"  {verdict:<4} {stage}/{name}: {detail}", flush=True)
        return bool(ok)

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.rows if r["verdict"] == "FAIL"]


def by_step(run_dir: Path) -> dict[int, dict]:
    """The trajectory, the last record of each step (a relaunch appends)."""
    return {r["step"]: r for r in read_jsonl(run_dir / "trajectory.jsonl")}


def tail(path: Path, n: int = 2500) -> str:
    return path.read_text(errors="replace")[-n:] if path.is_file() else f"({path} missing)"


class Runner:
    def __init__(self, args, env: dict[str, str], deadline: float):
        self.args, self.env, self.deadline = args, env, deadline

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, cmd: list[str], log: Path, timeout: float, env: dict[str, str] | None = None,
            stdout: Path | None = None) -> int | None:
        """Run ``cmd`` from the repo root, output to ``log`` (its stdout to ``stdout`` where given); None
        when it ran past ``timeout`` (killed)."""
        timeout = max(5.0, min(timeout, self.left()))
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as f:
            f.write(f"$ {' '.join(cmd)}\n".encode())
            f.flush()
            so = open(stdout, "wb") if stdout is not None else f
            try:
                p = subprocess.Popen(cmd, cwd=ROOT, stdout=so, stderr=subprocess.STDOUT if stdout is None else f,
                                     env={**self.env, **(env or {})}, start_new_session=True)
                try:
                    return p.wait(timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, 9)
                    p.wait()
                    f.write(f"\n[check_cuda] killed after {timeout:.0f}s\n".encode())
                    return None
            finally:
                if so is not f:
                    so.close()

    def trainer(self, run_dir: Path, timeout: float, nccl_log: bool = False, **overrides) -> int | None:
        cfg = {**TRAIN, "device": self.args.device, "run_dir": str(run_dir), **overrides}
        cmd = [self.args.python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
               "-m", "reference_trainer", *[f"--{k.replace('_', '-')}={v}" for k, v in cfg.items()]]
        env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,COLL"} if nccl_log else {}
        return self.run(cmd, run_dir / "launch.log", timeout, env)


# ---- stage 1 ---------------------------------------------------------------------------------------

PREFLIGHT = r"""
import json, sys, importlib, importlib.metadata as md
out = {"python": sys.version.split()[0], "executable": sys.executable, "missing": [], "versions": {}}
for name in sys.argv[1].split(","):
    try:
        importlib.import_module(name)
        try:
            out["versions"][name] = md.version(name.replace("_", "-"))
        except Exception:
            out["versions"][name] = "?"
    except Exception as e:
        out["missing"].append(f"{name} ({type(e).__name__}: {e})")
import torch
out["torch"] = torch.__version__
out["torch_cuda_build"] = torch.version.cuda
out["cuda_available"] = torch.cuda.is_available()
out["device_count"] = torch.cuda.device_count() if out["cuda_available"] else 0
if out["cuda_available"]:
    p = torch.cuda.get_device_properties(0)
    out["gpu"] = p.name
    out["capability"] = list(torch.cuda.get_device_capability(0))
    out["memory_gib"] = round(p.total_memory / 2**30, 1)
    x = torch.randn(256, 256, device="cuda")
    out["matmul_ok"] = bool(torch.isfinite(x @ x).all().item())
    try:
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as e:
        out["nccl"] = f"unknown ({e})"
print(json.dumps(out))
"""


def preflight(r: Runner, checks: Checks, work: Path) -> dict:
    log = work / "preflight.log"
    rc = r.run([r.args.python, "-c", PREFLIGHT, ",".join(NEEDED)], log, 120)
    info: dict = {}
    for line in reversed(tail(log, 20000).splitlines()):
        if line.startswith("{"):
            info = json.loads(line)
            break
    smi = shutil.which("nvidia-smi")
    if smi:
        q = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=60)
        info["nvidia_smi"] = (q.stdout or q.stderr).strip()
    if rc != 0 or not info:
        checks.add("preflight", "python", False, f"the preflight probe failed (exit {rc}): {tail(log, 800)}")
        return info
    if release(info["torch"]) < SUPPORTED_TORCH:
        checks.add("preflight", "torch release", None,
                   f"torch {info['torch']} is older than the trainer's range (torch>="
                   f"{'.'.join(map(str, SUPPORTED_TORCH))}, pyproject.toml): a failure may be that release's own")
    checks.add("preflight", "packages", not info["missing"],
               "all importable: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items())
               if not info["missing"] else "missing: " + "; ".join(info["missing"]))
    if r.args.device == "cuda":
        gpu = info.get("cuda_available") and info.get("device_count", 0) >= 1
        checks.add("preflight", "gpu", bool(gpu),
                   f"{info.get('gpu')} (sm_{''.join(map(str, info.get('capability', [])))}, "
                   f"{info.get('memory_gib')} GiB), torch {info['torch']} built for CUDA {info['torch_cuda_build']}, "
                   f"NCCL {info.get('nccl')}, nvidia-smi: {info.get('nvidia_smi', 'not found')}" if gpu else
                   f"NO CUDA GPU SEEN: torch {info['torch']} (CUDA build: {info['torch_cuda_build']}), "
                   f"torch.cuda.is_available()={info.get('cuda_available')}, nvidia-smi: "
                   f"{info.get('nvidia_smi', 'not found')}; refusing to fall back to the CPU")
        if gpu:
            checks.add("preflight", "matmul", info.get("matmul_ok", False), "a matrix product on the GPU is finite")
    else:
        checks.add("preflight", "device", True, f"--device cpu (torch {info['torch']}): the CUDA path is NOT exercised")
    return info


# ---- stage 2 and 3 -----------------------------------------------------------------------------------

def compare(a: dict[int, dict], b: dict[int, dict], steps) -> str | None:
    for step in steps:
        ra, rb = a.get(step), b.get(step)
        if ra is None or rb is None:
            return f"step {step} missing in {'the first' if ra is None else 'the second'} run"
        differ = [k for k in EXACT if ra.get(k) != rb.get(k)]
        if differ:
            return f"step {step} differs in {', '.join(differ)}: {[(k, ra.get(k), rb.get(k)) for k in differ]}"
    return None


def release(version: str) -> tuple[int, ...]:
    m = re.match(r"\s*(\d+(?:\.\d+)*)", version)
    return tuple(int(x) for x in m.group(1).split(".")) if m else ()


def final(run_dir: Path) -> dict | None:
    p = run_dir / "final_state.json"
    return json.loads(p.read_text()) if p.is_file() else None


def determinism(r: Runner, checks: Checks, work: Path) -> Path | None:
    runs = []
    for name in ("fault-free-a", "fault-free-b"):
        d = work / name
        rc = r.trainer(d, 240, nccl_log=(name == "fault-free-a"), digest_every=1)
        if not checks.add("determinism", f"{name} runs", rc == 0 and final(d) is not None,
                          f"exit {rc}, {len(by_step(d))} steps" if rc == 0 else
                          f"exit {rc}; its log: {tail(d / 'launch.log')}"):
            return None
        runs.append(d)
    a, b = runs
    ta, tb = by_step(a), by_step(b)
    diff = compare(ta, tb, range(1, TRAIN["max_steps"] + 1))
    checks.add("determinism", "trajectory bit-exact", diff is None,
               diff or f"{len(ta)} steps: loss, grad norm, LR, batch and full model+optimizer digest equal at every step")
    fa, fb = final(a), final(b)
    checks.add("determinism", "final digests equal", fa == fb,
               f"state_digest {fa['state_digest']}" if fa == fb else f"{fa} != {fb}")
    if r.args.device == "cuda":
        text = tail(a / "launch.log", 10**7)
        nccl = [ln for ln in text.splitlines() if "NCCL INFO" in ln]
        init = [ln.strip() for ln in nccl if any(k in ln for k in ("Init COMPLETE", "cudaDev", "ncclCommInitRank"))]
        checks.add("determinism", "NCCL on the GPU", bool(init),
                   (init[0][-220:] if init else f"no NCCL INFO init line in {a / 'launch.log'} "
                                                  f"({len(nccl)} NCCL lines): did it run on the GPU?"))
    return a


RNG_PROBE = r"""
import json, pickle, sys, tempfile, os, torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
out = os.path.join(tempfile.mkdtemp(), "ckpt.pt")
dcp_to_torch_save(sys.argv[1], out)
sd = torch.load(out, weights_only=False)
rank0 = pickle.loads(sd["rank0"])
meta = pickle.loads(sd["meta"])
grads = sd.get("grads") or {}
print(json.dumps({"cuda_rng_states": len(rank0["rng"]["cuda"]), "device": meta["config"]["device"],
                  "progress": {k: meta["progress"][k] for k in ("step", "micro")}, "grads": len(grads),
                  "keys": sorted(sd)}))
"""


def stop_resume(r: Runner, checks: Checks, work: Path, golden: Path) -> None:
    d = work / "stop-resume"
    stop_at = TRAIN["grad_accum"] * 6 + 1  # one micro-batch into step 7
    rc = r.trainer(d, 240, digest_every=1, stop_after_microbatches=stop_at)
    ckpts = sorted(p for p in (d / "checkpoints").glob("step_*") if p.is_dir()) if (d / "checkpoints").is_dir() else []
    mid = [p for p in ckpts if p.name == "step_00000006.001"]
    if not checks.add("stop-resume", "stop mid-accumulation", rc == 0 and bool(mid),
                      f"exit {rc}, checkpoints {[p.name for p in ckpts]}" if rc == 0 else
                      f"exit {rc}; its log: {tail(d / 'launch.log')}"):
        return
    log = work / "stop-resume-rng.log"
    probe_rc = r.run([r.args.python, "-c", RNG_PROBE, str(mid[0])], log, 120)
    lines = [ln for ln in tail(log, 20000).splitlines() if ln.startswith("{")]
    if probe_rc == 0 and lines:
        info = json.loads(lines[-1])
        want = 1 if r.args.device == "cuda" else 0
        checks.add("stop-resume", "checkpoint contents",
                   info["cuda_rng_states"] >= want and info["device"] == r.args.device and info["grads"] > 0
                   and info["progress"] == {"step": 6, "micro": 1},
                   f"{mid[0].name}: device={info['device']}, {info['cuda_rng_states']} CUDA RNG state(s), "
                   f"{info['grads']} partial gradients, progress {info['progress']}")
    else:
        checks.add("stop-resume", "checkpoint contents", False, f"could not read {mid[0]}: {tail(log, 800)}")
    rc = r.trainer(d, 240, digest_every=1, stop_after_microbatches=0)
    if not checks.add("stop-resume", "relaunch finishes", rc == 0 and final(d) is not None,
                      f"exit {rc}" if rc == 0 else f"exit {rc}; its log: {tail(d / 'launch.log')}"):
        return
    loaded = [e for e in read_jsonl(d / "events.jsonl") if e.get("event") == "loaded"]
    ok = bool(loaded) and loaded[-1]["name"] == "step_00000006.001" and loaded[-1]["digests"] == loaded[-1]["saved_digests"]
    checks.add("stop-resume", "load digests = save digests", ok,
               f"{loaded[-1]['name']}: {len(loaded[-1]['digests'] or {})} components equal" if ok else
               f"loaded events: {loaded[-1:]}")
    diff = compare(by_step(golden), by_step(d), range(1, TRAIN["max_steps"] + 1))
    checks.add("stop-resume", "trajectory = fault-free", diff is None,
               diff or "steps 1-12 bit-exact with the fault-free run (7-12 after the resume)")
    fg, fd = final(golden), final(d)
    checks.add("stop-resume", "final digests = fault-free", fg == fd,
               f"state_digest {fd['state_digest']}, {', '.join(sorted(fd['digests']))}" if fg == fd else
               f"fault-free {fg} != resumed {fd}")


# ---- stage 4, 5 and 6 ----------------------------------------------------------------------------------

def scenario_copies(dest: Path, device: str, names: list[str] | None = None) -> list[str]:
    """The scenario files with ``device`` set (``--device cpu`` runs the same scenarios on the CPU)."""
    import tomli_w

    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for p in sorted(SCENARIOS.glob("*.toml")):
        if names is not None and p.stem not in names:
            continue
        data = tomllib.loads(p.read_text())
        data["trainer"]["device"] = device
        (dest / p.name).write_text(tomli_w.dumps(data))
        out.append(p.stem)
    return out


def harness(r: Runner, checks: Checks, work: Path, stage: str, device: str, launcher: str | None,
            names: list[str] | None, junit: Path | None, timeout: float) -> list[str]:
    """``ckpt-chaos run`` over the scenario copies; the names of those that did not pass."""
    folder = work / stage / "scenarios"
    chosen = scenario_copies(folder, device, names)
    cmd = [r.args.python, "-m", "ckpt_chaos.cli", "run", "--scenarios", str(folder), "--suite", "full",
           "--out", str(work / stage), "--golden-dir", str(work / "golden"), "--plots", "none", "--json",
           "-n", str(r.args.jobs)]
    if junit is not None:
        cmd += ["--junitxml", str(junit)]
    env = {"CKPT_CHAOS_LAUNCHER": launcher} if launcher else {}
    log, stdout = work / stage / "harness.log", work / stage / "report.json"
    rc = r.run(cmd, log, timeout, env, stdout=stdout)
    try:
        report = json.loads(stdout.read_text())
    except (OSError, json.JSONDecodeError):
        report = None
    if report is None:
        checks.add(stage, "ckpt-chaos run", False, f"exit {rc}, no JSON report; its log: {tail(log)}")
        return chosen
    rows = {row["scenario"]: row for row in report["results"]}
    bad = []
    for name in chosen:
        row = rows.get(name)
        if row is None:
            checks.add(stage, name, False, "not run (time limit?)")
            bad.append(name)
            continue
        failing = [c for c in row.get("checks", []) if c["verdict"] not in ("pass", "warn")]
        warns = [f"{c['name']}: {c['detail']}" for c in row.get("checks", []) if c["verdict"] == "warn"]
        ok = row["verdict"] == "pass"
        detail = (f"{len(row.get('checks', []))} checks pass in {row['wall_s']:.0f}s" if ok else
                  f"verdict {row['verdict']} {row.get('reason') or ''}; " +
                  " | ".join(f"{c['name']}: {c['detail']}" for c in failing)[:1500])
        if warns:
            detail += " [warnings: " + " | ".join(warns)[:600] + "]"
        if not checks.add(stage, name, ok, detail):
            bad.append(name)
    return bad


# ---- main ----------------------------------------------------------------------------------------------

def pack(work: Path, out: Path) -> None:
    """The runs' text (logs, trajectories, events, manifests, results), no tensor files."""
    keep = (".log", ".jsonl", ".json", ".toml", ".xml", ".txt", ".html")
    with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
        for p in sorted(work.rglob("*")):
            if p.is_file() and not p.is_symlink() and p.suffix in keep and p.stat().st_size < 4 * 2**20:
                tar.add(p, arcname=str(p.relative_to(work.parent)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cuda (default; no GPU is a failure) or cpu (the same path without a GPU)")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "build" / "cuda-check"),
                    help="where summary.json, summary.txt, junit.xml and logs.tar.gz go (default: $OUT)")
    ap.add_argument("--work", default="/tmp/ckpt-chaos-cuda-check", help="scratch folder (emptied first)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter with torch (default: this one)")
    ap.add_argument("--jobs", type=int, default=2, help="scenarios at once in the harness stage")
    ap.add_argument("--budget-s", type=float, default=420, help="stop starting stages after this long")
    ap.add_argument("--skip", action="append", default=[], choices=("determinism", "stop-resume", "harness", "agent"),
                    help="leave a stage out (repeatable)")
    ap.add_argument("--all-scenarios", action="store_true",
                    help=f"also run {', '.join(NEEDS_SUPPORTED_TORCH)} under a torch older than "
                         f"{'.'.join(map(str, SUPPORTED_TORCH))}, where it fails for the reason its entry says")
    ap.add_argument("--no-cublas-config", action="store_true", help="do not set CUBLAS_WORKSPACE_CONFIG=:4096:8")
    args = ap.parse_args()
    started = time.monotonic()
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]),
           "CKPT_CHAOS_CACHE": str(work / "cache")}
    if not args.no_cublas_config:
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path, even on a GPU machine
    r = Runner(args, env, started + args.budget_s)
    checks = Checks()
    print(f"[check_cuda] device={args.device} python={args.python} work={work} out={out}", flush=True)

    print("[check_cuda] 1 preflight", flush=True)
    info = preflight(r, checks, work)
    code = 0
    if checks.failed:
        code = 2
        print("[check_cuda] PREFLIGHT FAILED: nothing else is run", flush=True)
    else:
        golden = None
        if "determinism" not in args.skip:
            print("[check_cuda] 2 determinism: two fault-free runs", flush=True)
            golden = determinism(r, checks, work)
        if golden is not None and "stop-resume" not in args.skip:
            print("[check_cuda] 3 stop-resume: emergency stop mid-accumulation, relaunch", flush=True)
            stop_resume(r, checks, work, golden)
        bad: list[str] = []
        if "harness" not in args.skip:
            print("[check_cuda] 4 harness: ckpt-chaos run over benchmarks/cuda/scenarios, torchrun", flush=True)
            names = sorted(p.stem for p in SCENARIOS.glob("*.toml"))
            if release(info.get("torch", "")) < SUPPORTED_TORCH and not args.all_scenarios:
                for name, why in NEEDS_SUPPORTED_TORCH.items():
                    names.remove(name)
                    checks.add("harness", name, None, f"left out (--all-scenarios runs it): {why}")
            bad = harness(r, checks, work, "harness", args.device, "torchrun", names, out / "junit.xml",
                          r.left() - 60)
        if "agent" not in args.skip:
            if r.left() > 60:
                print("[check_cuda] 5 agent-launcher: one scenario, ranks forked by the harness's agent", flush=True)
                harness(r, checks, work, "agent-launcher", args.device, "agent", [AGENT_SCENARIO], None, r.left() - 30)
            else:
                checks.add("agent-launcher", AGENT_SCENARIO, None, "no time left")
        if bad and args.device == "cuda":
            if r.left() > 45:
                print(f"[check_cuda] 6 cpu-diagnosis: {', '.join(bad)} on the CPU of this machine", flush=True)
                diag = Checks()
                harness(r, diag, work, "cpu-diagnosis", "cpu", "torchrun", bad, None, r.left() - 10)
                for row in diag.rows:  # information: which failures are CUDA's own
                    checks.rows.append({**row, "verdict": f"info-{row['verdict']}"})
            else:
                checks.add("cpu-diagnosis", "skipped", None, "no time left")
        code = 1 if checks.failed else 0

    wall = time.monotonic() - started
    summary = {"device": args.device, "exit_status": code, "wall_s": round(wall, 1), "preflight": info,
               "cublas_workspace_config": env.get("CUBLAS_WORKSPACE_CONFIG"),
               "passed": sum(r_["verdict"] == "pass" for r_ in checks.rows),
               "failed": len(checks.failed), "checks": checks.rows}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = [f"ckpt-chaos CUDA check: device={args.device}, torch {info.get('torch')}, "
             f"GPU {info.get('gpu', 'none')}, {wall:.0f}s, CUBLAS_WORKSPACE_CONFIG={env.get('CUBLAS_WORKSPACE_CONFIG')}"]
    lines += [f"{c['verdict']:<9} {c['stage']}/{c['check']}: {c['detail']}" for c in checks.rows]
    verdict = {0: "PASS: every check passed", 1: f"FAIL: {len(checks.failed)} check(s) failed",
               2: "FAIL: preflight (no GPU or a missing package); nothing ran"}[code]
    lines.append(f"{verdict}; {summary['passed']} passed, {summary['failed']} failed")
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    try:
        pack(work, out)
    except OSError as e:
        print(f"[check_cuda] could not pack the logs: {e}", flush=True)
    print("\n".join(["", "=" * 100, *lines, "=" * 100]), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
