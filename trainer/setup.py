"""What a training stage is built from: the model (new or from a checkpoint), frozen projections, the data."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from headprobe.core.paths import file_sha256
from headprobe.model.checkpoint import CONFIG_FILE, WEIGHTS_FILE, CheckpointError, load_checkpoint
from headprobe.model.config import ConfigError, ModelConfig
from headprobe.model.presets import preset
from headprobe.model.tokenizer import ByteTokenizer, HFTokenizer
from headprobe.model.transformer import Transformer
from headprobe.text.toy_tokenizer import cache_dir, open_tokenizer
from trainer.config import Freeze, Stage, TrainConfig, TrainError
from trainer.curriculum import Curriculum, CurriculumSource
from trainer.data import Batch, DataError, PackedSequences, Sampler, TokenData, collate, synth
from trainer.distributed import World
from trainer.sft import SftData, builtin_examples, load_jsonl


def _new_model_config(cfg: TrainConfig) -> ModelConfig:
    """pt's model configuration: the `preset` or the `config` file; an unknown preset or an unusable file is
    a :class:`TrainError` that names the option."""
    option = "preset" if cfg.preset else "config"
    try:
        model = preset(cfg.preset) if cfg.preset else ModelConfig.load(cfg.config)  # type: ignore[arg-type]
    except (ConfigError, FileNotFoundError) as err:
        raise TrainError(f"`{option}`: {err}") from None
    if cfg.qk_norm_scale is not None and not cfg.qk_norm:
        raise TrainError("`qk_norm_scale` bounds the logits of normalised queries and keys: set `qk_norm` too")
    if not cfg.qk_norm:
        return model
    norm = {"qk_norm": True, "qk_norm_scale": cfg.qk_norm_scale}
    return model.replace(swa=dataclasses.replace(model.swa, **norm), full=dataclasses.replace(model.full, **norm))


def _load_init(cfg: TrainConfig) -> tuple[Transformer, ByteTokenizer | HFTokenizer | None]:
    """cpt/sft's starting model and tokenizer, from the checkpoint `init`; one that is missing, incomplete or
    damaged is a :class:`TrainError` that names the option and what it takes."""
    try:
        return load_checkpoint(cfg.init, dtype=torch.float32)  # type: ignore[arg-type]
    except CheckpointError as err:
        folder = Path(cfg.init)  # type: ignore[arg-type]
        if (folder / CONFIG_FILE).is_file() and (folder / WEIGHTS_FILE).is_file():  # a checkpoint, damaged: its fix
            raise TrainError(f"`init`: {err}") from None
        raise TrainError(
            f"`init`: {str(err).rstrip('.')}. Give `init` a checkpoint folder ({CONFIG_FILE} and {WEIGHTS_FILE}), "
            "e.g. the final/ folder of a pt run's `out`"
        ) from None


def model_and_tokenizer(cfg: TrainConfig) -> tuple[Transformer, ByteTokenizer | HFTokenizer | None]:
    """Build (pt) or load (cpt/sft) the model; the tokenizer if known yet."""
    if cfg.stage is Stage.PT:
        if cfg.init:
            raise TrainError("`init` is for cpt/sft; pt trains from scratch (use `preset` or `config`)")
        if bool(cfg.preset) == bool(cfg.config):
            raise TrainError("pt needs exactly one of `preset` NAME or `config` FILE")
        model_cfg = _new_model_config(cfg)
        torch.manual_seed(cfg.seed)
        return Transformer(model_cfg), None
    if not cfg.init:
        raise TrainError(f"`stage` {cfg.stage} continues a model: give `init` CHECKPOINT")
    for name in ("qk_norm", "qk_norm_scale"):
        if getattr(cfg, name) not in (False, None):
            raise TrainError(f"`{name}` is a pt setting: `stage` {cfg.stage} keeps the model of `init` as it is")
    if cfg.preset or cfg.config:
        raise TrainError(f"`stage` {cfg.stage} takes the model from `init`; drop `preset`/`config`")
    model, tokenizer = _load_init(cfg)
    model_cfg = model.cfg
    if cfg.rope_theta_full is not None:
        if cfg.stage is not Stage.CPT:
            raise TrainError("`rope_theta_full` applies to cpt")
        model_cfg = model_cfg.replace(full=dataclasses.replace(model_cfg.full, rope_theta=cfg.rope_theta_full))
    if cfg.seq_len and cfg.seq_len > model_cfg.max_seq_len:
        model_cfg = model_cfg.replace(max_seq_len=cfg.seq_len)
    if model_cfg != model.cfg:
        rebuilt = Transformer(model_cfg)
        rebuilt.load_state_dict(model.state_dict())
        model = rebuilt
    model.train()
    return model, tokenizer


def apply_freeze(model: Transformer, freeze: Freeze | None) -> list[str]:
    """Freeze the attention of the chosen layer types: its q, k, v, o projections and, with QK-norm, the query
    and key gains (they scale the same logits); returns the frozen parameter names."""
    if freeze is None:
        return []
    frozen = []
    for layer, block in enumerate(model.blocks):
        if block.attn.layer_type in Freeze(freeze).layer_types:
            norms = ("q_norm", "k_norm") if block.attn.cfg.qk_norm else ()
            for name in ("q_proj", "k_proj", "v_proj", "o_proj", *norms):
                param = getattr(block.attn, name).weight
                param.requires_grad_(False)
                frozen.append(f"blocks.{layer}.attn.{name}.weight")
    return frozen


def builtin_corpus(tokens_needed: int, seed: int, world: World, tokenizer: ByteTokenizer | HFTokenizer) -> Path:
    """The built-in corpus in ``tokenizer``'s ids, generated once per size bucket into the cache folder."""
    bucket = max(1 << 21, 1 << math.ceil(math.log2(max(tokens_needed, 1))))  # >= 2M tokens, power of two
    tag = "byte" if isinstance(tokenizer, ByteTokenizer) else "bpe-" + file_sha256(tokenizer.path)[:12]
    folder = cache_dir() / "corpus" / f"{tag}-seed{seed}-{bucket}"
    if world.is_main and not (folder / "manifest.json").is_file():
        synth(bucket, folder, tokenizer, seed=seed)
    if world.distributed:
        torch.distributed.barrier()
    return folder


