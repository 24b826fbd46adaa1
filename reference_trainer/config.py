"""The trainer's whole configuration: one dataclass, read from a TOML file plus overrides.

The configuration is saved inside every checkpoint. Fields that shape the training trajectory
(model, data, optimizer, schedule, seed) must match on resume; ``RESUMABLE_CHANGES`` lists the
fields that may differ between the run that saved and the run that resumes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ckpt_chaos.probe.layout import CHECKSUMS


class ConfigError(ValueError):
    """A configuration that cannot run. The message names the field and says how to fix it."""


@dataclass
class TrainConfig:
    # model: a small GPT-style decoder
    vocab_size: int = 128
    seq_len: int = 32
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    dropout: float = 0.1
    # data: a deterministic synthetic token stream
    dataset_size: int = 384  # samples per epoch
    global_batch: int = 16  # sequences per optimizer step, whole job; independent of world size
    grad_accum: int = 2  # micro-batches per optimizer step on each rank
    seed: int = 1234
    # optimization
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 4
    max_steps: int = 40  # also the horizon of the cosine schedule
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    bf16: bool = False  # bf16 autocast for forward/backward
    # checkpointing
    ckpt_dir: str = ""  # default: <run_dir>/checkpoints
    ckpt_every_steps: int = 10  # 0: off
    ckpt_every_seconds: float = 0.0  # 0: off; wall-clock cadence, agreed by all ranks
    async_save: bool = False  # dcp.async_save; the training loop only waits for staging
    keep_last: int = 2
    keep_every: int = 0  # milestones: also keep every checkpoint whose step is a multiple
    keep_best: bool = False  # also keep the checkpoint with the lowest loss
    verify_checksums: bool = True  # validate the size and checksum of every file before loading
    manifest_format: int = 2  # 2: XXH3-128 checksums; 1: SHA-256, which trainers older than format 2 read
    record_digests: bool = True  # per-component state digests at every save and load
    on_save_failure: str = "continue"  # continue (warn loudly, keep training) | stop (exit non-zero)
    # remote tier (reference_trainer/remote.py): background upload of committed checkpoints to S3
    remote_url: str = ""  # s3://bucket/prefix; empty: no remote tier
    remote_endpoint: str = ""  # S3 endpoint URL (moto, MinIO); empty: AWS's own
    remote_timeout_s: float = 5.0  # connect/read timeout of one request; a stalled link fails this fast
    remote_keep_last: int = 2  # durable checkpoints kept on the remote tier
    upload_retries: int = 5  # attempts per checkpoint, with exponential backoff ...
    upload_backoff_s: float = 0.5  # ... starting at this
    upload_drain_s: float = 60.0  # at the end of training, how long the last upload may take
    # run
    run_dir: str = "runs/default"
    digest_every: int = 0  # full model+optimizer digest in the trajectory every N steps (and last)
    stop_after_microbatches: int = 0  # save and exit cleanly after N micro-batches in total
    threads: int = 1  # torch intra-op threads per rank: the kernels' reduction order, so the bits, depend on it
    device: str = "auto"  # auto | cpu | cuda
    collective_timeout_s: float = 60.0
    step_delay_s: float = 0.0  # simulated compute after each step (no effect on numerics): outlast a timeout
    preempt_grace_s: float = 30.0  # SIGTERM -> SIGKILL budget the emergency save must fit in

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.ckpt_dir) if self.ckpt_dir else Path(self.run_dir) / "checkpoints"

    def micro_batch(self, world_size: int) -> int:
        return self.global_batch // (world_size * self.grad_accum)

    def validate(self, world_size: int | None = None) -> None:
        """Raise ConfigError for a configuration that cannot train; call before any process group."""
        positive = ["vocab_size", "seq_len", "d_model", "n_layers", "n_heads", "dataset_size",
                    "global_batch", "grad_accum", "max_steps", "keep_last", "threads"]
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}={getattr(self, name)} must be > 0")
        # a negative cadence or retention count would pass for "off" in some places and not in others
        # (step % -3 is never positive: every checkpoint a milestone)
        non_negative = ["ckpt_every_steps", "ckpt_every_seconds", "keep_every", "digest_every",
                        "stop_after_microbatches", "step_delay_s", "upload_backoff_s", "upload_drain_s",
                        "preempt_grace_s"]
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 0")
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout={self.dropout} must be in [0, 1)")
        if self.warmup_steps < 0 or self.warmup_steps >= self.max_steps:
            raise ConfigError(f"warmup_steps={self.warmup_steps} must be in [0, max_steps={self.max_steps})")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"device={self.device!r}: allowed values are auto, cpu, cuda")
        if self.manifest_format not in CHECKSUMS:
            raise ConfigError(f"manifest_format={self.manifest_format}: allowed values are "
                              f"{', '.join(map(str, sorted(CHECKSUMS)))}")
        if self.on_save_failure not in ("continue", "stop"):
            raise ConfigError(f"on_save_failure={self.on_save_failure!r}: allowed values are continue, stop")
        if self.remote_url and not (self.remote_url.startswith("s3://") and len(self.remote_url) > 5):
            raise ConfigError(f"remote_url={self.remote_url!r}: expected s3://bucket/prefix")
        if self.remote_url and (self.remote_keep_last < 1 or self.upload_retries < 1):
            raise ConfigError("remote_keep_last and upload_retries must be >= 1 with a remote tier")
        if self.global_batch % self.grad_accum:
            raise ConfigError(f"global_batch={self.global_batch} is not divisible by grad_accum={self.grad_accum}")
        if world_size is not None:
            per_step = world_size * self.grad_accum
            if self.global_batch % per_step:
                ok = [w for w in range(1, self.global_batch + 1) if self.global_batch % (w * self.grad_accum) == 0]
                raise ConfigError(
                    f"global_batch={self.global_batch} is not divisible by world_size={world_size} x "
                    f"grad_accum={self.grad_accum}; world sizes that fit: {ok}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def trajectory_hash(self) -> str:
        """Hash of the fields that shape the trajectory (what a checkpoint must agree with)."""
        shaping = {k: v for k, v in self.to_dict().items() if k not in RESUMABLE_CHANGES}
        return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:16]


# Fields a resumed run may change without changing the trajectory it continues.
RESUMABLE_CHANGES = frozenset({
    "ckpt_dir", "ckpt_every_steps", "ckpt_every_seconds", "async_save", "keep_last", "keep_every",
    "keep_best", "verify_checksums", "manifest_format", "record_digests", "on_save_failure", "run_dir", "digest_every",
    "stop_after_microbatches", "device", "collective_timeout_s", "preempt_grace_s",
    "step_delay_s", "remote_url", "remote_endpoint", "remote_timeout_s", "remote_keep_last", "upload_retries",
    "upload_backoff_s", "upload_drain_s",
})


def resume_mismatches(saved: dict[str, Any], current: TrainConfig) -> list[str]:
    """Fields where the checkpoint's config and this run's config disagree and must not."""
    now = current.to_dict()
    return [f"{k}: checkpoint has {saved.get(k)!r}, this run has {now[k]!r}"
            for k in now if k not in RESUMABLE_CHANGES and saved.get(k) != now[k]]


def _coerce(name: str, raw: Any, typ: type, source: str) -> Any:
    """Convert a TOML value or a command-line string to the field's type, or say what is wrong."""
    if isinstance(raw, str) and typ is not str:
        text = raw.strip()
        try:
            if typ is bool:
                if text.lower() in ("1", "true", "yes", "on"):
                    return True
                if text.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError
            return typ(text)
        except ValueError:
            raise ConfigError(f"{source}: {name}={raw!r} is not a valid {typ.__name__}") from None
    if typ is float and isinstance(raw, int) and not isinstance(raw, bool):
        return float(raw)
    if not isinstance(raw, typ) or (typ is int and isinstance(raw, bool)):
        raise ConfigError(f"{source}: {name}={raw!r} must be a {typ.__name__}, not {type(raw).__name__}")
    return raw


_TYPES = {f.name: {"int": int, "float": float, "str": str, "bool": bool}[f.type] for f in fields(TrainConfig)}


def build_config(values: dict[str, Any], source: str) -> TrainConfig:
    """A TrainConfig from a mapping (TOML table or parsed overrides); unknown keys are errors."""
    unknown = sorted(set(values) - set(_TYPES))
    if unknown:
        raise ConfigError(f"{source}: unknown key {unknown[0]!r}; allowed keys: {', '.join(sorted(_TYPES))}")
    return TrainConfig(**{k: _coerce(k, v, _TYPES[k], source) for k, v in values.items()})


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read an optional TOML file (flat keys, or under a [trainer] table), then apply overrides."""
    values: dict[str, Any] = {}
    source = "command line"
    if path:
        source = str(path)
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such config file") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from None
        values.update(data.get("trainer", data))
    cfg = build_config(values, source)
    if overrides:
        merged = {**dataclasses.asdict(cfg), **overrides}
        cfg = build_config(merged, "command line" if not path else f"{path} + command line")
    return cfg


__all__ = ["ConfigError", "TrainConfig", "RESUMABLE_CHANGES", "resume_mismatches", "load_config", "build_config"]
