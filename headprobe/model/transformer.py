"""The head-shape Transformer: a decoder-only LM whose layer types have their own attention shapes.

    x = embed(ids)                                   hook_embed
    for each block l:                                blocks.{l}.hook_resid_pre
        x = x + o(attn(rope(q(ln1 x)), rope(k(ln1 x)), v(ln1 x)))     .hook_attn_out, .hook_resid_mid
        x = x + down(silu(gate(ln2 x)) * up(ln2 x))                  .hook_mlp_out, .hook_resid_post
    logits = lm_head(ln_final x)                     ln_final.hook_normalized

Attention hooks (``blocks.{l}.attn.``) use TransformerLens' layout ``[batch, pos, heads, dim]``:
``hook_q``/``hook_k`` (``qk_head_dim``; with ``qk_norm``, after each head is RMS-normalised:
``q = q_norm(q(ln1 x))``), ``hook_v`` (``v_head_dim``), ``hook_rot_q``/``hook_rot_k`` (after RoPE) and
``hook_z`` (per-head output before the o projection). There is **no**
``hook_pattern``: no dense attention pattern is ever computed, at any length. Instead every
attention layer passes its post-RoPE queries and keys, with its window and scale, through the model's
:class:`~headprobe.model.seam.Seam` (:meth:`Transformer.hook`), where streaming analyses compute exact
statistics.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint
from transformer_lens.hook_points import HookPoint
from transformer_lens.HookedRootModule import HookedRootModule

from headprobe.model.config import AttentionConfig, Backend, LayerType, ModelConfig
from headprobe.model.decoding import greedy
from headprobe.model.kv_cache import KVCache
from headprobe.model.masks import KeyPadding
from headprobe.model.rope import Rotary
from headprobe.model.seam import AttentionCall, AttentionHook, Seam

RECOMPUTE_LOGITS = 1 << 25  # logits per loss chunk (128 MiB in float32) above which backward recomputes them


class LossSums(NamedTuple):
    """The training loss of a forward pass with targets: the float32 sum of the counted targets'
    cross-entropies, and how many of them the greedy (argmax) prediction gets right."""

    loss: Tensor
    correct: Tensor


class RMSNorm(nn.Module):
    """``x / rms(x) * weight`` over the last dim, computed in float32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.hook_normalized = HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        work = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        y = x.to(work)
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.hook_normalized(y.to(x.dtype) * self.weight)


