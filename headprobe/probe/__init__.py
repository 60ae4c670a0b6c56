"""Models as the analyses see them: one :class:`ProbedModel` interface over our checkpoints and local
Hugging Face models.

======  ===========================================================================================
base    ``ProbedModel``: forward with probes, greedy decoding (one prompt, or a left-padded batch)
ours    ``HeadprobeModel``: our :class:`~headprobe.model.transformer.Transformer`
hf      ``HFModel``: a Hugging Face causal LM, its attention routed through the seam per call
load    ``load_model(path)``, ``parse_dtype``, ``trained_positions`` / ``check_trained_lengths`` (from config.json)
errors  ``ModelLoadError``
======  ===========================================================================================
"""

from headprobe.probe.base import DecodeProbe, ProbedModel, ResidualProbe
from headprobe.probe.errors import ModelLoadError
from headprobe.probe.hf import HFModel
from headprobe.probe.load import (
    DTYPES,
    BeyondTrainedError,
    check_trained_lengths,
    load_model,
    parse_dtype,
    trained_positions,
)
from headprobe.probe.ours import HeadprobeModel

__all__ = [
    "DTYPES",
    "BeyondTrainedError",
    "DecodeProbe",
    "HFModel",
    "HeadprobeModel",
    "ModelLoadError",
    "ProbedModel",
    "ResidualProbe",
    "check_trained_lengths",
    "load_model",
    "parse_dtype",
    "trained_positions",
]
