"""The independent references the tests hold headprobe to: dense float64 implementations written from
the definitions, one copy each. Nothing here calls the code under test.

* :func:`visible` the window convention, from its words (query i sees keys i-W+1 .. i).
* :func:`loop_attention` attention one query at a time.
* :func:`dense_probs` the full attention-probability matrix.
* :func:`dense_stats` every streaming statistic from that matrix.
* :func:`complex_rope` RoPE as multiplication by complex phases.
* :func:`dense_forward` the whole model written out from its weights.
* :func:`dense_forced` the teacher-forced copy score, its set form and forced mass of a byte-level needle prompt.
* :func:`dense_entropy_per_head` mean attention entropy per head from cached post-RoPE q/k.
* :func:`pooled_reference` an attention map pooled into blocks, as the explorer defines its pixels.
* :func:`param_count` a model's distinct parameters, counted from the tensors themselves.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def visible(q_len: int, k_len: int, window: int | None) -> Tensor:
    """``[q_len, k_len]`` bool: query ``i`` sits at key position ``k_len - q_len + i`` and sees key ``j``
    when ``j <= pos`` and, with a window, ``pos - j < window``."""
    i = torch.arange(k_len - q_len, k_len)[:, None]
    j = torch.arange(k_len)[None, :]
    seen = j <= i
    return seen & (i - j < window) if window is not None else seen


def loop_attention(q: Tensor, k: Tensor, v: Tensor, window: int | None, scale: float) -> Tensor:
    """Attention written one query at a time from the convention's words, in float64.

    Query i of Lq sits at key position Lk - Lq + i and sees the keys j with
    position - window < j <= position (all j <= position when window is None).
    q: [B, H, Lq, D], k: [B, Hkv, Lk, D], v: [B, Hkv, Lk, Dv].
    """
    b, h, lq, _ = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    out = torch.zeros(b, h, lq, v.shape[-1], dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            kv = hi // (h // hkv)
            for i in range(lq):
                pos = lk - lq + i
                first = 0 if window is None else max(0, pos - window + 1)
                keys = list(range(first, pos + 1))
                s = torch.tensor(
                    [float(q[bi, hi, i].double() @ k[bi, kv, j].double()) * scale for j in keys],
                    dtype=torch.float64,
                )
                p = torch.exp(s - s.max())
                p = p / p.sum()
                out[bi, hi, i] = sum(p[n] * v[bi, kv, j].double() for n, j in enumerate(keys))
    return out


def dense_probs(q: Tensor, k: Tensor, window: int | None, scale: float) -> Tensor:
    """Attention probabilities ``[b, h, q_len, k_len]`` in float64 (query head ``h`` reads key head
    ``h // (heads // kv_heads)``; invisible keys get probability 0)."""
    q, k = q.double(), k.double()
    kk = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = (q @ kk.transpose(-1, -2)) * scale
    s = s.masked_fill(~visible(q.shape[2], k.shape[2], window), -math.inf)
    return torch.softmax(s, -1)


def entropy_of(p: Tensor) -> Tensor:
    """``-sum p log p`` over the last dim (0 log 0 = 0)."""
    return -(torch.where(p > 0, p * torch.log(p), torch.zeros_like(p))).sum(-1)


def dense_stats(
    q: Tensor, k: Tensor, window: int | None, scale: float, rows: Tensor, spans: list[tuple[int, int]], topk: int
) -> dict[str, Tensor]:
    """Every statistic of ``headprobe.stats.attention_stats`` from the full probability matrix."""
    lq, lk = q.shape[2], k.shape[2]
    q, k = q.double(), k.double()
    kk = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    vis = visible(lq, lk, window)
    s = ((q @ kk.transpose(-1, -2)) * scale).masked_fill(~vis, -math.inf)[:, :, rows]
    p = torch.softmax(s, -1)
    pos = (rows + lk - lq).double()
    n_vis = vis[rows].sum(-1).double()
    ent = entropy_of(p)
    j = torch.arange(lk)[None, :].double()
    return {
        "lse": torch.logsumexp(s, -1),
        "entropy": ent,
        "norm_entropy": torch.where(n_vis > 1, ent / torch.log(n_vis.clamp(min=2)), torch.zeros_like(ent)),
        "max_prob": p.max(-1).values,
        "argmax": torch.stack([torch.nonzero(row == row.max())[0, 0] for row in s.reshape(-1, lk)]).reshape(
            s.shape[:-1]
        ),
        "mean_distance": (p * (pos[:, None] - j)).sum(-1),
        "span_mass": torch.stack([p[..., a:z].sum(-1) for a, z in spans], -1)
        if spans
        else p[..., :0].sum(-1, keepdim=True)[..., :0],
        "topk_prob": p.topk(topk, -1).values,
    }


def complex_rope(x: Tensor, positions: Tensor, rope_dim: int, theta: float) -> Tensor:
    """Pair (a_i, b_i) = (x[i], x[i + r/2]) is the complex number a_i + i b_i, multiplied by
    exp(i * pos * theta^(-2i/r)); dims >= r are untouched. x: [batch, seq, heads, dim] float64."""
    half = rope_dim // 2
    z = torch.complex(x[..., :half], x[..., half:rope_dim])
    freqs = theta ** (-2 * torch.arange(half, dtype=torch.float64) / rope_dim)
    phase = torch.polar(torch.ones(len(positions), half, dtype=torch.float64), positions[:, None] * freqs)
    z = z * phase[None, :, None, :]
    return torch.cat([z.real, z.imag, x[..., rope_dim:]], dim=-1)


def dense_forward(model, ids: Tensor) -> Tensor:
    """The architecture written out densely in float64 from the weights, with its own masks and RoPE."""
    cfg = model.cfg
    w = {k: v.double() for k, v in model.state_dict().items()}
    b, n = ids.shape
    pos = torch.arange(n, dtype=torch.float64)

    def rms(x, weight):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + cfg.norm_eps) * weight

    x = w["embed.weight"][ids]
    for layer in range(cfg.n_layers):
        att = cfg.full if (layer + 1) % cfg.full_every == 0 else cfg.swa
        p = f"blocks.{layer}."
        h = rms(x, w[p + "ln1.weight"])
        q = (h @ w[p + "attn.q_proj.weight"].T).view(b, n, att.n_heads, att.qk_head_dim)
        k = (h @ w[p + "attn.k_proj.weight"].T).view(b, n, att.kv_heads, att.qk_head_dim)
        v = (h @ w[p + "attn.v_proj.weight"].T).view(b, n, att.kv_heads, att.v_head_dim)
        if att.qk_norm:  # each head over its own dims, before RoPE
            q, k = rms(q, w[p + "attn.q_norm.weight"]), rms(k, w[p + "attn.k_norm.weight"])
        if att.rope_dim:
            q = complex_rope(q, pos, att.rope_dim, att.rope_theta)
            k = complex_rope(k, pos, att.rope_dim, att.rope_theta)
        # the softmax scale as docs/model.md states it, not read from the config's own property
        scale = att.qk_head_dim**-0.5 if att.qk_norm_scale is None else att.qk_norm_scale / att.qk_head_dim
        probs = dense_probs(q.transpose(1, 2), k.transpose(1, 2), att.window, scale)
        vv = v.transpose(1, 2).repeat_interleave(att.n_heads // att.kv_heads, dim=1)
        z = (probs @ vv).transpose(1, 2).reshape(b, n, att.n_heads * att.v_head_dim)
        x = x + z @ w[p + "attn.o_proj.weight"].T
        h = rms(x, w[p + "ln2.weight"])
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        x = x + ((gate * torch.sigmoid(gate)) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    x = rms(x, w["ln_final.weight"])
    head = w["embed.weight"] if cfg.tie_embeddings else w["lm_head.weight"]
    return x @ head.T


def dense_entropy_per_head(model, ids: Tensor) -> dict[int, Tensor]:
    """Mean entropy per head (over batch and positions) from dense float64 probabilities built from the
    model's cached post-RoPE q/k: ``{layer: [heads]}``."""
    _, cache = model.run_with_cache(ids)
    out = {}
    for layer in range(model.cfg.n_layers):
        att = model.cfg.attention(layer)
        q = cache[f"blocks.{layer}.attn.hook_rot_q"].transpose(1, 2)
        k = cache[f"blocks.{layer}.attn.hook_rot_k"].transpose(1, 2)
        out[layer] = entropy_of(dense_probs(q, k, att.window, att.qk_head_dim**-0.5)).mean((0, 2))
    return out


def pooled_reference(p: torch.Tensor, rows: tuple[int, int], keys: tuple[int, int], block: int) -> torch.Tensor:
    """``p [L, L]`` pooled by the explorer's definition, written out: the mean over each query block's
    rows of the summed probabilities of each key block (partial blocks: the rows and keys that exist)."""
    (r0, r1), (k0, k1) = rows, keys
    out = torch.zeros(math.ceil((r1 - r0) / block), math.ceil((k1 - k0) / block), dtype=torch.float64)
    for a in range(out.shape[0]):
        qs = range(r0 + a * block, min(r1, r0 + (a + 1) * block))
        for b in range(out.shape[1]):
            ks = slice(k0 + b * block, min(k1, k0 + (b + 1) * block))
            out[a, b] = sum(float(p[i, ks].sum()) for i in qs) / len(qs)
    return out


def param_count(model: torch.nn.Module) -> int:
    """The model's distinct parameters: every tensor's elements, a tied weight once (``parameters()`` yields
    each shared tensor once)."""
    return sum(p.numel() for p in model.parameters())


def dense_forced(model, prompt, reach: int = 0) -> tuple[dict, dict, dict]:
    """Per (layer, head): the teacher-forced copy score, its set form and the mean forced mass (on the span and the
    ``reach`` prompt tokens after it), from dense float64
    attention probabilities of the post-RoPE q/k that TransformerLens caches (not the seam's hook). Byte-level:
    the forced answer is ``" " + answer`` (the prompt ends in ``is``), its answer steps the answer's bytes, so step
    ``t`` (answer byte ``t``) is the row at ``len(prompt) + t``."""
    answer = list(prompt.needle.answer.encode())
    ids = [*prompt.ids, ord(" "), *answer[:-1]]
    rows = [prompt.length + t for t in range(len(answer))]
    start, end = prompt.answer_start, prompt.answer_end
    _, cache = model.model.run_with_cache(torch.tensor([ids]))
    value, set_value, mass = {}, {}, {}
    cfg = model.model.cfg
    for layer in range(cfg.n_layers):
        att = cfg.attention(layer)
        q = cache[f"blocks.{layer}.attn.hook_rot_q"].transpose(1, 2)
        k = cache[f"blocks.{layer}.attn.hook_rot_k"].transpose(1, 2)
        p = dense_probs(q, k, att.window, att.qk_head_dim**-0.5)[0]  # [heads, L, L] float64
        for h in range(att.n_heads):
            copied = []
            for t, row in enumerate(rows):
                j = int(torch.argmax(p[h, row]))  # the first of equal maxima
                if start <= j < end and prompt.ids[j] == answer[t]:
                    copied.append(j)
            value[layer, h] = len(copied) / (end - start)
            set_value[layer, h] = len(set(copied)) / (end - start)
            read = min(end + reach, prompt.length)
            mass[layer, h] = sum(float(p[h, row, start:read].sum()) for row in rows) / len(rows)
    return value, set_value, mass
