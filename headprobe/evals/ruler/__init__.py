"""RULER-style long-context evaluation: the 13 tasks, generated offline and fitted to any tokenizer,
scored exactly as RULER scores them (see docs/evaluation.md).

===========  =======================================================================================
tasks        the task table (RULER's configurations) and ``resolve_tasks``
templates    RULER's templates, answer prefixes and model wrappers, character for character
generate     ``RulerGenerator``: samples fitted to a tokenizer and a length
qa           SQuAD v2 / HotpotQA loaders and the built-in generated QA set
samples      reading sample files; telling QA files apart
scoring      RULER's post-processing and ``string_match_all`` / ``string_match_part`` (``Scorer``)
predictions  the resumable prediction files of an evaluation
tables       ``ruler_samples`` and the derived ``ruler_scores``
evaluate     ``evaluate`` / ``evaluate_many``: ``headprobe ruler eval``
===========  =======================================================================================
"""

from headprobe.evals.ruler.generate import RulerError, RulerGenerator
from headprobe.evals.ruler.scoring import Scorer, postprocess, string_match_all, string_match_part
from headprobe.evals.ruler.tasks import TASKS, Task, resolve_tasks

__all__ = [
    "TASKS",
    "RulerError",
    "RulerGenerator",
    "Scorer",
    "Task",
    "postprocess",
    "resolve_tasks",
    "string_match_all",
    "string_match_part",
]
