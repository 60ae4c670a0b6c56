"""Short-context multiple-choice evaluation by log-likelihood, as lm-evaluation-harness scores it.

=========  =========================================================================================
items      ``Item``; loaders for ARC, HellaSwag, WinoGrande, RACE, PIQA, OpenBookQA, CommonsenseQA; JSONL;
           a built-in set
scoring    ``loglikelihoods`` (right-padded batches), ``evaluate_items`` (acc, acc_norm)
settings   ``ShortCtxSettings``: what decides an evaluation's numbers (no torch: the command line's options)
job        ``ShortCtxJob`` / ``evaluate_many``: ``headprobe shortctx eval``, as tidy tables
lmeval     ``HeadprobeLM``: any headprobe model behind lm-evaluation-harness' ``LM`` interface
=========  =========================================================================================
"""

from __future__ import annotations

from headprobe.core.lazy import lazy_exports

_EXPORTS = {
    "LOADERS": "items",
    "HeadprobeLM": "lmeval",
    "Item": "items",
    "ShortCtxError": "items",
    "builtin_items": "items",
    "evaluate_items": "scoring",
    "load_task": "items",
    "loglikelihood": "scoring",
    "loglikelihoods": "scoring",
}
__all__ = sorted(_EXPORTS)


# lazy: the command line builds its options from the settings without torch
__getattr__ = lazy_exports(__name__, _EXPORTS)
