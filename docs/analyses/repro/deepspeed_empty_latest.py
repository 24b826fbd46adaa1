"""DeepSpeed 0.19.8: a crash between save_checkpoint's ``open(latest, "w")`` and its ``write`` leaves
``latest`` empty, and every ``load_checkpoint(dir)`` after it stops on a bare ``assert`` although
the checkpoints beside it are whole (deepspeed/runtime/engine.py:4961-4962 rewrites the pointer in
place; :4432 reads the empty tag; state_dict_factory.py:168 asserts).

One process (ZeRO stage 2, gloo, the CPU accelerator); plain Python, nothing else:

    DS_ACCELERATOR=cpu python deepspeed_empty_latest.py

The first launch saves global_step1, then dies inside the save of global_step2 right after
DeepSpeed's own open() of ``latest`` (os._exit where the kernel would SIGKILL it). The second
launch calls load_checkpoint(dir) as a training script does on start; a third names the tag
global_step2 itself, and loads it.
"""

import builtins
import os
import socket
import subprocess
import sys
import tempfile

CONFIG = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10**9, "zero_optimization": {"stage": 2},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}}}


def child(ckpt: str, crash: bool, tag: str | None) -> None:
    import deepspeed
    import torch

    deepspeed.init_distributed(dist_backend="gloo")
    model = torch.nn.Linear(4, 1)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=CONFIG)
    path, _ = engine.load_checkpoint(ckpt, tag=tag)
    print(f"load_checkpoint(dir, tag={tag!r}) ->", path, flush=True)
    if tag is not None:
        return
    for step in (1, 2):
        engine.backward(engine(torch.randn(2, 4)).pow(2).mean())
        engine.step()
        if crash and step == 2:
            real_open = builtins.open

            def open_then_die(file, mode="r", *args, **kwargs):
                f = real_open(file, mode, *args, **kwargs)
                if os.path.basename(os.fspath(file)) == "latest" and "w" in mode:
                    os._exit(9)  # open() has emptied `latest`; DeepSpeed's write never runs
                return f

            builtins.open = open_then_die
        engine.save_checkpoint(ckpt, tag=f"global_step{step}")


def launch(ckpt: str, crash: bool, tag: str = "") -> subprocess.CompletedProcess:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    return subprocess.run([sys.executable, __file__, "child", ckpt, str(int(crash)), tag], env=env,
                          capture_output=True, text=True)


def main() -> None:
    ckpt = tempfile.mkdtemp(prefix="ds-empty-latest-")
    first = launch(ckpt, crash=True)
    print(f"launch 1 exited {first.returncode} inside the save of global_step2")
    for root, _, files in sorted(os.walk(ckpt)):
        for name in sorted(files):
            if name.endswith((".pt", "latest")):
                p = os.path.join(root, name)
                print(f"  {os.path.relpath(p, ckpt)}: {os.path.getsize(p)} bytes")
    print("  latest holds", repr(open(os.path.join(ckpt, "latest")).read()))
    second = launch(ckpt, crash=False)
    print(f"launch 2 (load_checkpoint(dir)) exited {second.returncode}:")
    print("  " + "\n  ".join(second.stderr.strip().splitlines()[-4:]))
    third = launch(ckpt, crash=False, tag="global_step2")
    print(f"launch 3 (load_checkpoint(dir, tag='global_step2')) exited {third.returncode}: "
          + third.stdout.strip().splitlines()[-1])
    bug = third.returncode == 0 and first.returncode != 0 and second.returncode != 0 and "AssertionError" in second.stderr
    print("BUG REPRODUCED: an empty `latest` makes every resume fail" if bug else "not reproduced")
    sys.exit(0 if bug else 1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child(sys.argv[2], sys.argv[3] == "1", sys.argv[4] or None)
    else:
        main()
