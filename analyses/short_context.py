"""Short-context multiple choice (acc, acc_norm) per member (the study's Table 3): the tasks of the recipe's
``shortctx_tasks`` (task=file, in their original formats), else the built-in set, labelled ``builtin``
(``headprobe figures`` draws ``short_context``)."""

import sys

from _grid import Experiment, main

EXPERIMENT = Experiment(__doc__, ("shortctx",), shows=("Short-context",))

if __name__ == "__main__":
    sys.exit(main(EXPERIMENT))
