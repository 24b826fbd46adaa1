"""Planted bug: the resume takes a manifest of another format than the one this trainer writes for
an invalid checkpoint, so after an upgrade every older checkpoint is rejected and the job starts
afresh."""
from ckpt_chaos.probe import layout

_validate = layout.validate


def _own_format_only(path, verify_checksums=True, name=None, read_later=None):
    try:
        fmt = layout.read_manifest(path).get("format")
    except (OSError, ValueError):
        fmt = None
    if fmt is not None and fmt != layout.FORMAT:
        return f"manifest format {fmt} is not {layout.FORMAT}"
    return _validate(path, verify_checksums, name, read_later)


layout.validate = _own_format_only

if __name__ == "__main__":
    from reference_trainer.__main__ import run_and_exit

    run_and_exit()
