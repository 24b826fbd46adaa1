"""Planted bug: the restore from the remote tier checks what it downloaded by sizes only, trusting
the object store for the bytes, so a durable checkpoint with rotten bits is restored and loaded.
Local checkpoints are hashed whole before the load (which verifies nothing itself), so only what the
restore hands over goes unchecked."""
import types

from ckpt_chaos.probe import layout
from reference_trainer import checkpoint as ck, remote

shim = types.SimpleNamespace(**{k: getattr(ck, k) for k in dir(ck) if not k.startswith("__")})
shim.validate = lambda path, verify_checksums=True, name=None: ck.validate(path, False, name=name)
remote.ck = shim
ck.choose_resume = lambda root, verify_checksums=True, read_later=None: layout.choose_resume(root, verify_checksums)
ck.CheckpointManager.reader = lambda self, choice: ck.VerifyingReader(choice.path, None, self.rank, self.world_size)

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
