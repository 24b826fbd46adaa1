"""A trainer module for the launcher tests: what ``python -m tests.launch_exit OUT`` gives each rank,
and what its exit does. Each rank writes ``OUT/script{rank}.json`` with its ``__name__``,
``sys.argv``, the first entry of its import path and a draw of NumPy's global stream (never seeded
here), starts a thread that is not a daemon and registers an ``atexit`` function: both write a file
after ``main`` returned, as an interpreter's exit lets them."""

import atexit
import json
import os
import sys
import threading
import time

import numpy


def main() -> None:
    out, rank = sys.argv[1], int(os.environ["RANK"])
    with open(f"{out}/script{rank}.json", "w") as fh:
        json.dump({"name": __name__, "argv": sys.argv, "path0": sys.path[0],
                   "draw": float(numpy.random.random())}, fh)

    def late() -> None:
        time.sleep(0.5)
        open(f"{out}/thread{rank}", "w").close()

    threading.Thread(target=late).start()
    atexit.register(lambda: open(f"{out}/atexit{rank}", "w").close())


if __name__ == "__main__":
    main()
