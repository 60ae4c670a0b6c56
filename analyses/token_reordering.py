"""Token reordering per head (probability-weighted Kendall between attention and recency), before and after
cpt and with attention frozen (``token_reordering``)."""

import sys

from _grid import Experiment, main

EXPERIMENT = Experiment(
    __doc__, ("heads",), {"analysis_runs": ["pt", "cpt", "cpt-frozen"], "analysis_metrics": ["reordering"]}
)

if __name__ == "__main__":
    sys.exit(main(EXPERIMENT))
