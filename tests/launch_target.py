"""A tiny job for the launcher tests: each rank records what it was given, then does as told.

``python -m tests.launch_target OUT ACTION``: ``ok`` exits 0; ``fail`` makes rank 1 exit 3, once rank 0
is up, while rank 0 sleeps; ``term`` waits for SIGTERM and exits 0 on it; ``collective`` runs a gloo all_reduce
through the launcher's store.
"""

import json
import os
import signal
import sys
import time

SEEN = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
        "OMP_NUM_THREADS", "CKPT_CHAOS_ATTEMPT")


def main() -> int:
    out, action = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    signal.signal(signal.SIGTERM, lambda *_: (open(f"{out}/term{rank}", "w").close(), os._exit(0)))
    with open(f"{out}/rank{rank}.json.tmp", "w") as fh:
        json.dump({"env": {k: os.environ.get(k) for k in SEEN}, "pid": os.getpid(), "argv": sys.argv[1:],
                   "sid_is_pid": os.getsid(0) == os.getpid()}, fh)
    os.replace(f"{out}/rank{rank}.json.tmp", f"{out}/rank{rank}.json")  # whole when the test sees it
    if action == "fail":
        if rank == 1:
            # fail only once rank 0 is up: on a busy machine torchrun may start it after rank 1 is done,
            # and the test reads the pid of the peer it closed
            end = time.monotonic() + 60
            while not os.path.exists(f"{out}/rank0.json") and time.monotonic() < end:
                time.sleep(0.02)
            return 3
        time.sleep(60)
    if action == "term":
        time.sleep(60)
        return 4
    if action == "collective":
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        t = torch.tensor([rank + 1.0])
        dist.all_reduce(t)
        with open(f"{out}/sum{rank}", "w") as fh:
            fh.write(str(t.item()))
        dist.barrier()
        os._exit(0)  # gloo can abort a process that finalizes after collectives (pytorch/pytorch#190489)
    return 0


if __name__ == "__main__":
    sys.exit(main())
