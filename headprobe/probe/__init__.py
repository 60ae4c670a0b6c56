"""Models as the analyses see them: one :class:`ProbedModel` interface over our checkpoints and local
Hugging Face models.

======  ===========================================================================================
base    ``ProbedModel``: forward with probes, greedy decoding (one prompt, or a left-padded batch)
ours    ``HeadprobeModel``: our :class:`~headprobe.model.transformer.Transformer`
hf      ``HFModel``: a Hugging Face causal LM, its attention routed through the seam per call
load    ``load_model(path)``, ``parse_dtype``
errors  ``ModelLoadError``
======  ===========================================================================================
"""

from headprobe.probe.base import DecodeProbe, ProbedModel, ResidualProbe
from headprobe.probe.errors import ModelLoadError
from headprobe.probe.hf import HFModel
from headprobe.probe.load import DTYPES, load_model, parse_dtype
from headprobe.probe.ours import HeadprobeModel

__all__ = [
    "DTYPES",
    "DecodeProbe",
    "HFModel",
    "HeadprobeModel",
    "ModelLoadError",
    "ProbedModel",
    "ResidualProbe",
    "load_model",
    "parse_dtype",
]
