"""DeepSpeed 0.19.8: save_checkpoint lets rank 0 rewrite ``latest`` while another rank is still
writing its ZeRO optimizer shard: a crash in that window leaves ``latest`` naming a checkpoint with a
torn shard, and every ``load_checkpoint(dir)`` after it fails although the checkpoint before it is
whole (deepspeed/runtime/engine.py: no collective between the tag check, :4912, and the barrier
after ``latest``, :4964; rank 0 writes ``latest`` at :4960-4962 once its own files are written).

Two processes (ZeRO stage 2, gloo, the CPU accelerator); plain Python, nothing else:

    DS_ACCELERATOR=cpu python deepspeed_latest_before_shards.py

The first launch saves global_step1, then global_step2, where rank 1's file system stalls half-way
through its shard (its torch.save writes half the bytes and hangs, as a slow network file system
does). As soon as ``latest`` says global_step2, both processes are SIGKILLed (the node is lost). The
second launch calls load_checkpoint(dir) on both ranks, as a training script does on start.
"""

import io
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

CONFIG = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10**9, "zero_optimization": {"stage": 2},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}}}
SHARD = "global_step2/zero_pp_rank_1_mp_rank_00_optim_states.pt"


def child(ckpt: str, rank: int, train: bool) -> None:
    import deepspeed
    import torch

    deepspeed.init_distributed(dist_backend="gloo")
    model = torch.nn.Linear(4, 1)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=CONFIG)
    path, _ = engine.load_checkpoint(ckpt)
    print(f"rank {rank}: load_checkpoint(dir) -> {path}", flush=True)
    if not train:
        return
    for step in (1, 2):
        engine.backward(engine(torch.randn(2, 4)).pow(2).mean())
        engine.step()
        if step == 2 and rank == 1:
            real_save = torch.save

            def stalled_save(obj, f, *args, **kwargs):
                if not os.fspath(f).endswith(SHARD):
                    return real_save(obj, f, *args, **kwargs)
                buf = io.BytesIO()
                real_save(obj, buf, *args, **kwargs)
                with open(f, "wb") as out:
                    out.write(buf.getvalue()[: len(buf.getvalue()) // 2])
                time.sleep(3600)  # the file system stalls here

            torch.save = stalled_save
        engine.save_checkpoint(ckpt, tag=f"global_step{step}")


def launch(ckpt: str, train: bool) -> list[subprocess.Popen]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")
        procs.append(subprocess.Popen([sys.executable, __file__, "child", ckpt, str(rank), str(int(train))],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def main() -> None:
    ckpt = tempfile.mkdtemp(prefix="ds-latest-before-shards-")
    latest = os.path.join(ckpt, "latest")
    procs = launch(ckpt, train=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not (os.path.exists(latest) and open(latest).read() == "global_step2"):
        if all(p.poll() is not None for p in procs):
            break
        time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.communicate()
    print("launch 1 SIGKILLed once `latest` held", repr(open(latest).read()))
    for step in (1, 2):
        for name in sorted(os.listdir(os.path.join(ckpt, f"global_step{step}"))):
            print(f"  global_step{step}/{name}: {os.path.getsize(os.path.join(ckpt, f'global_step{step}', name))} bytes")
    procs = launch(ckpt, train=False)
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=300))
        except subprocess.TimeoutExpired:  # a rank left waiting for the one that failed
            p.kill()
            outs.append(p.communicate())
    for rank, (p, (out, err)) in enumerate(zip(procs, outs)):
        said = (out if p.returncode == 0 else err).strip().splitlines() or [""]
        print(f"launch 2, rank {rank}: exit {p.returncode}; {said[-1]}")
    bug = open(latest).read() == "global_step2" and procs[1].returncode != 0
    print("BUG REPRODUCED: `latest` names a checkpoint whose rank-1 shard is torn; the resume fails"
          if bug else "not reproduced")
    sys.exit(0 if bug else 1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1")
    else:
        main()
