"""``load_model(path)``: our checkpoint folders, local Hugging Face model folders and GGUF files, as a
:class:`~headprobe.hooked.base.HookedModel`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from headprobe.core.errors import HeadprobeError, SettingError
from headprobe.core.paths import file_sha256, is_gguf
from headprobe.core.steps import StepError, is_step_folder, read_step
from headprobe.export.hf import MODEL_TYPE, ORIGIN_KEY, load_exported
from headprobe.hooked.base import HookedModel
from headprobe.hooked.errors import ModelLoadError
from headprobe.hooked.gguf import SOURCE_FILE, Log, cached_folder, check_gguf, gguf_folder
from headprobe.hooked.hf import HFModel
from headprobe.hooked.ours import HeadprobeModel
from headprobe.model.checkpoint import (
    CONFIG_FILE,
    CheckpointError,
    ModelKind,
    checkpoint_tokenizer,
    load_checkpoint,
    model_kind,
)
from headprobe.model.step_checkpoint import load_step_weights
from headprobe.model.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer
from headprobe.text.toy_tokenizer import step_tokenizer

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
        raise SettingError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


def load_model(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None, log: Log | None = None
) -> HookedModel:
    """Our checkpoint folder, a local Hugging Face model folder, or a ``.gguf`` file (converted once into a
    cached Hugging Face folder, :func:`headprobe.hooked.gguf.gguf_folder`; ``log`` hears when that
    happens), as a :class:`HookedModel`. Weights that are not all finite numbers are refused
    (:func:`check_finite_weights`): every number measured from them would be NaN, or an error deep inside."""
    model = _load_model(Path(path), device, dtype, log)
    check_finite_weights(model, path)
    return model


def check_finite_weights(model: HookedModel, path: str | Path) -> None:
    """Raise :class:`ModelLoadError` when a weight of ``model`` (loaded from ``path``) is NaN or infinite, as a
    training run that diverged leaves them."""
    tensors = [p for p in model.parameters() if p.is_floating_point()]
    bad = sum(not bool(torch.isfinite(p).all()) for p in tensors)
    if bad:
        raise ModelLoadError(
            f"{path}: its weights are not finite numbers ({bad} of its {len(tensors)} weight tensors hold NaN or "
            "inf), so nothing can be measured from it: was it trained until it diverged? Give "
            "another checkpoint, or train it again with a lower learning rate (headprobe train --lr)"
        )


def _load_model(path: Path, device: str | torch.device, dtype: torch.dtype | None, log: Log | None) -> HookedModel:
    """:func:`load_model`, before its weights are checked."""
    kind = _kind(path)  # the GGUF header is read where the file is converted, not again for each load
    if kind == "step":  # a training step folder, read from its shards
        try:
            tokenizer = step_tokenizer(path)
            model = load_step_weights(path, device=device, dtype=dtype)
        except (CheckpointError, StepError) as err:
            raise ModelLoadError(str(err)) from None
        return HeadprobeModel(model, tokenizer, model_name(path), folder=path)
    if kind == "gguf":
        folder = gguf_folder(path, log)
        source = json.loads((folder / SOURCE_FILE).read_text())
        return HFModel(folder, device=device, dtype=dtype or torch.float32, name=model_name(path), source=source)
    config = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))  # model_kind read it already
    if config.get("model_type") == MODEL_TYPE and ORIGIN_KEY in config:  # our model, exported (headprobe export hf)
        try:
            model, tokenizer = load_exported(path, device=device, dtype=dtype)
        except (HeadprobeError, OSError, RuntimeError) as err:
            raise ModelLoadError(f"{path}: cannot read the exported model back: {err}") from None
        return HeadprobeModel(model, tokenizer or ByteTokenizer(), model_name(path), folder=path)
    if "model_type" in config:  # Hugging Face
        return HFModel(path, device=device, dtype=dtype or torch.float32, name=model_name(path))
    try:
        model, tokenizer = load_checkpoint(path, device=device, dtype=dtype)
    except CheckpointError as err:
        raise ModelLoadError(str(err)) from None
    return HeadprobeModel(model, tokenizer, model_name(path), folder=path)


def model_tokenizer(path: str | Path) -> ByteTokenizer | HFTokenizer:
    """The tokenizer at ``path``: a ``tokenizer.json`` file, or a model folder's own tokenizer (our checkpoint's,
    byte or file, as :func:`load_model` would read it: :func:`headprobe.model.checkpoint.checkpoint_tokenizer`; a
    Hugging Face folder's ``tokenizer.json``). A GGUF file's is in its converted folder (:func:`model_files`)."""
    path = Path(path)
    if is_step_folder(path):
        try:
            return step_tokenizer(path)
        except (CheckpointError, StepError) as err:
            raise ModelLoadError(str(err)) from None
    if path.is_dir() and (path / CONFIG_FILE).is_file() and _kind(path) == "checkpoint":
        try:
            return checkpoint_tokenizer(path)
        except CheckpointError as err:
            raise ModelLoadError(str(err)) from None
    return load_tokenizer(path)


def model_files(path: str | Path, log: Log | None = None) -> Path:
    """Where the files of the model ``path`` lie (its tokenizer, config and chat template): a GGUF file's
    converted folder (:func:`headprobe.hooked.gguf.gguf_folder`, converted now if it was not; ``log`` hears
    when), any other path as it is."""
    return gguf_folder(path, log) if is_gguf(path) else Path(path)


def check_model(path: str | Path) -> ModelKind:
    """What the model path ``path`` is (:func:`headprobe.model.checkpoint.model_kind`: a GGUF file, a Hugging
    Face folder or our checkpoint), checked as far as its files allow without loading anything (a GGUF
    file's header too, :func:`headprobe.hooked.gguf.check_gguf`); what a command calls before any work.
    Raises :class:`ModelLoadError` naming the problem and the fix."""
    kind = _kind(path)
    if kind == "gguf":
        check_gguf(path)
    return kind


def _kind(path: str | Path) -> ModelKind:
    """:func:`headprobe.model.checkpoint.model_kind`, its refusal a :class:`ModelLoadError`."""
    try:
        return model_kind(path)
    except CheckpointError as err:
        raise ModelLoadError(str(err)) from None


def model_name(path: str | Path) -> str:
    """A checkpoint's one name, in its results (the sub-folder of ``OUT``), its logs and its errors: its folder
    name (a GGUF file's name without ``.gguf``), with its parents when the name is generic (``final``,
    ``step_...``: ``runs/x/toy-d16/sft/final`` -> ``toy-d16-sft-final``; in a grid's seed folder
    ``runs/grid/toy-d16/s0/pt/final`` -> ``toy-d16-s0-pt-final``)."""
    path = Path(path)
    if is_gguf(path):
        return path.stem
    if path.name == "final" or path.name.startswith("step_"):
        parts = path.resolve().parts
        depth = 4 if len(parts) >= 4 and re.fullmatch(r"s\d+", parts[-3]) else 3
        return "-".join(parts[-depth:])
    return path.name


def trained_positions(path: str | Path) -> int | None:
    """The longest input the model folder ``path`` was made for, read from its ``config.json`` alone
    (nothing heavy is loaded): our checkpoints' trained sequence length (``max_seq_len``), a Hugging Face
    model's ``max_position_embeddings``; ``None`` when the file does not say."""
    if is_gguf(path):  # the converted folder's config, or the file's header before the first conversion
        try:
            folder = cached_folder(file_sha256(path))
            if not (folder / CONFIG_FILE).is_file():
                return check_gguf(path)["context_length"]
            path = folder
        except (OSError, ModelLoadError):
            return None  # the load that follows says what is wrong with the file
    try:
        if is_step_folder(path):  # its config is in state.json
            config = read_step(path).get("model_config")
        else:
            config = json.loads((Path(path) / CONFIG_FILE).read_text())
    except (OSError, json.JSONDecodeError, StepError):
        return None
    if not isinstance(config, dict):
        return None
    value = config.get("max_position_embeddings") if "model_type" in config else config.get("max_seq_len")
    if value is None and "text_config" in config:  # multimodal HF configs nest the language model's
        value = (config["text_config"] or {}).get("max_position_embeddings")
    positive = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    return value if positive else None  # anything else: the load that follows refuses the config, naming the field


class BeyondTrainedError(HeadprobeError, ValueError):
    """Lengths beyond what a model was trained on, asked for without ``allow_beyond_trained``."""


def check_trained_lengths(path: str | Path, lengths: list[int], allow_beyond_trained: bool = False) -> str | None:
    """Refuse ``lengths`` longer than the model at ``path`` was trained on (:func:`trained_positions`),
    before anything is loaded; with ``allow_beyond_trained`` return the warning to print instead."""
    trained = trained_positions(path)
    beyond = [n for n in lengths if trained is not None and n > trained]
    if not beyond:
        return None
    what = (
        f"{Path(path)}: {', '.join(f'{n:,}' for n in beyond)} tokens exceed the {trained:,} positions it was trained on"
    )
    if not allow_beyond_trained:
        raise BeyondTrainedError(
            f"{what}; use `lengths` up to {trained:,}, or `allow_beyond_trained` to measure extrapolation on purpose"
        )
    return f"warning: {what}: measuring extrapolation (recorded in the results)"
