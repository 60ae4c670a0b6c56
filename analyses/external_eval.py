"""Hand the grid's members to an evaluator outside headprobe (lm-evaluation-harness, HELMET, RULER's own
scripts through vLLM): each chosen run exported as a Hugging Face folder (``headprobe export hf``, into
RESULTS/hf/<model>/; a current export is kept), then the command after ``--`` run on each, ``{path}`` being
the folder, ``{name}`` the run's results name and ``{out}`` RESULTS/external/<model>/ (its output kept
there as log.txt). The table ``study_exports`` lists the runs, their folders and the commands' exit codes.

    python analyses/external_eval.py runs/grid --out results/grid --runs cpt,sft -- \\
        lm_eval --model hf --model_args pretrained={path},trust_remote_code=True --tasks arc_easy \\
        --output_path {out}
"""

import sys

from _grid import Experiment, main

EXPERIMENT = Experiment(__doc__, (), hand_off=True)

if __name__ == "__main__":
    sys.exit(main(EXPERIMENT))
