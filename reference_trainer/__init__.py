"""A reference FSDP2 trainer with complete, atomic, validated checkpoints (see README)."""
