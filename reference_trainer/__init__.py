"""A reference FSDP2 trainer with complete, atomic, validated checkpoints (see README)."""

from reference_trainer.profile import PROFILE as CKPT_CHAOS_PROFILE  # what ckpt-chaos reads of it

__all__ = ["CKPT_CHAOS_PROFILE"]
