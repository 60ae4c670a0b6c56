"""Model checkpoints: a folder with ``config.json``, ``model.safetensors`` and, unless the tokenizer is
the byte tokenizer, ``tokenizer.json``.

The folder is written atomically (see :mod:`headprobe.core.atomic`): a crash leaves the previous checkpoint
or none, never a half-written one. Each tensor's CRC-32 is stored in the safetensors metadata, so a
file whose bytes were damaged after writing is caught on load, not silently used. So is the tokenizer the
model was saved with (the byte tokenizer, or the SHA-256 and size of ``tokenizer.json`` as written): a
``tokenizer.json`` that went missing, was replaced, or was added to a byte checkpoint is refused on load
instead of silently reading the text with other ids. Checkpoints written before that record load as before.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Literal

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from headprobe.core.atomic import atomic_directory
from headprobe.core.errors import HeadprobeError
from headprobe.core.outputs import CONFIG_FILE, WEIGHTS_FILE
from headprobe.core.paths import GGUF_SUFFIX, file_sha256, is_gguf, not_a
from headprobe.core.steps import is_step_folder
from headprobe.model.config import ConfigError, ModelConfig
from headprobe.model.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer
from headprobe.model.transformer import Transformer

TOKENIZER_FILE = "tokenizer.json"
FORMAT = "headprobe-checkpoint-1"
# config fields that decide what each weight means; symmetric grid members (e.g. toy-d16 and toy-d64)
# have identical tensor shapes, so shapes alone cannot tell their weights apart
_LAYOUT_FIELDS = ("vocab_size", "d_model", "n_layers", "d_ff", "full_every", "tie_embeddings")
_ATTENTION_LAYOUT_FIELDS = ("n_heads", "qk_head_dim", "v_head_dim", "n_kv_heads")
# the safetensors metadata key of the tokenizer record, and its two kinds
TOKENIZER_KEY = "tokenizer"
BYTE_KIND, FILE_KIND = "byte", TOKENIZER_FILE


class CheckpointError(HeadprobeError, RuntimeError):
    """A checkpoint folder is missing, incomplete, corrupted or does not match its config."""


ModelKind = Literal["gguf", "huggingface", "checkpoint", "step"]
MODEL_PATHS = "a model folder (config.json and its weights) or a .gguf file"


def model_kind(path: str | Path) -> ModelKind:
    """What the model path ``path`` is, from its name and its ``config.json`` alone (nothing is loaded):
    ``gguf``, a GGUF file (:func:`headprobe.core.paths.is_gguf`; its header is checked where it is read);
    ``huggingface``, a folder whose ``config.json`` names a ``model_type`` (a Hugging Face model, or ours
    exported by ``headprobe export hf``); ``checkpoint``, any other folder with a ``config.json`` (ours);
    ``step``, a training run's step folder (``state.json`` beside ``dcp/``, :mod:`headprobe.core.steps`).
    The one rule every command's model paths follow; raises :class:`CheckpointError` saying what ``path`` is
    when it is none of them (missing, a file of another kind, a folder named ``.gguf``, no or a broken
    ``config.json``)."""
    path = Path(path)
    if is_gguf(path):
        if why := not_a(path, "file"):
            raise CheckpointError(f"GGUF file {path} {why}; give {MODEL_PATHS}")
        return "gguf"
    if why := not_a(path, "folder"):
        raise CheckpointError(f"{path} {why}; give {MODEL_PATHS}")
    if is_step_folder(path):
        return "step"
    config = path / CONFIG_FILE
    if not config.is_file():
        if path.suffix.lower() == GGUF_SUFFIX:
            raise CheckpointError(
                f"{path} is a folder, not a GGUF file (and holds no {CONFIG_FILE}); give the .gguf file itself, "
                "or a model folder"
            )
        raise CheckpointError(f"{config} is missing: {path} is neither a headprobe checkpoint nor a Hugging Face model")
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{config} is not valid JSON ({err}); restore the model's {CONFIG_FILE}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{config} holds no JSON object; restore the model's {CONFIG_FILE}")
    return "huggingface" if "model_type" in data else "checkpoint"


def _crc32(t: Tensor) -> str:
    raw = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
    return f"{zlib.crc32(raw):08x}"


def _layout(cfg: ModelConfig) -> dict[str, object]:
    layout: dict[str, object] = {f: getattr(cfg, f) for f in _LAYOUT_FIELDS}
    for kind in ("swa", "full"):
        att = getattr(cfg, kind)
        layout.update({f"{kind}.{f}": getattr(att, f) for f in _ATTENTION_LAYOUT_FIELDS})
    return layout


def _weights(model: Transformer) -> dict[str, Tensor]:
    """The state dict without the tied LM head (safetensors stores no aliases)."""
    state = model.state_dict()
    if model.cfg.tie_embeddings:
        state.pop("lm_head.weight")
    return {k: v.detach().contiguous().cpu() for k, v in state.items()}


def tokenizer_record(folder: Path, tokenizer: ByteTokenizer | HFTokenizer | None) -> dict[str, object]:
    """What a checkpoint records of its tokenizer: ``{"kind": "byte", "vocab_size": 264}``, or for a
    ``tokenizer.json`` (already written into ``folder``) ``{"kind": "tokenizer.json", "sha256": ..., "vocab_size":
    ...}``, the SHA-256 of the file's bytes as written."""
    if tokenizer is None or isinstance(tokenizer, ByteTokenizer):
        return {"kind": BYTE_KIND, "vocab_size": (tokenizer or ByteTokenizer()).vocab_size}
    return {"kind": FILE_KIND, "sha256": file_sha256(folder / TOKENIZER_FILE), "vocab_size": tokenizer.vocab_size}


