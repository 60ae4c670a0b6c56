"""``load_model(path)``: our checkpoint folders and local Hugging Face model folders, as a
:class:`~headprobe.probe.base.ProbedModel`."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from headprobe.model.checkpoint import CONFIG_FILE, CheckpointError, load_checkpoint
from headprobe.probe.base import ProbedModel
from headprobe.probe.errors import ModelLoadError
from headprobe.probe.hf import HFModel
from headprobe.probe.ours import HeadprobeModel

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "float64": torch.float64,
}


def parse_dtype(name: str | None) -> torch.dtype | None:
    """``--dtype`` names to torch dtypes; ``None`` keeps the checkpoint's own (float32 for HF models)."""
    if name is None:
        return None
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


def load_model(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> ProbedModel:
    """Our checkpoint folder or a local Hugging Face model folder, as a :class:`ProbedModel`."""
    path = Path(path)
    if not path.is_dir():
        raise ModelLoadError(f"model folder {path} does not exist")
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        raise ModelLoadError(f"{config_file} is missing: {path} is neither a headprobe checkpoint nor an HF model")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        raise ModelLoadError(f"{config_file} is not valid JSON: {err}") from None
    if "model_type" in config:  # Hugging Face
        return HFModel(path, device=device, dtype=dtype or torch.float32)
    try:
        model, tokenizer = load_checkpoint(path, device=device, dtype=dtype)
    except CheckpointError as err:
        raise ModelLoadError(str(err)) from None
    return HeadprobeModel(model, tokenizer, path.name)
