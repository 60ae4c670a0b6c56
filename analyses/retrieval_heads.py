"""Retrieval heads (Wu et al.'s score per head, and counts and fractions per layer type) before cpt, after
cpt and after frozen-attention cpt (the study's Table 4): ``retrieval_heads`` and ``retrieval_heads_table``."""

import sys

from _grid import Experiment, main

EXPERIMENT = Experiment(
    __doc__,
    ("heads",),
    {"analysis_runs": ["pt", "cpt", "cpt-frozen"], "analysis_metrics": ["retrieval"]},
    shows=("Retrieval heads",),
)

if __name__ == "__main__":
    sys.exit(main(EXPERIMENT))
