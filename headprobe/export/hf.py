"""``headprobe export hf``: one of our checkpoints as a Hugging Face model folder.

The folder (``OUT``) loads with ``transformers.AutoModelForCausalLM.from_pretrained(OUT,
trust_remote_code=True)`` anywhere, and without remote code where headprobe is installed
(:mod:`headprobe.export.auto`):

* ``config.json``: a :class:`HeadShapeConfig` (``model_type`` ``"headshape"``) with ``auto_map`` naming the
  two code files, and under ``"headprobe"`` the model config it was exported from (so
  :func:`headprobe.load_model` reads the folder back as our model, exactly);
* ``configuration_headshape.py``, ``modeling_headshape.py``: standalone transformers code (no headprobe
  import), copied from :mod:`headprobe.export.hf_code`;
* ``model.safetensors``: the weights under transformers' names (:func:`hf_names`; a tied LM head is not
  stored twice);
* ``tokenizer.json`` and ``tokenizer_config.json`` (a byte-tokenizer checkpoint gets an equivalent
  ``tokenizer.json``: byte ``b`` is id ``b``, ``<bos>`` ``<eos>`` ``<pad>`` are 256-258), and
  ``generation_config.json`` (greedy, the tokenizer's end id).

The folder is written atomically; an existing ``OUT`` is replaced only when asked.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from headprobe.core.atomic import atomic_directory
from headprobe.core.errors import HeadprobeError
from headprobe.core.outputs import EXPORT_KEY, HF_MODEL, claim
from headprobe.core.paths import file_sha256, is_gguf, not_a
from headprobe.core.steps import is_step_folder
from headprobe.model.checkpoint import CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE, load_checkpoint
from headprobe.model.config import LayerType, ModelConfig
from headprobe.model.tokenizer import ByteTokenizer, HFTokenizer
from headprobe.model.transformer import Transformer

MODEL_TYPE = "headshape"
CODE = Path(__file__).parent / "hf_code"
CODE_FILES = ("configuration_headshape.py", "modeling_headshape.py")
ORIGIN_KEY = EXPORT_KEY  # config.json: what the folder was exported from (how core.outputs knows an export)
AUTO_MAP = {
    "AutoConfig": "configuration_headshape.HeadShapeConfig",
    "AutoModel": "modeling_headshape.HeadShapeModel",
    "AutoModelForCausalLM": "modeling_headshape.HeadShapeForCausalLM",
}
HF_LAYER_TYPES = {LayerType.SLIDING: "sliding_attention", LayerType.FULL: "full_attention"}
_BYTE_SPECIALS = ("<bos>", "<eos>", "<pad>", "<reserved_0>", "<reserved_1>", "<reserved_2>", "<reserved_3>",
                  "<reserved_4>")  # fmt: skip


class ExportError(HeadprobeError, ValueError):
    """A checkpoint that cannot be exported as asked (the message says why and what to do)."""


def hf_names(cfg: ModelConfig) -> dict[str, str]:
    """Our parameter names -> transformers' (those of :mod:`headprobe.export.hf_code`), for every weight
    stored (a tied LM head is the embedding, stored once)."""
    names = {"embed.weight": "model.embed_tokens.weight", "ln_final.weight": "model.norm.weight"}
    if not cfg.tie_embeddings:
        names["lm_head.weight"] = "lm_head.weight"
    for i in range(cfg.n_layers):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        names[f"{ours}ln1.weight"] = f"{theirs}input_layernorm.weight"
        names[f"{ours}ln2.weight"] = f"{theirs}post_attention_layernorm.weight"
        names.update({f"{ours}attn.{p}_proj.weight": f"{theirs}self_attn.{p}_proj.weight" for p in "qkvo"})
        if cfg.attention(i).qk_norm:
            names.update({f"{ours}attn.{p}_norm.weight": f"{theirs}self_attn.{p}_norm.weight" for p in "qk"})
        names.update({f"{ours}mlp.{p}_proj.weight": f"{theirs}mlp.{p}_proj.weight" for p in ("gate", "up", "down")})
    return names


def hf_config(cfg: ModelConfig, tokenizer: ByteTokenizer | HFTokenizer) -> dict[str, Any]:
    """The ``config.json`` fields of :class:`HeadShapeConfig` for our ``cfg``."""

    def shape(kind: str) -> dict[str, Any]:
        att = getattr(cfg, kind)
        return {"num_attention_heads": att.n_heads, "num_key_value_heads": att.kv_heads,
                "qk_head_dim": att.qk_head_dim, "v_head_dim": att.v_head_dim, "rope_dim": att.rope_dim,
                "rope_theta": float(att.rope_theta), "qk_norm": att.qk_norm,
                **({"qk_norm_scale": att.qk_norm_scale} if att.qk_norm_scale is not None else {})}  # fmt: skip

    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers,
        "layer_types": [HF_LAYER_TYPES[t] for t in cfg.layer_types()],
        "attention": {"sliding_attention": shape("swa"), "full_attention": shape("full")},
        "sliding_window": cfg.swa.window if LayerType.SLIDING in cfg.layer_types() else None,
        "rms_norm_eps": cfg.norm_eps,
        "max_position_embeddings": cfg.max_seq_len,
        "initializer_range": cfg.init_std,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": tokenizer.bos_id,
        "eos_token_id": tokenizer.eos_id,
        "pad_token_id": tokenizer.pad_id,
    }


def check_exportable(checkpoint: Path, out: Path, overwrite: bool) -> None:
    """Refuse, before anything loads, a training step folder, a missing checkpoint, and an ``out`` that is or
    holds the checkpoint, lies inside it, holds anything but a Hugging Face model folder, or is one and
    ``overwrite`` was not given (:func:`headprobe.core.outputs.claim`)."""
    if is_gguf(checkpoint) and checkpoint.is_file():
        raise ExportError(
            f"{checkpoint} is a GGUF file, not a headprobe checkpoint: `export hf` writes headprobe's own checkpoints "
            "as Hugging Face folders. Every command that reads a model takes the GGUF file as it is; for a Hugging "
            "Face folder of it, copy the one they convert it into on first use, "
            "$HEADPROBE_CACHE/gguf/<SHA-256 of the file>/ (default ~/.cache/headprobe; docs/real-models.md)"
        )
    if why := not_a(checkpoint, "folder"):
        raise ExportError(f"checkpoint {checkpoint} {why}; give a headprobe checkpoint folder")
    if is_step_folder(checkpoint):
        raise ExportError(
            f"{checkpoint} is a training step folder (state.json, dcp/), not a checkpoint; turn it into one "
            f"first: `headprobe train export {checkpoint} CKPT`, then `headprobe export hf CKPT {out}`"
        )
    if not (checkpoint / CONFIG_FILE).is_file():
        raise ExportError(f"{checkpoint / CONFIG_FILE} is missing: give a headprobe checkpoint folder")
    try:
        config = json.loads((checkpoint / CONFIG_FILE).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ExportError(f"{checkpoint / CONFIG_FILE} is not valid JSON ({err}); restore the checkpoint's") from None
    if isinstance(config, dict) and "model_type" in config:
        raise ExportError(f"{checkpoint} is already a Hugging Face model folder (its config.json has a model_type)")
    claim(out, HF_MODEL, inputs=[checkpoint], overwrite=overwrite)  # never the checkpoint, nor what holds it


def export_hf(checkpoint: str | Path, out: str | Path, overwrite: bool = False) -> Path:
    """Write our ``checkpoint`` as a Hugging Face model folder ``out`` (module docstring); returns ``out``."""
    from headprobe.export.hf_code.configuration_headshape import HeadShapeConfig

    checkpoint, out = Path(checkpoint), Path(out)
    check_exportable(checkpoint, out, overwrite)
    model, tokenizer = load_checkpoint(checkpoint)  # refuses a missing, damaged or mismatched tokenizer
    tokenizer = tokenizer or ByteTokenizer()
    config = HeadShapeConfig(**hf_config(model.cfg, tokenizer))
    config.architectures = ["HeadShapeForCausalLM"]
    config.dtype = model.embed.weight.dtype  # the weights' own precision (a bf16 checkpoint stays bf16)
    config.auto_map = dict(AUTO_MAP)
    setattr(config, ORIGIN_KEY, {
        "model_config": model.cfg.to_dict(),
        "tokenizer": "byte" if isinstance(tokenizer, ByteTokenizer) else TOKENIZER_FILE,
        "exported_from": str(checkpoint),
        "source_sha256": file_sha256(checkpoint / WEIGHTS_FILE),  # which weights (a rerun keeps a current export)
    })  # fmt: skip
    with atomic_directory(out) as tmp:
        config.save_pretrained(tmp)
        for name in CODE_FILES:
            shutil.copyfile(CODE / name, tmp / name)
        _save_weights(model, tmp / WEIGHTS_FILE)
        _save_tokenizer(tokenizer, model.cfg, tmp)
        (tmp / "generation_config.json").write_text(json.dumps(_generation_config(tokenizer), indent=2) + "\n")
    return out


def _save_weights(model: Transformer, file: Path) -> None:
    from safetensors.torch import save_file

    state = model.state_dict()
    weights = {theirs: state[ours].detach().contiguous().cpu() for ours, theirs in hf_names(model.cfg).items()}
    save_file(weights, str(file), metadata={"format": "pt"})


def _save_tokenizer(tokenizer: ByteTokenizer | HFTokenizer, cfg: ModelConfig, folder: Path) -> None:
    if isinstance(tokenizer, ByteTokenizer):
        byte_tokenizer_json(folder / TOKENIZER_FILE)
        names = dict(zip(("bos", "eos", "pad"), _BYTE_SPECIALS, strict=False))
    else:
        tokenizer.save(folder / TOKENIZER_FILE)
        ids = {k: getattr(tokenizer, f"{k}_id") for k in ("bos", "eos", "pad")}
        names = {k: tokenizer.token_text(i) if i is not None else None for k, i in ids.items()}
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.max_seq_len,
                "clean_up_tokenization_spaces": False}  # fmt: skip
    settings.update({f"{k}_token": v for k, v in names.items() if v is not None})
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")


def _generation_config(tokenizer: ByteTokenizer | HFTokenizer) -> dict[str, Any]:
    ids = {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id, "pad_token_id": tokenizer.pad_id}
    return {**{k: v for k, v in ids.items() if v is not None}, "do_sample": False}


def byte_bytes_to_chars() -> dict[int, str]:
    """The byte-level alphabet of ``tokenizers``' ``ByteLevel`` pre-tokenizer: each byte as one printable
    character (printable Latin-1 bytes as themselves, the others as ``chr(256 + k)`` in byte order)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def byte_tokenizer_json(file: Path) -> None:
    """A ``tokenizer.json`` equal to :class:`~headprobe.model.tokenizer.ByteTokenizer`: UTF-8 byte ``b`` is
    id ``b`` (a byte-level BPE without merges), ``<bos>`` ``<eos>`` ``<pad>`` and five reserved ids
    256-263 as special tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {c: b for b, c in byte_bytes_to_chars().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in _BYTE_SPECIALS])
    tok.save(str(file))


def hf_weights_to_ours(weights: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    """An exported folder's weights under our names (a tied head shared with the embedding)."""
    names = hf_names(cfg)
    missing = sorted(set(names.values()) - set(weights))
    if missing:
        raise ExportError(f"the exported weights lack {missing[:3]}{' ...' if len(missing) > 3 else ''}")
    ours = {k: weights[v] for k, v in names.items()}
    if cfg.tie_embeddings:
        ours["lm_head.weight"] = ours["embed.weight"]
    return ours


def load_exported(
    folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> tuple[Transformer, HFTokenizer | None]:
    """An exported folder read back as our :class:`Transformer` (in the dtype its weights were saved in
    unless ``dtype`` is given) and its tokenizer (``None``: the byte tokenizer), exactly."""
    from safetensors.torch import load_file

    from headprobe.model.tokenizer import load_tokenizer

    folder = Path(folder)
    config = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    origin = config.get(ORIGIN_KEY)
    if not isinstance(origin, dict) or "model_config" not in origin:
        raise ExportError(f"{folder / CONFIG_FILE} has no {ORIGIN_KEY!r} record: it was not written by headprobe")
    cfg = ModelConfig.from_dict(origin["model_config"])
    weights = load_file(str(folder / WEIGHTS_FILE))
    model = Transformer(cfg).to(dtype=dtype or next(iter(weights.values())).dtype)  # as saved unless asked
    model.load_state_dict(hf_weights_to_ours(weights, cfg))
    model.to(device=device)
    tokenizer = None if origin.get("tokenizer") == "byte" else load_tokenizer(folder / TOKENIZER_FILE)
    return model.eval(), tokenizer
