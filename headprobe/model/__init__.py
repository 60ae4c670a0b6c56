"""The head-shape model family: configuration, presets, the Transformer, attention, checkpoints, costs.

This package imports nothing of headprobe but the foundation, ``headprobe.core`` (errors, typed choices,
atomic files, paths); the trainer, the hooked models (``headprobe.hooked``) and the analyses build on it.

==============  ===================================================================================
config          ``AttentionConfig``, ``ModelConfig``, ``LayerType``, ``LayerInfo`` (plain dataclasses)
presets         ``preset(name)``, ``list_presets()``: the study's grids and the toy grid
transformer     ``Transformer``: the decoder-only LM with TransformerLens hook points
seam            ``AttentionCall``, ``Seam``: the one place every attention call passes by
attention       exact causal / sliding-window attention backends (reference, sdpa, flex, flash, triton)
kernels         our Triton kernels (attention for any head shape) and where they run
masks           the one window convention (``CausalMask``) and left padding (``KeyPadding``)
rope            partial rotary position embedding
kv_cache        the decoding cache (sliding layers keep ``window - 1`` keys)
tokenizer       the byte tokenizer and local ``tokenizer.json`` files
eval_loss       a model's loss on fixed rows, pooled and per split (the held-out evaluation loss)
checkpoint      checkpoint folders (``save_checkpoint``, ``load_checkpoint``)
step_checkpoint a training step folder's model, read from its DCP shards (``load_step_weights``)
budget          the only parameter / FLOP / KV-cache / memory formulas
answers         how a model answers prompts: exact greedy answers and their teacher-forced loss
decoding        the one greedy decoding loop (``Transformer.generate`` and the hooked models' ``decode``)
==============  ===================================================================================
"""

from __future__ import annotations

from headprobe.core.lazy import lazy_exports

_EXPORTS = {
    "AttentionConfig": "config",
    "ConfigError": "config",
    "LayerInfo": "config",
    "LayerType": "config",
    "ModelConfig": "config",
    "list_presets": "presets",
    "list_scales": "presets",
    "preset": "presets",
    "Transformer": "transformer",
    "AttentionCall": "seam",
    "Seam": "seam",
    "KVCache": "kv_cache",
    "ByteTokenizer": "tokenizer",
    "HFTokenizer": "tokenizer",
    "load_tokenizer": "tokenizer",
    "load_checkpoint": "checkpoint",
    "save_checkpoint": "checkpoint",
}
__all__ = sorted(_EXPORTS)


# lazy: `headprobe plan` should not pay for importing the Transformer
__getattr__ = lazy_exports(__name__, _EXPORTS)
