"""Final training loss against RULER-style score per member (the study's point that loss does not predict
retrieval): the runs' losses from the grid, RULER-style after cpt (``loss_vs_retrieval``)."""

import sys

from _grid import Experiment, main

EXPERIMENT = Experiment(__doc__, ("ruler",), {"ruler_runs": ["cpt"]}, shows=("Final training loss", "RULER-style"))

if __name__ == "__main__":
    sys.exit(main(EXPERIMENT))
