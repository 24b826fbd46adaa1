"""Planted bug: retention keeps one checkpoint fewer than ``keep_last`` asks ("the one just committed
is kept anyway", so it counts K-1 older ones). The newest survives every crash, so nothing that
bounds the count from above or checks the newest notices; only the last K promised, counted exactly,
shows one missing.
"""
import dataclasses

from reference_trainer import checkpoint as ck

_apply_retention = ck.CheckpointManager.apply_retention


def _apply_retention_one_short(self):
    cfg = self.cfg
    self.cfg = dataclasses.replace(cfg, keep_last=max(1, cfg.keep_last - 1))
    try:
        _apply_retention(self)
    finally:
        self.cfg = cfg


ck.CheckpointManager.apply_retention = _apply_retention_one_short

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
