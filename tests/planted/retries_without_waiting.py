"""Planted bug: the uploader retries a failed upload at once, without the backoff it reports (the
sleep was lost), so a store that is down is hammered with requests. This module is both the
trainer and, through ``UPLOADER_MODULE``, its uploader process."""
import time
import types

from reference_trainer import remote

remote.time = types.SimpleNamespace(**{n: getattr(time, n) for n in dir(time) if not n.startswith("_")})
remote.time.sleep = lambda seconds: None
remote.UPLOADER_MODULE = "tests.planted.retries_without_waiting"

if __name__ == "__main__":
    from tests.planted import run_trainer_or_uploader

    run_trainer_or_uploader()
