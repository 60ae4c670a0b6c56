"""RULER-style score per member x task x length, after cpt and after sft (the study's Table 2 and its
per-length figure): ``headprobe figures`` draws ``ruler_table`` and ``ruler_by_length`` from it."""

import sys

from _grid import Experiment, main

EXPERIMENT = Experiment(__doc__, ("ruler",), {"ruler_runs": ["cpt", "sft"]}, shows=("RULER-style",))

if __name__ == "__main__":
    sys.exit(main(EXPERIMENT))