def save_checkpoint(model: Transformer, path: str | Path, tokenizer: ByteTokenizer | HFTokenizer | None = None) -> Path:
    """Write ``model`` (and ``tokenizer``; ``None`` is the byte tokenizer) to the folder ``path`` atomically, the
    tokenizer recorded (:func:`tokenizer_record`) so that a different one is refused on load; returns ``path``."""
    path = Path(path)
    if (
        tokenizer is not None
        and not isinstance(tokenizer, ByteTokenizer)
        and tokenizer.vocab_size > model.cfg.vocab_size
    ):
        raise CheckpointError(
            f"tokenizer has {tokenizer.vocab_size} ids but the model's vocab_size is {model.cfg.vocab_size}"
        )
    weights = _weights(model)
    metadata = {
        "format": FORMAT,
        "layout": json.dumps(_layout(model.cfg)),
        **{f"crc32:{k}": _crc32(v) for k, v in weights.items()},
    }
    with atomic_directory(path) as tmp:
        (tmp / CONFIG_FILE).write_text(model.cfg.to_json())
        if tokenizer is not None and not isinstance(tokenizer, ByteTokenizer):
            tokenizer.save(tmp / TOKENIZER_FILE)
        metadata[TOKENIZER_KEY] = json.dumps(tokenizer_record(tmp, tokenizer))
        save_file(weights, str(tmp / WEIGHTS_FILE), metadata=metadata)
    return path


