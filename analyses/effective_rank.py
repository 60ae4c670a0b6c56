"""Residual-stream effective rank per layer per member, after pt, full cpt and frozen cpt
(``effective_rank``)."""

import sys

from _grid import Experiment, main

EXPERIMENT = Experiment(
    __doc__, ("heads",), {"analysis_runs": ["pt", "cpt", "cpt-frozen"], "analysis_metrics": ["erank"]}
)

if __name__ == "__main__":
    sys.exit(main(EXPERIMENT))