class Attention(nn.Module):
    """Multi-head (grouped-query) causal attention with its own query/key and value widths."""

    def __init__(
        self, layer: int, layer_type: LayerType, att: AttentionConfig, d_model: int, seam: Seam, eps: float = 1e-6
    ) -> None:
        super().__init__()
        self.layer, self.layer_type, self.cfg, self.seam = layer, layer_type, att, seam
        h, hkv = att.n_heads, att.kv_heads
        self.q_proj = nn.Linear(d_model, h * att.qk_head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, hkv * att.qk_head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, hkv * att.v_head_dim, bias=False)
        self.o_proj = nn.Linear(h * att.v_head_dim, d_model, bias=False)
        if att.qk_norm:  # over each head's qk_head_dim dims, one gain per dim shared by the heads
            self.q_norm, self.k_norm = RMSNorm(att.qk_head_dim, eps), RMSNorm(att.qk_head_dim, eps)
        self.rotary = Rotary(att.rope_dim, att.rope_theta)
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_rot_q, self.hook_rot_k = HookPoint(), HookPoint()
        self.hook_z = HookPoint()

    def forward(self, x: Tensor, position: int = 0, cache: KVCache | None = None) -> Tensor:
        """``x: [batch, seq, d_model]`` at absolute positions ``position ..`` -> ``[batch, seq, d_model]``."""
        att = self.cfg
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, att.n_heads, att.qk_head_dim)
        k = self.k_proj(x).view(b, n, att.kv_heads, att.qk_head_dim)
        if att.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.hook_q(q), self.hook_k(k)  # as attention uses them (normalised with qk_norm), before RoPE
        v = self.hook_v(self.v_proj(x).view(b, n, att.kv_heads, att.v_head_dim))
        pad = None if cache is None else cache.pad  # left padding of a batched decode (headprobe.model.kv_cache)
        offset = position if pad is None else position - pad  # each row's own positions
        q = self.hook_rot_q(self.rotary(q, offset=offset))
        k = self.hook_rot_k(self.rotary(k, offset=offset))
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [batch, heads, seq, dim]
        if cache is not None:
            k, v = cache[self.layer].update(k, v)
        key_start = position + n - k.shape[2]
        call = AttentionCall(
            layer=self.layer,
            layer_type=self.layer_type,
            q=q,
            k=k,
            window=att.window,
            scale=att.scale,
            key_start=key_start,
            padding=None if pad is None else KeyPadding.of_call(pad, key_start),
        )
        z = self.seam(call, v)
        z = self.hook_z(z.transpose(1, 2))  # [batch, seq, heads, v_dim]
        return self.o_proj(z.reshape(b, n, att.n_heads * att.v_head_dim))


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm residual block: attention, then SwiGLU MLP."""

    def __init__(self, layer: int, cfg: ModelConfig, seam: Seam) -> None:
        super().__init__()
        self.ln1 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(layer, cfg.layer_type(layer), cfg.attention(layer), cfg.d_model, seam, cfg.norm_eps)
        self.ln2 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.d_model, cfg.d_ff)
        self.hook_resid_pre, self.hook_resid_mid, self.hook_resid_post = HookPoint(), HookPoint(), HookPoint()
        self.hook_attn_out, self.hook_mlp_out = HookPoint(), HookPoint()

    def forward(self, x: Tensor, position: int = 0, cache: KVCache | None = None) -> Tensor:
        x = self.hook_resid_pre(x)
        x = self.hook_resid_mid(x + self.hook_attn_out(self.attn(self.ln1(x), position, cache)))
        return self.hook_resid_post(x + self.hook_mlp_out(self.mlp(self.ln2(x))))


class Transformer(HookedRootModule):
    """The model. ``Transformer(cfg)(input_ids [batch, seq]) -> logits [batch, seq, vocab]``.

    A TransformerLens ``HookedRootModule``: ``run_with_hooks``, ``run_with_cache`` and ``hooks()``
    work with the hook names listed in the module docstring.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.hook_embed = HookPoint()
        self.seam = Seam()  # every layer's attention calls pass here (headprobe.model.seam)
        self.blocks = nn.ModuleList(Block(i, cfg, self.seam) for i in range(cfg.n_layers))
        self.ln_final = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.activation_checkpointing = False  # recompute each block in backward (training memory)
        self.reset_parameters()
        self.setup()

    def reset_parameters(self) -> None:
        """Normal(0, init_std) weights; residual-output projections scaled by ``1/sqrt(2*n_layers)``; norm gains 1."""
        std = self.cfg.init_std
        for name, p in self.named_parameters():
            if name.endswith(("ln1.weight", "ln2.weight", "q_norm.weight", "k_norm.weight")) or name.startswith(
                "ln_final"
            ):
                nn.init.ones_(p)
            elif name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                nn.init.normal_(p, std=std / math.sqrt(2 * self.cfg.n_layers))
            else:
                nn.init.normal_(p, std=std)

    # -- forward ---------------------------------------------------------------------------
    def forward(
        self,
        input_ids: Tensor,
        cache: KVCache | None = None,
        last_only: bool = False,
        targets: Tensor | None = None,
        loss_mask: Tensor | None = None,
        loss_chunk: int = 8192,
        count_correct: bool = False,
    ) -> Tensor | LossSums:
        """Logits ``[batch, seq, vocab]`` (``[batch, 1, vocab]`` with ``last_only``), or with ``targets``
        the summed next-token loss (with ``count_correct``, :class:`LossSums`: also how many counted
        targets the greedy prediction gets right).

        Args:
            input_ids: ``[batch, seq]`` token ids.
            cache: when given, ``input_ids`` continue the cached sequence; the cache is updated.
            last_only: project only the last position to the vocabulary (saves ``seq * vocab`` memory).
            targets: ``[batch, seq]`` target ids; the result is then the float32 sum of cross-entropies
                over positions where ``loss_mask`` (``[batch, seq]`` bool, default all) is true; only
                those positions reach the LM head. Logits are made ``loss_chunk`` positions at a time and,
                when a chunk holds more than ``RECOMPUTE_LOGITS`` of them, recomputed in backward, so a
                262K-token sequence never holds ``seq x vocab`` logits.
        """
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, seq], got shape {tuple(input_ids.shape)}")
        position = 0 if cache is None else cache.position
        x = self.hook_embed(self.embed(input_ids))
        recompute = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        for block in self.blocks:
            # with recomputation, hooks inside the block fire again during the backward pass
            x = checkpoint(block, x, position, cache, use_reentrant=False) if recompute else block(x, position, cache)
        if cache is not None:
            cache.position += input_ids.shape[1]
        x = self.ln_final(x)
        if targets is not None:
            sums = self._loss_sum(x, targets, loss_mask, loss_chunk)
            return sums if count_correct else sums.loss
        if last_only:
            x = x[:, -1:]
        return self.lm_head(x)

    def _loss_sum(self, x: Tensor, targets: Tensor, mask: Tensor | None, chunk: int) -> LossSums:
        flat_x, flat_t = x.flatten(0, 1), targets.flatten()
        if mask is not None:  # only counted positions reach the LM head (most of a retrieval task's are context)
            keep = mask.flatten()
            flat_x, flat_t = flat_x[keep], flat_t[keep]
        total = x.new_zeros((), dtype=torch.float32)
        correct = torch.zeros((), dtype=torch.long, device=x.device)
        # a chunk's logits are recomputed in backward only when keeping them would cost memory (a
        # small model's few million logits are cheaper to keep than to make twice)
        recompute = torch.is_grad_enabled() and flat_x.requires_grad and chunk * self.cfg.vocab_size > RECOMPUTE_LOGITS
        # with nothing counted, one empty chunk: a zero loss that still has a graph to backpropagate
        for start in range(0, max(flat_t.numel(), 1), chunk):
            part = (flat_x[start : start + chunk], flat_t[start : start + chunk])
            if recompute:
                loss, right = checkpoint(self._chunk_loss, *part, use_reentrant=False)
            else:
                loss, right = self._chunk_loss(*part)
            total, correct = total + loss, correct + right
        return LossSums(total, correct)

    def _chunk_loss(self, x: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """``x: [n, d_model]``, ``targets: [n]`` -> (float32 summed cross-entropy, greedy hits)."""
        logits = self.lm_head(x).float()
        loss = F.cross_entropy(logits, targets, reduction="sum")
        # greedy hit: the target's logit is the row's maximum (amax is several times faster than argmax
        # on CPU; a tie, which float logits all but never have, counts as a hit)
        with torch.no_grad():
            right = (logits.gather(1, targets[:, None])[:, 0] >= logits.amax(-1)).sum()
        return loss, right

    @torch.no_grad()
    def generate(
        self, input_ids: Tensor | list[Tensor], max_new_tokens: int, stop_ids: list[int] | None = None
    ) -> Tensor:
        """Greedy decoding with a KV cache: one prefill pass, then one token per step.

        Args:
            input_ids: prompt ``[batch, seq]``, or a list of prompts ``[1, seq_i]`` of different lengths:
                each is prefilled on its own, then the caches are left-padded into one
                (:meth:`KVCache.stack`) and all rows decode together.
            max_new_tokens: upper bound on generated tokens.
            stop_ids: a row is finished once it emits one of these (the stop token is included).

        Returns:
            ``[batch, n_new]`` new token ids, ``n_new <= max_new_tokens``; it ends early once every
            row is finished. A row that finished before the others is padded with its stop token.
        """
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        prompts = input_ids if isinstance(input_ids, list) else [input_ids]
        caches = [KVCache(self.cfg) for _ in prompts]
        first = torch.cat(
            [self(p, cache=c, last_only=True)[:, -1] for p, c in zip(prompts, caches, strict=True)]
        ).argmax(-1)
        cache = caches[0] if len(caches) == 1 else KVCache.stack(caches)
        step = lambda ids: self(ids, cache=cache, last_only=True)[:, -1].argmax(-1)  # noqa: E731
        rows = greedy(first, step, max_new_tokens, stop_ids)
        width = max(map(len, rows))
        return torch.tensor([row + row[-1:] * (width - len(row)) for row in rows], device=first.device)

    # -- utilities -------------------------------------------------------------------------
    def set_attention_backend(self, backend: Backend | str) -> None:
        """Backend for every attention layer (``auto``, ``sdpa``, ``flex``, ``flash``, ``triton``, ``reference``)."""
        self.seam.backend = Backend(backend)

    def hook(self, fn: AttentionHook) -> AbstractContextManager[None]:
        """Call ``fn(AttentionCall)`` at every attention layer while the context is open; always removed.

        This is the model's :class:`~headprobe.model.seam.Seam`: post-RoPE queries and keys pass by
        with the layer's window and scale before attention is computed; the analysis package builds
        its streaming statistics on it.
        """
        return self.seam.attach(fn)
