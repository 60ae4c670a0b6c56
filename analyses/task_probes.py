"""Held-out task probes (needles, recall, copy at fixed distances beyond every window) on every run: the toy
scale's counterpart of RULER (``probes``)."""

import sys

from _grid import Experiment, main

EXPERIMENT = Experiment(__doc__, ("probes",), shows=("Held-out",))

if __name__ == "__main__":
    sys.exit(main(EXPERIMENT))
