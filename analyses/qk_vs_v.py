"""Does query/key width or value width carry retrieval? RULER-style score and retrieval heads after cpt for
every member, so the asymmetric members stand beside the symmetric ones (``qk_vs_v``)."""

import sys

from _grid import Experiment, main

EXPERIMENT = Experiment(
    __doc__,
    ("ruler", "heads"),
    {"ruler_runs": ["cpt"], "analysis_runs": ["cpt"], "analysis_metrics": ["retrieval"]},
    shows=("RULER-style", "Retrieval heads"),
)

if __name__ == "__main__":
    sys.exit(main(EXPERIMENT))
