"""Resumable training checkpoints: ``OUT/step_XXXXXX/`` folders written by every process together.

Layout of one step folder::

    state.json        step, tokens seen, data position and the settings needed to resume exactly
    dcp/              model and optimizer state in torch.distributed.checkpoint format (sharded
                      under FSDP, whole otherwise; loadable with any number of processes)
    rng/rank_N.pt     each process's random number generator states

All processes write into ``OUT/.step_XXXXXX.tmp``; after a barrier the main process renames it to
``OUT/step_XXXXXX``, so a step folder exists only once it is complete. ``export_step`` turns a step
folder into a plain model checkpoint (:mod:`headprobe.model.checkpoint`) without a process group.
"""

from __future__ import annotations

import json
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from headprobe.core.atomic import atomic_write_text
from headprobe.core.steps import STEP_FILE, WEIGHTS_DIR, list_steps, read_step, step_folder
from headprobe.model.config import ModelConfig
from headprobe.model.tokenizer import ByteTokenizer
from trainer.distributed import World, barrier


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_step(
    out: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    world: World,
    keep: int,
) -> Path:
    """Write ``OUT/step_XXXXXX`` collectively and keep only the newest ``keep`` step folders."""
    final = step_folder(out, step)
    tmp = out / f".{final.name}.tmp"
    if world.is_main:
        out.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        (tmp / "rng").mkdir(parents=True)
    try:
        barrier(world)
        with warnings.catch_warnings():  # a single process without a process group is intended
            warnings.filterwarnings("ignore", message=".*assuming the intent is to")
            dcp.save(
                {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)},
                checkpoint_id=str(tmp / WEIGHTS_DIR),
            )
        torch.save(_rng_state(), tmp / "rng" / f"rank_{world.rank}.pt")
        barrier(world)
    except BaseException:  # aborted (a second Ctrl-C) or failed: no half-written step is left behind
        if world.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if world.is_main:
        atomic_write_text(tmp / STEP_FILE, json.dumps({**state, "step": step, "world_size": world.size}, indent=2))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        for _, old in list_steps(out)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    barrier(world)
    return final


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def model_differences(saved: dict[str, Any] | None, now: ModelConfig) -> list[str]:
    """How the model configuration a step checkpoint recorded (``state.json``'s ``model_config``) differs from
    ``now``, field by field (``"preset toy-d16 vs toy-d32"``, ``"full.n_heads 8 vs 4"``: saved vs now); empty
    when every field that shapes the model or its training is equal. The preset name is listed with the others
    but alone is no difference (a config file with a preset's values is that preset)."""
    if saved is None:  # not recorded: nothing to compare
        return []
    old, new = _flat(saved), _flat(now.to_dict())
    keys = sorted((k for k in {**old, **new} if old.get(k) != new.get(k)), key=lambda k: k != "name")  # name first
    if keys in ([], ["name"]):
        return []
    label = {"name": "preset"}
    return [f"{label.get(k, k)} {_shown(old.get(k))} vs {_shown(new.get(k))}" for k in keys]


# the settings that decide a run's numbers besides its model and data (checked on their own): its length, batch,
# optimizer, schedule, frozen weights and seed. The rest (micro-batches, processes, backend, device, threads,
# logging, probes, step checkpoints) change how a run trains, not what it computes, and may differ on a resume.
TRAINING = (
    "stage", "steps", "tokens", "batch_size", "seq_len", "lr", "min_lr_ratio", "warmup_steps", "schedule",
    "decay_fraction", "weight_decay", "beta1", "beta2", "grad_clip", "freeze", "seed",
)  # fmt: skip
CONFIG_FILE = "train_config.json"  # a run's training settings, as its first step trained with them


def training_differences(saved: dict[str, Any] | None, now: dict[str, Any]) -> list[str]:
    """How the training settings a run was made with (``saved``: a :class:`~trainer.config.TrainConfig` as a
    dict, e.g. ``state.json``'s ``train_config``) differ from ``now``'s in what decides its numbers
    (:data:`TRAINING`), as given: ``"lr 0.003 vs 0.02"`` (saved vs now); empty when they agree, or when
    nothing was saved."""
    if not saved:
        return []
    return [f"{k} {_shown(saved.get(k))} vs {_shown(now.get(k))}" for k in TRAINING if saved.get(k) != now.get(k)]


def saved_training(run: Path) -> dict[str, Any] | None:
    """The training settings the run folder ``run`` trained with: its newest step checkpoint's, else its
    ``train_config.json``; ``None`` for a folder with neither (nothing trained there yet)."""
    steps = list_steps(run)
    try:
        if steps:
            return read_step(steps[-1][1]).get("train_config")
        if (run / CONFIG_FILE).is_file():
            return json.loads((run / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return None
    return None


def _shown(value: Any) -> str:
    return "none" if value is None else str(value)


def load_step(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, world: World) -> dict[str, Any]:
    """Restore model, optimizer and (when the process count matches) RNG states; returns state.json."""
    state = read_step(folder)
    sd = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to")
        dcp.load(sd, checkpoint_id=str(folder / WEIGHTS_DIR))
    set_model_state_dict(model, sd["model"])
    set_optimizer_state_dict(model, optimizer, sd["optim"])
    rng_file = folder / "rng" / f"rank_{world.rank}.pt"
    if rng_file.is_file() and state.get("world_size") == world.size:
        _set_rng_state(torch.load(rng_file, weights_only=False))
    return state


def export_step(folder: str | Path, out: str | Path, overwrite: bool = False) -> Path:
    """Turn a step folder into a plain checkpoint ``out`` (no process group needed). ``out`` must not be or
    hold the step folder, and an existing checkpoint there is replaced only with ``overwrite``
    (:func:`headprobe.core.outputs.claim`); the step folder is only read."""
    from headprobe.core.outputs import CHECKPOINT, claim
    from headprobe.model.checkpoint import save_checkpoint
    from headprobe.model.step_checkpoint import load_step_weights
    from headprobe.text.toy_tokenizer import step_tokenizer

    folder, out = Path(folder), Path(out)
    claim(out, CHECKPOINT, inputs=[folder], overwrite=overwrite)
    tokenizer = step_tokenizer(folder)  # checked before the weights are read: the export would carry the wrong one
    model = load_step_weights(folder)
    return save_checkpoint(model, out, None if isinstance(tokenizer, ByteTokenizer) else tokenizer)
