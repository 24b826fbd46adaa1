"""Mutation testing: the mutation score of the reference trainer's checkpoint path under the scenario
suite (`make mutation`), or of an example trainer's own code under that example's scenarios
(``--example NAME``). ``python -m ckpt_chaos.mutation --help`` lists the options; docs/mutation.md
says how to run and read it.

cosmic-ray makes the mutants (``cosmic-ray init``) and applies each to a file on disk, then runs a
test command (``cosmic-ray exec``); this package is the layer around it:

1. The oracle stays pristine. The mutants are applied to a copy of the repository's tracked files
   (``WORK/tree``), and the scenarios run with that copy as their current directory under
   ``PYTHONSAFEPATH=1``: the harness (its checks, ``ckpt_chaos.probe.layout``'s validation) imports
   the unmutated ckpt-chaos of this checkout, while the trainer's ranks import the copy, which
   ``worker_pythonpath`` puts first on their path. A mutant's scenarios may run side by side
   (``--jobs``) or as Slurm jobs (``--executor slurm``): the harness's workers import the harness
   their parent runs (``harness_pythonpath``), the ranks under them the copy.
2. Golden runs come from the unmutated trainer: ``$CKPT_CHAOS_GOLDEN_TREE`` keys them by this
   repository's code (``config.golden_tree``), and a mutant never makes one.
3. A mutant runs only the baseline's scenarios whose coverage reaches its line, cheapest first,
   and stops at the first that fails (``ckpt-chaos run -x``); a scenario that killed the same change
   of the same file in the last results of these operators runs first (``results.killers``), so a
   kill is confirmed in one scenario instead of found again down the list. The coverage comes from
   one ``ckpt-chaos run --coverage`` of the pristine tree (``--coverage-from``, or made by the
   driver), which is also the baseline (``scope``): a scenario that does not pass there is never
   used against a mutant. A mutant on a line no scenario reaches survives without a run ("not
   reached").
4. A mutant is killed only by the harness's verdict (``verdict``): a scenario that fails, a hang
   included (each scenario's ``expect.deadline_s`` fails it). The per-mutant timeout (the selected
   scenarios' deadlines, plus ``SLACK_S``) only catches a harness that stops answering; such a
   mutant is "timed out" and counts as not killed. cosmic-ray's own ``timeout`` lies beyond it.
5. Which operators: cosmic-ray's own (``--operators core``, the default), the checkpoint operators
   of ``ckpt_chaos.mutation.operators`` (``--operators checkpoint``: a dropped fsync, a rename
   published before its write, a state entry dropped, ...), or both. cosmic-ray makes every
   registered operator's mutants; those of the other operators are left out like mutants out of
   scope. A run of other operators keeps its own results (``mutation-<operators>.json``) and work
   folder.
6. A mutant's verdict (killed or survived) is cached (``cache``) under the hash of its mutated file,
   its operator and everything else that could change the verdict (the other trainer and harness
   sources, the scenarios, the coverage baseline): a later run takes it from the cache instead of
   running it again, until one of those changes (``--no-cache`` runs every mutant).
7. Mutants marked equivalent by hand in ``benchmarks/mutation-equivalent.toml``, and those that change
   only a function's annotation in a module that never evaluates it (``from __future__ import
   annotations``), are left out of the score and listed with their reason (``equivalence``).
8. ``--example NAME`` scores ``examples/NAME/train.py`` instead, the whole file (an example writes its
   checkpoint code inline in its training loop, so no list of functions could say honestly which
   lines are its checkpoint path), against every scenario of ``examples/NAME/scenarios`` whatever
   its suites: the baseline is ``ckpt-chaos run --coverage --suite full --scenarios`` of that folder
   and each mutant runs its scenarios from there. Their ``[command]`` argv names the script relative
   to the current directory, so the mutant in the copy is what runs, and ``$CKPT_CHAOS_GOLDEN_TREE``
   keys their golden runs by the pristine script. Its results and work folder are
   ``mutation-<operators>-<NAME>``, and the cache's fingerprint covers the example's folder.

Writes ``benchmarks/results/mutation.json`` and (``benchmarks/report.py --tables``) ``mutation.md``
(``results``): the score (killed / (total - equivalent)) per file, each killed mutant's scenario and
failing checks, each surviving mutant's diff.

    python -m ckpt_chaos.mutation --files reference_trainer/checkpoint.py --limit 40

The package works on the checkout it is imported from (``ROOT``): it copies that checkout's tracked
files, reads its scenarios and writes its ``benchmarks/results``. Nothing here imports cosmic-ray at
import time but ``operators``, which cosmic-ray itself loads (the ``mutation`` extra).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
WORK = ROOT / "build" / "mutation"
OUTCOME = "MUTATION-OUTCOME "  # the test command's last stdout line, kept by cosmic-ray as its output
# Why a work item is not counted, written as its (skipped) result's output.
OUT_OF_SCOPE, NOT_SAMPLED, EQUIVALENT_MARK, NOT_REACHED = ("out of scope", "not sampled", "equivalent: ",
                                                          "not reached")
SLACK_S = 60  # per scenario, over its deadline: start-up, golden look-up, report


class MutationError(Exception):
    """Bad input or a missing tool; the message names the file, key or extra and the fix."""


def tool(name: str) -> str:
    """A console script of this interpreter's environment (``ckpt-chaos``, ``cosmic-ray``)."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name) or name
