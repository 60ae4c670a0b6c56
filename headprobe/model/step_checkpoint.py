"""A training step folder's model (:mod:`headprobe.core.steps`) read straight from its ``dcp/`` shards: the
model weights only (the optimizer state beside them is never read), with no process group, whatever number
of processes wrote them (FSDP shards are gathered by the reader)."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from headprobe.core.steps import WEIGHTS_DIR, read_step
from headprobe.model.checkpoint import CheckpointError
from headprobe.model.config import ConfigError, ModelConfig
from headprobe.model.transformer import Transformer


def step_config(folder: str | Path) -> ModelConfig:
    """The model config the step folder ``folder`` recorded (``state.json``'s ``model_config``)."""
    state = read_step(folder)
    try:
        return ModelConfig.from_dict(state["model_config"])
    except (KeyError, TypeError, ConfigError) as err:
        raise CheckpointError(f"{Path(folder)}/state.json records no usable model config ({err})") from None


def load_step_weights(
    folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> Transformer:
    """The :class:`Transformer` saved in the step folder ``folder`` (in eval mode; float32 as trained unless
    ``dtype``). Raises :class:`CheckpointError` when the shards are missing or do not fit the config."""
    folder = Path(folder)
    model = Transformer(step_config(folder))
    weights = model.state_dict()  # read in place: DCP fills these tensors
    try:
        with warnings.catch_warnings():  # one process without a process group is intended
            warnings.filterwarnings("ignore", message=".*assuming the intent is to")
            dcp.load({"model": weights}, checkpoint_id=str(folder / WEIGHTS_DIR))
    except (Exception, CheckpointException) as err:  # DCP wraps the reader's error (not an Exception): one line
        if isinstance(err, CheckpointException) and err.failures:  # {rank: (the reader's error, its stack)}
            err = next(iter(err.failures.values()))[0]
        said = str(err).strip().splitlines()
        first = f"{type(err).__name__}: {said[-1]}" if said else type(err).__name__
        raise CheckpointError(
            f"{folder / WEIGHTS_DIR}: the weights cannot be read ({first}); give another step"
        ) from None
    model.load_state_dict(weights)
    if dtype is not None:
        model.to(dtype=dtype)
    return model.to(device=device).eval()
