"""Acceptance of following renames: a kill aimed at half of a file that safetensors writes under a
temporary name lands at half of that file. The trainer (tests/safetensors_trainer.py) saves with
safetensors' own writer, which writes ``.tmpXXXXXX`` beside ``model.safetensors`` and renames it;
it writes the optimizer's file, twice as large, the same way just before. The scenario aims at the
final name, as a user does, under faultfs (root, /dev/fuse); skipped with the reason without them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ckpt_chaos.check.history import FaultFired, of, read_history
from ckpt_chaos.env.storage import missing
from ckpt_chaos.run.runner import run_scenario
from ckpt_chaos.scenario import load
from tests.helpers import REPO

NO_FAULTFS = missing("host", faultfs=True)
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(NO_FAULTFS is not None, reason=f"cannot mount faultfs here: {NO_FAULTFS}")]
pytest.importorskip("safetensors", reason="safetensors is not installed (pip install 'ckpt-chaos[examples]')")

TRAINER = REPO / "tests" / "safetensors_trainer.py"
MODEL = "checkpoints/step_8/model.safetensors"
SCENARIO = f"""
description = "rank 0 is SIGKILLed half-way through step 8's model.safetensors, written as .tmpXXXXXX"
world_size = 1
[command]
argv = ["{{python}}", "{TRAINER}", "--ckpt-dir", "{{ckpt_dir}}", "--steps", "8", "--save-every", "4"]
launcher = "self"
key = ["{TRAINER}"]
complete = "step_*"
save_every = 4
requires = ["safetensors"]
[[faults]]
kind = "kill"
target = "rank:0"
when = {{ point = "faultfs.write", rank = 0, path = "{MODEL}", min_fraction = 0.5 }}
"""


@pytest.mark.nightly  # make test: the idiom cell's kill mid-write, the planted shard-progress tests
def test_a_kill_aimed_at_half_of_a_file_safetensors_writes_under_a_temporary_name_lands_at_half_of_it(tmp_path):
    path = tmp_path / "safetensors-kill-mid-model.toml"
    path.write_text(SCENARIO)
    r = run_scenario(load(path), tmp_path / "out", tmp_path / "golden")
    run_dir = Path(r.run_dir)
    checks = {c["name"]: (c["verdict"], c["detail"]) for c in r.checks}
    assert checks["fault_0_fired"][0] == "pass", (r.reason, checks)

    planned = json.loads((run_dir / "golden" / "planned.json").read_text())
    size = planned["sizes"][MODEL]  # the model's file in the golden run, not the optimizer's (twice as large)
    assert planned["sizes"]["checkpoints/step_8/optimizer.safetensors"] > size
    half = -(-size // 2)

    [fired] = of(read_history(run_dir), FaultFired)
    info = fired.at["info"]
    # it fired on the write of the temporary file that becomes model.safetensors, named as it was here
    assert re.fullmatch(r"checkpoints/step_8/\.tmp\w{6}", info["path"]), info
    assert MODEL in info["aliases"], info
    assert (info["fraction"], info["bytes"]) == (0.5, half), info

    # The killed writer's temporary file is left beside the relaunch's finished one, at its full length:
    # safetensors sizes the file (ftruncate) before it writes, so what was written is what is not zero.
    # The bound is exact, both ways: faultfs cut the FUSE request at the tenth, wrote the bytes before it
    # and held the rest until the kill, after which no byte of that request or a later one arrives. (A
    # kernel sending several requests of one write(2) at once could put at most one request more past
    # it; here the write came as one request, from the event's offset to the end.)
    torn = (run_dir / info["path"]).read_bytes()
    written = len(torn.rstrip(b"\0"))
    final = (run_dir / MODEL).read_bytes()  # the relaunch wrote step 8 again from step 4: the same bytes
    assert len(final) == size
    assert torn[:half] == final[:half], "the torn file does not begin with the model's bytes"  # that file
    assert written <= half, f"{written} bytes written, the kill was held at {half}"
