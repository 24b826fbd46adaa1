"""Planted bug: at the end of training rank 0 waits for its uploader once and never replaces one
that dies during the drain, so a kill mid-upload of the final checkpoint leaves it local only."""
from reference_trainer import remote

_close = remote.UploadQueue.close
remote.UploadQueue.close = lambda self, timeout_s, respawns=3: _close(self, timeout_s, respawns=0)

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
