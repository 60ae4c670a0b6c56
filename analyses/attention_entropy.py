"""Attention entropy per head (nats and normalised), before and after cpt and with attention frozen
(``attention_entropy``)."""

import sys

from _grid import Experiment, main

EXPERIMENT = Experiment(
    __doc__, ("heads",), {"analysis_runs": ["pt", "cpt", "cpt-frozen"], "analysis_metrics": ["entropy"]}
)

if __name__ == "__main__":
    sys.exit(main(EXPERIMENT))
