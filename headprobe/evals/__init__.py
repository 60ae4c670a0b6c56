"""Evaluation: RULER-style long-context tasks and short-context multiple choice.

Every prompt starts by the one prompt-start rule, :attr:`headprobe.hooked.HookedModel.prompt_start`
(as the model's training inputs began: nothing for our checkpoints, the tokenizer's default prefix for
Hugging Face models), applied by :meth:`~headprobe.hooked.HookedModel.encode_prompt`; results are tidy
tables written through :mod:`headprobe.results`.

========  ==========================================================================================
ruler     the 13 RULER tasks generated offline and fitted to any tokenizer, scored as RULER scores
shortctx  multiple-choice accuracy by log-likelihood (lm-eval's acc / acc_norm), the lm-eval adapter
========  ==========================================================================================
"""
