"""Our checkpoints behind the :class:`~headprobe.hooked.base.HookedModel` interface."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from headprobe.hooked.base import HookedModel, ResidualHook
from headprobe.model.kv_cache import KVCache
from headprobe.model.seam import AttentionHook, Seam
from headprobe.model.tokenizer import ByteTokenizer, HFTokenizer
from headprobe.model.transformer import Transformer

TRAINING_ONLY = ("name", "max_seq_len", "init_std")  # config fields that do not change a forward pass


class HeadprobeModel(HookedModel):
    """A :class:`headprobe.model.transformer.Transformer` (usually loaded from a checkpoint folder)."""

    def __init__(
        self, model: Transformer, tokenizer: ByteTokenizer | HFTokenizer, name: str, folder: Path | None = None
    ) -> None:
        self.model, self.tokenizer, self.name, self.folder = model.eval(), tokenizer, name, folder
        self.stop_tokens = {} if tokenizer.eos_id is None else {tokenizer.eos_id: ("tokenizer",)}
        self.device = next(model.parameters()).device
        cfg = model.cfg
        self.layers = cfg.layer_infos()
        self.d_model, self.d_ff = cfg.d_model, cfg.d_ff
        self.max_positions = None  # RoPE has no table limit; cfg.max_seq_len is the trained length
        self.trained_length = cfg.max_seq_len
        self.prompt_start = []  # trained on packed documents without a BOS (see HookedModel.prompt_start)

    @property
    def seam(self) -> Seam:
        return self.model.seam

    @contextlib.contextmanager
    def _residual_hooks(self, residual: ResidualHook | None) -> Iterator[None]:
        if residual is None:
            yield
            return
        hooks = [("hook_embed", lambda x, hook: residual(-1, x))]
        hooks += [(f"blocks.{i}.hook_resid_post", lambda x, hook, i=i: residual(i, x)) for i in range(len(self.layers))]
        with self.model.hooks(fwd_hooks=hooks):
            yield

    @torch.no_grad()
    def run(self, input_ids: Tensor, hook: AttentionHook | None = None, residual: ResidualHook | None = None) -> None:
        hooking = self.model.hook(hook) if hook is not None else contextlib.nullcontext()
        with hooking, self._residual_hooks(residual):
            self.model(input_ids.to(self.device), last_only=True)

    @torch.no_grad()
    def logits(self, input_ids: Tensor) -> Tensor:
        return self.model(input_ids.to(self.device))

    def output_projection(self, layer: int) -> Tensor:
        return self.model.blocks[layer].attn.o_proj.weight

    def unembedding(self) -> Tensor:
        return self.model.lm_head.weight

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.model.parameters()

    @property
    def module(self) -> torch.nn.Module:
        return self.model

    def architecture(self) -> dict[str, Any]:
        config = dataclasses.asdict(self.model.cfg)
        return {k: v for k, v in config.items() if k not in TRAINING_ONLY}

    def copy(self, name: str) -> HeadprobeModel:
        twin = HeadprobeModel(copy.deepcopy(self.model), self.tokenizer, name, self.folder)
        twin.stop_tokens, twin.prompt_start = self.stop_tokens, list(self.prompt_start)
        return twin

    def _prefill(self, ids: Tensor) -> KVCache:
        cache = KVCache(self.model.cfg)
        if ids.shape[1]:
            self.model(ids, cache=cache, last_only=True)
        return cache

    def _stack(self, states: list[KVCache]) -> KVCache:
        return KVCache.stack(states)

    def _step(self, state: KVCache, token: Tensor, hook: AttentionHook | None) -> Tensor:
        with self.model.hook(hook) if hook else contextlib.nullcontext():
            return self.model(token, cache=state, last_only=True)