class Source:
    """Items of the stage (packed sequences, or SFT examples) with their pad id, a description (part of
    the run's data identity: a resumed run must read the same batches) and the sampler that picks each
    step's items."""

    def __init__(self, items: PackedSequences | SftData, pad_id: int, describe: dict[str, Any], seed: int) -> None:
        self.items, self.pad_id, self._describe, self.seed = items, pad_id, describe, seed

    def describe(self) -> dict[str, Any]:
        return self._describe

    def batch(self, indices: np.ndarray) -> Batch:
        if isinstance(self.items, SftData):
            return collate([self.items[int(i)] for i in indices], self.pad_id)
        return collate([self.items.item(int(i)) for i in indices], self.pad_id)

    def micro_batches(self, step: int, rank: int, world: int, batch_size: int, micro: int) -> list[Batch]:
        """This process's part of step ``step``'s global batch, in micro-batches of ``micro`` items."""
        indices = Sampler(len(self.items), batch_size, self.seed).shard(step, rank, world)
        return [self.batch(indices[i : i + micro]) for i in range(0, len(indices), micro)]


def check_same_tokenizer(folder: Path, man, tokenizer: ByteTokenizer | HFTokenizer) -> None:
    """The data must have been tokenised by the tokenizer the model is trained with."""
    data_is_byte = man.tokenizer == "byte"
    if data_is_byte != isinstance(tokenizer, ByteTokenizer):
        raise DataError(
            f"{folder} was tokenised with {man.tokenizer!r} but the model uses {tokenizer.name!r}; "
            "prepare the data with the model's tokenizer"
        )
    want = man.extra.get("tokenizer_sha256")
    if want and isinstance(tokenizer, HFTokenizer):
        have = file_sha256(tokenizer.path)
        if have != want:
            raise DataError(
                f"{folder} was tokenised with a different tokenizer.json than {tokenizer.path} (SHA-256 "
                "differs); prepare the data with the model's tokenizer"
            )


