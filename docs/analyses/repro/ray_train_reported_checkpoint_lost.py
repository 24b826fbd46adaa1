"""Ray Train 2.60 (Train V2): a checkpoint every rank has passed to ray.train.report, whole in the
storage folder, is not the one a restart resumes from when a worker dies within the controller's
poll interval (2 s) after the report. Plain Ray, no ckpt-chaos.

Two workers report a checkpoint at step 4 and at step 8 (rank 0 writes it, as Ray's guide shows).
On the first attempt rank 1 SIGKILLs itself right after its report of step 8 returned (after
--wait seconds). FailureConfig(max_failures=1) restarts the worker group; the restarted rank 0
prints what ray.train.get_checkpoint() hands it. The docs: a restart resumes "from the latest
available checkpoint reported to Ray Train ... the last checkpoint passed to train.report()".

    python docs/analyses/repro/ray_train_reported_checkpoint_lost.py            # the bug
    python docs/analyses/repro/ray_train_reported_checkpoint_lost.py --wait 5   # past a poll: fine
"""

import argparse
import json
import os
import signal
import tempfile
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # no token file in the home folder
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray  # noqa: E402
import ray.train  # noqa: E402
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig  # noqa: E402
from ray.train.torch import TorchTrainer  # noqa: E402


def loop(cfg):
    rank = ray.train.get_context().get_world_rank()
    got = ray.train.get_checkpoint()
    first = not os.path.exists(cfg["marker"])
    if rank == 0:
        print(f"ATTEMPT {'1' if first else '2'}: rank 0 get_checkpoint() -> {got.path if got else None}", flush=True)
    if not first:
        return
    for step in (4, 8):
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = None
            if rank == 0:
                with open(os.path.join(tmp, "state.json"), "w") as f:
                    json.dump({"step": step}, f)
                ckpt = Checkpoint.from_directory(tmp)
            ray.train.report({"step": step}, checkpoint=ckpt, checkpoint_dir_name=f"checkpoint_{step:06d}")
    if rank == 1:
        time.sleep(cfg["wait"])
        open(cfg["marker"], "w").close()
        print(f"rank 1: both reports returned; SIGKILL myself {cfg['wait']} s later", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # rank 0 trains on; the group fails when rank 1 dies


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--wait", type=float, default=0.0, help="seconds between rank 1's last report and its death")
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="ray-repro-", dir="/tmp")
    ray.init(num_cpus=2, _temp_dir=os.path.join(root, "ray"), include_dashboard=False)
    trainer = TorchTrainer(loop, train_loop_config={"marker": os.path.join(root, "killed"), "wait": args.wait},
                           scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                           run_config=RunConfig(name="run", storage_path=os.path.join(root, "storage"),
                                                failure_config=FailureConfig(max_failures=1)))
    trainer.fit()
    run = os.path.join(root, "storage", "run")
    print("storage:", {d: os.listdir(os.path.join(run, d)) for d in sorted(os.listdir(run))
                       if os.path.isdir(os.path.join(run, d))})
    with open(os.path.join(run, "checkpoint_manager_snapshot.json")) as f:
        print("snapshot's latest:", (json.load(f).get("latest_checkpoint_result") or {}).get("checkpoint_dir_name"))
    ray.shutdown()


if __name__ == "__main__":
    main()
