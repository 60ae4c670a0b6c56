"""Held-out evaluation loss against RULER-style score per member (the study's point that loss does not predict
retrieval): the runs' held-out losses from the grid (measured on the checkpoints of a grid trained before the
trainer recorded them), RULER-style after cpt (``loss_vs_retrieval``)."""

import sys

from _grid import Experiment, main

EXPERIMENT = Experiment(__doc__, ("ruler",), {"ruler_runs": ["cpt"]}, shows=("Held-out evaluation loss", "RULER-style"))

if __name__ == "__main__":
    sys.exit(main(EXPERIMENT))
