"""The reference trainer's declaration to ckpt-chaos (``ckpt_chaos.probe.profile``): its fields are
``TrainConfig``'s, a resume refuses a change of any but ``RESUMABLE_CHANGES``, and its retention and
manifest are those of ``reference_trainer/checkpoint.py``."""

from __future__ import annotations

import dataclasses
from typing import Any

from ckpt_chaos.probe.profile import Retention, TrainerProfile
from reference_trainer.config import RESUMABLE_CHANGES, ConfigError, TrainConfig


def _validate(table: dict[str, Any], world_size: int) -> None:
    try:
        TrainConfig(**table).validate(world_size)
    except TypeError as e:  # an unknown or missing field
        raise ConfigError(str(e)) from None


def _retention(cfg: dict[str, Any]) -> Retention:
    d = TrainConfig()
    return Retention(int(cfg.get("keep_last", d.keep_last)), int(cfg.get("keep_every", d.keep_every) or 0),
                     bool(cfg.get("keep_best", d.keep_best)))


PROFILE = TrainerProfile(
    fields={f.name: f.name not in RESUMABLE_CHANGES for f in dataclasses.fields(TrainConfig)},
    defaults=TrainConfig().to_dict(),
    validate=_validate,
    retention=_retention,
    reserved={"run_dir": "set by the harness"},
    manifest=True,
    # per-rank streams cannot be mapped onto another number of ranks: after a world-size change every rank
    # reseeds from (seed, step, rank) (state.restore_rank_rng; docs/trainer.md#world-size-change)
    resize_rng="reseed",
)
