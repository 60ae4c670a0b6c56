"""Short-context multiple-choice evaluation by log-likelihood, as lm-evaluation-harness scores it.

=========  =========================================================================================
items      ``Item``; loaders for ARC, HellaSwag, WinoGrande, RACE, PIQA, OpenBookQA, CommonsenseQA; JSONL;
           a built-in set
scoring    ``loglikelihoods`` (right-padded batches), ``evaluate_items`` (acc, acc_norm)
evaluate   ``evaluate`` / ``evaluate_many``: ``headprobe shortctx eval``, as tidy tables
lmeval     ``HeadprobeLM``: any headprobe model behind lm-evaluation-harness' ``LM`` interface
=========  =========================================================================================
"""

from headprobe.evals.shortctx.items import LOADERS, Item, ShortCtxError, builtin_items, load_task
from headprobe.evals.shortctx.lmeval import HeadprobeLM
from headprobe.evals.shortctx.scoring import evaluate_items, loglikelihood, loglikelihoods

__all__ = [
    "LOADERS",
    "HeadprobeLM",
    "Item",
    "ShortCtxError",
    "builtin_items",
    "evaluate_items",
    "load_task",
    "loglikelihood",
    "loglikelihoods",
]
