"""The frozen-projection experiment: RULER-style score before cpt, after cpt with attention trained and
after cpt with attention frozen (same pt checkpoint), per member (``frozen_cpt``)."""

import sys

from _grid import Experiment, main

EXPERIMENT = Experiment(__doc__, ("ruler",), {"ruler_runs": ["pt", "cpt", "cpt-frozen"]}, shows=("RULER-style",))

if __name__ == "__main__":
    sys.exit(main(EXPERIMENT))
