"""Planted bug: ``keep_best`` remembers the best checkpoint in memory, from the saves this process
made. After a relaunch the best checkpoint of the earlier launch is just another old one, and the
first retention of the new process deletes it.
"""
import inspect

from reference_trainer import checkpoint as ck

_commit = ck.CheckpointManager._commit


def _commit_remembering_best(self, *args, **kwargs):
    given = inspect.signature(_commit).bind(self, *args, **kwargs).arguments
    loss, name = given["loss"], given["name"]
    if loss is not None and loss < getattr(self, "best_seen", (float("inf"), None))[0]:
        self.best_seen = (loss, name)
    return _commit(self, *args, **kwargs)


def _retention_from_memory(self):
    best = getattr(self, "best_seen", (None, None))[1]
    ckpts = ck.list_checkpoints(self.root)
    keep = set(ckpts[: self.cfg.keep_last])
    if self.cfg.keep_every:
        keep |= {c for c in ckpts if ck.parse_name(c.name)[1] == 0
                 and ck.parse_name(c.name)[0] % self.cfg.keep_every == 0}
    keep |= {c for c in ckpts if self.cfg.keep_best and c.name == best}
    deleted = [c.name for c in ckpts if c not in keep]
    for c in ckpts:
        if c not in keep:
            ck.remove_tree(c)
    # reported as the trainer's own retention reports it: the one bug is what it keeps
    ck.probe.point("ckpt.retention", deleted=deleted)
    if deleted:
        self.log("retention", deleted=deleted, kept=sorted(k.name for k in keep))


ck.CheckpointManager._commit = _commit_remembering_best
ck.CheckpointManager.apply_retention = _retention_from_memory

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