def data_source(
    cfg: TrainConfig,
    seq_len: int,
    tokens_needed: int,
    tokenizer: ByteTokenizer | HFTokenizer | None,
    model_cfg: ModelConfig,
    world: World,
) -> tuple[Source | CurriculumSource, ByteTokenizer | HFTokenizer]:
    """The stage's items and the tokenizer (from the data manifest when not known yet)."""
    if cfg.stage is Stage.SFT:
        tok = tokenizer or _given_tokenizer(cfg)
        examples = load_jsonl(cfg.data) if cfg.data else builtin_examples(4096, seed=cfg.seed)
        sft = SftData(examples, tok, seq_len)
        desc = {"kind": "sft", "data": cfg.data or "builtin", "items": len(sft)}
        return Source(sft, sft.pad_id, desc, cfg.seed), tok
    folder = Path(cfg.data) if cfg.data else None
    if cfg.curriculum:
        curriculum = Curriculum.load(cfg.curriculum)
        tok = tokenizer or _given_tokenizer(cfg)
        if curriculum.prose and folder is None:  # prose rows from the built-in corpus
            folder = builtin_corpus(tokens_needed, cfg.seed, world, tok)
        prose = _packed(TokenData(folder), seq_len, tok, model_cfg) if folder else None
        return CurriculumSource(curriculum, tok, seq_len, cfg.seed, prose), tok
    if folder is None:
        tokenizer = tokenizer or _given_tokenizer(cfg)
        folder = builtin_corpus(tokens_needed, cfg.seed, world, tokenizer)
    data = TokenData(folder)
    man = data.manifest
    if tokenizer is None:
        tokenizer = open_tokenizer(cfg.tokenizer or man.tokenizer)
    seqs = _packed(data, seq_len, tokenizer, model_cfg)
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else man.eod_id
    desc = {"kind": "packed", "data": str(data.folder), "total_tokens": man.total_tokens, "items": len(seqs)}
    return Source(seqs, pad, desc, cfg.seed), tokenizer


def _given_tokenizer(cfg: TrainConfig) -> ByteTokenizer | HFTokenizer:
    """``cfg.tokenizer`` loaded, or the byte tokenizer (for data that brings no tokenizer of its own)."""
    return open_tokenizer(cfg.tokenizer) if cfg.tokenizer else ByteTokenizer()


def _packed(data: TokenData, seq_len: int, tokenizer: ByteTokenizer | HFTokenizer, model_cfg: ModelConfig):
    """``data`` as packed sequences, after checking it was tokenised by ``tokenizer`` within the vocabulary."""
    check_same_tokenizer(data.folder, data.manifest, tokenizer)
    if data.manifest.vocab_size > model_cfg.vocab_size:
        raise DataError(
            f"{data.folder} was tokenised with {data.manifest.vocab_size:,} ids but the model has "
            f"vocab_size={model_cfg.vocab_size:,}; prepare the data with the model's tokenizer"
        )
    return PackedSequences(data, seq_len)


def tokenizer_spec(tokenizer: ByteTokenizer | HFTokenizer) -> str:
    """How a run records its tokenizer: ``byte`` or the ``tokenizer.json`` path."""
    return "byte" if isinstance(tokenizer, ByteTokenizer) else str(tokenizer.path)


def tokenizer_sha256(tokenizer: ByteTokenizer | HFTokenizer) -> str | None:
    """The SHA-256 of the run's ``tokenizer.json`` (``None`` for the byte tokenizer): with :func:`tokenizer_spec`,
    what a step checkpoint records, so that exporting it later cannot pick up a file changed since."""
    return None if isinstance(tokenizer, ByteTokenizer) else file_sha256(tokenizer.path)
