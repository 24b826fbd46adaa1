"""Planted bug: the restore from the remote tier checks what it downloaded by sizes only, trusting
the object store for the bytes, so a durable checkpoint with rotten bits is restored and loaded."""
import types

from reference_trainer import checkpoint as ck, remote

shim = types.SimpleNamespace(**{k: getattr(ck, k) for k in dir(ck) if not k.startswith("__")})
shim.validate = lambda path, verify_checksums=True, name=None: ck.validate(path, False, name=name)
remote.ck = shim

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
