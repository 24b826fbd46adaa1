"""Planted bug: a save's stall is reported in milliseconds under a name that says seconds, so the
report's save overhead and goodput are off by a factor of a thousand."""
from reference_trainer import train

_log = train.Trainer.log


def _log_stall_in_ms(self, event, **fields):
    if "stall_s" in fields:
        fields["stall_s"] *= 1000
    _log(self, event, **fields)


train.Trainer.log = _log_stall_in_ms

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
