"""ckpt-chaos: fault injection and resilience tests for distributed-training checkpoint/resume."""

__version__ = "0.2.0"
