"""RULER-style long-context evaluation: the 13 tasks, generated offline and fitted to any tokenizer,
scored exactly as RULER scores them (see docs/evaluation.md).

===========  =======================================================================================
tasks        the task table (RULER's configurations), its groups (``all``) and ``resolve_tasks``
templates    RULER's templates, answer prefixes and model wrappers, character for character
settings     ``RulerSettings``: what decides an evaluation's numbers (no torch: the command line's options)
resolve      ``resolve_run``: the settings made concrete once per run (``RulerRun``; no torch)
builders     ``TaskBuilders``: the five task families' prompts as size-free drafts; the essay haystack
fitting      a draft's size fitted to a token budget: RULER's size search or the tightest fit; ``TooShort``
generate     ``RulerGenerator``: samples fitted to a tokenizer and a length; tasks too long for one skipped
qa           SQuAD v2 / HotpotQA loaders and the built-in generated QA set
samples      reading sample files; telling QA files apart; the tasks the samples say were skipped
scoring      RULER's post-processing and ``string_match_all`` / ``string_match_part`` (``Scorer``)
predictions  the resumable prediction files of an evaluation
tables       ``ruler_samples`` and the derived ``ruler_scores``
job          ``RulerJob``, ``evaluate`` (one checkpoint) / ``evaluate_many``: ``headprobe ruler eval``
===========  =======================================================================================
"""

from __future__ import annotations

from headprobe.core.lazy import lazy_exports

_EXPORTS = {
    "RulerError": "settings",
    "RulerSettings": "settings",
    "RulerGenerator": "generate",
    "TooShort": "fitting",
    "Scorer": "scoring",
    "postprocess": "scoring",
    "string_match_all": "scoring",
    "string_match_part": "scoring",
    "TASKS": "tasks",
    "Task": "tasks",
    "resolve_tasks": "tasks",
}
__all__ = sorted(_EXPORTS)


# lazy: the command line reads the task table and the settings without loading the generator
__getattr__ = lazy_exports(__name__, _EXPORTS)
