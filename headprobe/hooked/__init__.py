"""Models as the analyses see them: one :class:`HookedModel` interface over our checkpoints and local
Hugging Face models.

========  ===========================================================================================
base      ``HookedModel``: forward with hooks (``AttentionHook``, ``ResidualHook``, ``DecodeHook``), greedy
          decoding (one prompt, or a left-padded batch)
ours      ``HeadprobeModel``: our :class:`~headprobe.model.transformer.Transformer`
hf        ``HFModel``: a Hugging Face causal LM, its attention routed through the seam per call
load      ``load_model(path)``, ``check_model`` (what a model path is, before any work), ``model_files`` (where
          its tokenizer and config lie), ``model_tokenizer`` (a model folder's own tokenizer), ``model_name`` (a
          checkpoint's one name), ``parse_dtype``,
          ``trained_positions`` / ``check_trained_lengths`` (from config.json)
gguf      GGUF files, converted once into a cached Hugging Face folder (checked, and converted again when damaged)
errors    ``ModelLoadError``
ablation  ``ablated(seam, layers, heads, mode)``: what a set of heads writes, removed at the seam; ``Head``
stops     where an answer ends: every end-of-text or end-of-turn id a model's files declare
========  ===========================================================================================
"""

from headprobe.hooked.base import AttentionHook, DecodeHook, HookedModel, ResidualHook
from headprobe.hooked.errors import ModelLoadError
from headprobe.hooked.hf import HFModel
from headprobe.hooked.load import (
    DTYPES,
    BeyondTrainedError,
    check_model,
    check_trained_lengths,
    load_model,
    model_files,
    model_name,
    model_tokenizer,
    parse_dtype,
    trained_positions,
)
from headprobe.hooked.ours import HeadprobeModel

__all__ = [
    "DTYPES",
    "AttentionHook",
    "BeyondTrainedError",
    "DecodeHook",
    "HFModel",
    "HeadprobeModel",
    "HookedModel",
    "ModelLoadError",
    "ResidualHook",
    "check_model",
    "check_trained_lengths",
    "load_model",
    "model_files",
    "model_name",
    "model_tokenizer",
    "parse_dtype",
    "trained_positions",
]
