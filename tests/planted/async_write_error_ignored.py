"""Planted bug: an asynchronous save is committed once its future is done, whether or not the
background write succeeded: a write that failed leaves a checkpoint with a torn shard and no DCP
metadata, which the commit describes as it finds it and makes the newest."""
import time

from reference_trainer import checkpoint as ck


def _finish_async_trusting(self):
    pending, self.pending = self.pending, None
    try:
        pending.future.result()
    except BaseException:  # the bug: the write "finished"
        pass
    if self.rank == 0:
        self._commit(pending.name, pending.writer.files, pending.progress, pending.loss, pending.digests)
    self.last_saved = (pending.progress["step"], pending.progress["micro"])
    self.log("saved", name=pending.name, reason="async", asynchronous=True, stall_s=pending.stall_s,
             total_s=time.perf_counter() - pending.started, digests=pending.digests, phases={})


ck.CheckpointManager._finish_async = _finish_async_trusting

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