def _read_weights(file: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    try:
        with safe_open(str(file), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
    except Exception as err:  # safetensors raises SafetensorError / OSError on damaged files
        raise CheckpointError(
            f"{file}: cannot read safetensors ({err}); the file is truncated or corrupted. "
            "Re-save the checkpoint or restore it from a copy."
        ) from None
    return tensors, metadata


def _read_config(path: Path) -> ModelConfig:
    if is_gguf(path) and path.is_file():
        raise CheckpointError(
            f"{path} is a GGUF file, not a headprobe checkpoint folder: headprobe analyzes, evaluates and explores "
            "GGUF models, but trains and exports only its own checkpoints"
        )
    if why := not_a(path, "folder"):
        raise CheckpointError(
            f"checkpoint folder {path} {why} (expected a folder with {CONFIG_FILE} and {WEIGHTS_FILE})"
        )
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (path / name).is_file():
            raise CheckpointError(f"{path / name} is missing: {path} is not a complete checkpoint")
    try:
        return ModelConfig.from_json((path / CONFIG_FILE).read_text())
    except (ConfigError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path / CONFIG_FILE}: {err}") from None


def _check_integrity(path: Path, cfg: ModelConfig, tensors: dict[str, Tensor], metadata: dict[str, str]) -> None:
    """Every tensor passes its CRC-32, and the head layout the weights were saved with is the config's."""
    weights_file = path / WEIGHTS_FILE
    damaged = [k for k, t in tensors.items() if f"crc32:{k}" in metadata and metadata[f"crc32:{k}"] != _crc32(t)]
    if damaged:
        raise CheckpointError(
            f"{weights_file}: tensors {damaged[:5]} fail their CRC-32 check; the file is corrupted. "
            "Restore it from a copy."
        )
    if "layout" in metadata:
        saved = json.loads(metadata["layout"])
        diff = [f"{k}: weights {saved.get(k)!r} vs config {v!r}" for k, v in _layout(cfg).items() if saved.get(k) != v]
        if diff:
            raise CheckpointError(
                f"{path / CONFIG_FILE} does not describe the weights in {weights_file}: "
                + "; ".join(diff)
                + ". The weights were saved from a different configuration; restore its config.json."
            )


def _ids(n: object) -> str:
    return f"{n:,} ids" if isinstance(n, int) else "? ids"


def _describe(record: dict[str, object]) -> str:
    if record.get("kind") == BYTE_KIND:
        return f"the byte tokenizer ({_ids(record.get('vocab_size'))})"
    return f"a {TOKENIZER_FILE} of {_ids(record.get('vocab_size'))} (SHA-256 {str(record.get('sha256'))[:12]})"


def _check_tokenizer(path: Path, metadata: dict[str, str]) -> None:
    """The folder holds the tokenizer the weights were saved with (a checkpoint without the record, written
    before it existed, passes: its tokenizer is whatever the folder holds, as it always was)."""
    if TOKENIZER_KEY not in metadata:
        return
    tok_file = path / TOKENIZER_FILE
    try:
        record = json.loads(metadata[TOKENIZER_KEY])
        kind = record["kind"]
        if kind not in (BYTE_KIND, FILE_KIND):
            raise KeyError(kind)
    except (json.JSONDecodeError, TypeError, KeyError):
        raise CheckpointError(
            f"{path / WEIGHTS_FILE}: its tokenizer record is damaged ({metadata[TOKENIZER_KEY][:80]!r}). "
            "Restore the file from a copy."
        ) from None
    recorded = f"{path} was saved with {_describe(record)}"
    if kind == BYTE_KIND:
        if tok_file.is_file():
            raise CheckpointError(
                f"{tok_file}: {recorded}, but the folder holds a {TOKENIZER_FILE} (SHA-256 "
                f"{file_sha256(tok_file)[:12]}) it would be read with instead. Remove {tok_file}: this checkpoint's "
                "tokenizer is the byte tokenizer."
            )
        return
    fix = f"Restore the {TOKENIZER_FILE} the checkpoint was saved with."
    if not tok_file.is_file():
        raise CheckpointError(
            f"{tok_file} is missing: {recorded}; without it the text would be read with the byte tokenizer "
            f"({_ids(ByteTokenizer.vocab_size)}). {fix}"
        )
    found = file_sha256(tok_file)
    if found != record.get("sha256"):
        try:
            size = _ids(load_tokenizer(tok_file).vocab_size)
        except ValueError:
            size = f"not a valid {TOKENIZER_FILE}"
        raise CheckpointError(
            f"{tok_file} is not the tokenizer the checkpoint was saved with: {recorded}, but this file has "
            f"SHA-256 {found[:12]} ({size}). {fix}"
        )


def _check_shapes(path: Path, cfg: ModelConfig, tensors: dict[str, Tensor], expected: dict[str, Tensor]) -> None:
    """The file holds exactly the model's tensors, each of the config's shape."""
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    wrong = [
        f"{k}: file {tuple(tensors[k].shape)} vs config {tuple(expected[k].shape)}"
        for k in sorted(set(expected) & set(tensors))
        if tensors[k].shape != expected[k].shape
    ]
    if missing or unexpected or wrong:
        parts = []
        if wrong:
            parts.append("shape mismatches: " + "; ".join(wrong[:5]))
        if missing:
            parts.append(f"missing tensors: {missing[:5]}")
        if unexpected:
            parts.append(f"unexpected tensors: {unexpected[:5]}")
        raise CheckpointError(
            f"{path / WEIGHTS_FILE} does not match {path / CONFIG_FILE} ({cfg.name or 'custom'}): "
            + " | ".join(parts)
            + ". The weights were saved from a different configuration."
        )


def load_checkpoint(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> tuple[Transformer, ByteTokenizer | HFTokenizer]:
    """Load a checkpoint folder into a :class:`Transformer` (in eval mode) and its tokenizer.

    The model keeps the dtype its weights were saved in unless ``dtype`` is given.

    Raises:
        CheckpointError: the folder or a file is missing, the weights are damaged, they do not match
            ``config.json``, or the tokenizer is not the one they were saved with (each problem is named with
            the file it concerns).
    """
    path = Path(path)
    cfg = _read_config(path)
    tensors, metadata = _read_weights(path / WEIGHTS_FILE)
    _check_integrity(path, cfg, tensors, metadata)
    _check_tokenizer(path, metadata)
    model = Transformer(cfg)
    _check_shapes(path, cfg, tensors, _weights(model))
    if dtype is None:  # keep the precision the weights were saved in
        dtype = next(iter(tensors.values())).dtype
    model.to(dtype=dtype)
    model.load_state_dict(tensors, strict=not cfg.tie_embeddings)
    model.to(device=device)
    model.eval()
    return model, _tokenizer(path, cfg)


def checkpoint_tokenizer(path: str | Path) -> ByteTokenizer | HFTokenizer:
    """The tokenizer of the checkpoint folder ``path``, as :func:`load_checkpoint` loads it (the ``tokenizer.json``
    it was saved with, checked against the record in its weights file, or the byte tokenizer), without reading
    the weights themselves. Raises :class:`CheckpointError` as :func:`load_checkpoint` does."""
    path = Path(path)
    cfg = _read_config(path)
    try:
        with safe_open(str(path / WEIGHTS_FILE), framework="pt") as f:
            metadata = f.metadata() or {}
    except Exception:  # damaged: the full read says how
        metadata = _read_weights(path / WEIGHTS_FILE)[1]
    _check_tokenizer(path, metadata)
    return _tokenizer(path, cfg)


def _tokenizer(path: Path, cfg: ModelConfig) -> ByteTokenizer | HFTokenizer:
    """The tokenizer of the checkpoint ``path`` (whose record :func:`_check_tokenizer` has checked)."""
    tok_file = path / TOKENIZER_FILE
    tokenizer = load_tokenizer(tok_file) if tok_file.is_file() else ByteTokenizer()
    if tokenizer.vocab_size > cfg.vocab_size:
        raise CheckpointError(
            f"{tok_file}: tokenizer has {tokenizer.vocab_size} ids, more than the model's vocab_size={cfg.vocab_size}"
        )
    return tokenizer
