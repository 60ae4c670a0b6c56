"""Grouped-query decode steps: the SDPA backend before and after it stopped expanding the KV cache.

    python benchmarks/gqa_decode.py [--lengths 1024,4096,8192] [--repeats 5] [--threads 1] [--no-write]

Before, ``SdpaBackend`` repeat-interleaved ``k``/``v`` from ``kv_heads`` to ``heads`` on every call, a
decode step included, so each step copied the whole cache ``heads / kv_heads`` times over. After, calls
other than a whole-sequence causal one fold each kv head's query heads into its query rows and read the
cache in place. ``old_sdpa`` below is the old backend, kept here only to be measured.

Shape: SmolLM2-135M's attention (9 query heads, 3 kv heads, width 64; 30 layers, d_model 576, d_ff 1536,
vocabulary 49,152; every layer full attention), batch 1, float32, on CPU. Measured, old and new
alternating in one process (median of ``--repeats`` each):

* ``attention``: one decode step of one layer (``q_len`` 1 against ``L`` cached keys, the cache a view of
  a buffer with spare room as :class:`headprobe.model.kv_cache.LayerCache` returns it), and a 4-query
  block after the cache;
* ``model step``: one whole decode step of a randomly initialised headprobe ``Transformer`` of that shape
  whose cache holds ``L`` random keys/values per layer (``last_only`` logits);
* ``prefill``: one whole-sequence call of one layer at 4,096 tokens, full causal and with a 512-key window,
  to show prefill did not get slower.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor

from headprobe.model import attention as attn_mod
from headprobe.model.attention import CausalMask, SdpaBackend, sdpa_kernel
from headprobe.model.config import AttentionConfig, Backend, ModelConfig
from headprobe.model.kv_cache import KVCache
from headprobe.model.transformer import Transformer

HEADS, KV_HEADS, DIM = 9, 3, 64


def smollm2_135m_shape() -> ModelConfig:
    att = AttentionConfig(n_heads=HEADS, qk_head_dim=DIM, v_head_dim=DIM, n_kv_heads=KV_HEADS, rope_dim=DIM)
    return ModelConfig(
        vocab_size=49_152, d_model=576, n_layers=30, d_ff=1536, swa=att, full=att, full_every=1, name="smollm2-135m"
    )


class OldSdpa(SdpaBackend):
    """``SdpaBackend`` as it was: ``k``/``v`` expanded to ``heads`` on every call."""

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: CausalMask, scale: float) -> Tensor:
        h = q.shape[1]
        k, v = k.repeat_interleave(h // k.shape[1], dim=1), v.repeat_interleave(h // v.shape[1], dim=1)
        qk_dim, v_dim = q.shape[-1], v.shape[-1]
        if v_dim != qk_dim and q.device.type == "cpu":
            n_chunks = -(-v_dim // qk_dim)
            v_pad = F.pad(v, (0, n_chunks * qk_dim - v_dim))
            outs = [self._banded(q, k, chunk, mask, scale) for chunk in v_pad.split(qk_dim, dim=-1)]
            return torch.cat(outs, dim=-1)[..., :v_dim]
        return self._banded(q, k, v, mask, scale)

    def _banded(self, q: Tensor, k: Tensor, v: Tensor, mask: CausalMask, scale: float) -> Tensor:
        with sdpa_kernel(attn_mod._FUSED_SDPA_CPU):
            q_len, k_len = q.shape[2], k.shape[2]
            if q_len == 1 and mask.covers(k_len):
                return F.scaled_dot_product_attention(q, k, v, scale=scale)
            if q_len == k_len and mask.covers(k_len):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
            offset = k_len - q_len
            outs = []
            for start in range(0, q_len, self.block_q):
                stop = min(q_len, start + self.block_q)
                lo, _ = mask.key_range(offset + start)
                hi = offset + stop
                q_pos = torch.arange(offset + start, offset + stop)[:, None]
                k_pos = torch.arange(lo, hi)[None, :]
                outs.append(
                    F.scaled_dot_product_attention(
                        q[:, :, start:stop],
                        k[:, :, lo:hi],
                        v[:, :, lo:hi],
                        attn_mask=mask.visible(q_pos, k_pos),
                        scale=scale,
                    )
                )
            return torch.cat(outs, dim=2)


OLD, NEW = OldSdpa(), attn_mod.BACKENDS[Backend.SDPA]  # before, and the backend as it is now


Timing = tuple[float, float, float, float]  # before median, after median, before best, after best


def side_by_side(old: Callable[[], object], new: Callable[[], object], repeats: int) -> Timing:
    """Median and best seconds of ``old`` and ``new``, called alternately (one warm-up each) so that the
    load of a shared machine falls on both alike."""
    times: dict[str, list[float]] = {"old": [], "new": []}
    old(), new()
    for _ in range(repeats):
        for name, fn in (("old", old), ("new", new)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    a, b = times["old"], times["new"]
    return statistics.median(a), statistics.median(b), min(a), min(b)


def cache_view(length: int, dim: int) -> Tensor:
    """``[1, kv_heads, length, dim]``: the first ``length`` entries of a buffer with 1/8 spare room."""
    return torch.randn(1, KV_HEADS, length + max(256, length // 8), dim)[:, :, :length]


def attention_rows(lengths: list[int], repeats: int) -> list[tuple[str, int, Timing]]:
    rows = []
    scale = DIM**-0.5
    for length in lengths:
        k, v = cache_view(length, DIM), cache_view(length, DIM)
        for q_len in (1, 4):
            q = torch.randn(1, q_len, HEADS, DIM).transpose(1, 2)  # as the model makes it
            mask = CausalMask(None)
            torch.testing.assert_close(NEW(q, k, v, mask, scale), OLD(q, k, v, mask, scale))
            timing = side_by_side(partial(OLD, q, k, v, mask, scale), partial(NEW, q, k, v, mask, scale), repeats * 4)
            rows.append((f"attention, one layer, q_len {q_len}", length, timing))
    return rows


def prefill_rows(length: int, repeats: int) -> list[tuple[str, int, Timing]]:
    rows = []
    q = torch.randn(1, length, HEADS, DIM).transpose(1, 2)
    k, v = torch.randn(1, KV_HEADS, length, DIM), torch.randn(1, KV_HEADS, length, DIM)
    for window in (None, 512):
        mask = CausalMask(window)
        timing = side_by_side(partial(OLD, q, k, v, mask, 0.125), partial(NEW, q, k, v, mask, 0.125), repeats)
        rows.append((f"prefill, one layer, {'full causal' if window is None else f'window {window}'}", length, timing))
    return rows


def model_rows(lengths: list[int], repeats: int) -> list[tuple[str, int, Timing]]:
    torch.manual_seed(0)
    cfg = smollm2_135m_shape()
    model = Transformer(cfg).eval()
    model.set_attention_backend(Backend.SDPA)
    rows = []
    token = torch.tensor([[7]])
    for length in lengths:
        cache = KVCache(cfg)
        for layer in cache.layers:  # buffers with spare room, as LayerCache grows them
            layer.k = torch.randn(1, KV_HEADS, length + max(256, length // 8), DIM)
            layer.v = torch.randn(1, KV_HEADS, length + max(256, length // 8), DIM)
            layer.length = length
        cache.position = length

        def step(backend: SdpaBackend, cache: KVCache = cache, length: int = length) -> None:
            attn_mod.BACKENDS[Backend.SDPA] = backend
            try:
                with torch.no_grad():
                    model(token, cache=cache, last_only=True)
            finally:
                attn_mod.BACKENDS[Backend.SDPA] = NEW
            for layer in cache.layers:  # drop the appended token: every step sees `length` cached keys
                layer.length = length
            cache.position = length

        timing = side_by_side(lambda s=step: s(OLD), lambda s=step: s(NEW), repeats)
        rows.append((f"model decode step ({cfg.n_layers} layers)", length, timing))
    return rows


def fmt(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms" if seconds < 1 else f"{seconds:,.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="1024,4096,8192")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (default 1: steady timings on a shared machine)"
    )
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from _report import machine, publish, today

    lengths = [int(x) for x in args.lengths.split(",")]
    load = os.getloadavg()[0]  # other jobs on a shared machine
    t0 = time.perf_counter()
    rows = attention_rows(lengths, args.repeats) + model_rows(lengths, args.repeats)
    rows += prefill_rows(min(4096, max(lengths)), args.repeats)
    took = time.perf_counter() - t0
    lines = [
        f"## Grouped-query decode steps: KV cache read in place — {today()}",
        "",
        f"Machine: {machine()}. Command: `python benchmarks/gqa_decode.py --lengths {args.lengths} "
        f"--repeats {args.repeats} --threads {args.threads}` ({took:.0f} s).",
        "SmolLM2-135M's attention shape (9 query heads, 3 kv heads, width 64; the model rows: 30 layers,",
        "d_model 576, random weights), batch 1, float32, SDPA backend. *before*: `k`/`v` repeat-interleaved",
        "to 9 heads on every call; *after*: query heads folded into each kv head's rows, the cache read in",
        f"place. Old and new run alternately, {args.repeats} times each (4x that for single layers); median",
        f"and best of them. Load average {load:.1f} at the start (other jobs shared the machine).",
        "",
        "| what | L (cached tokens; prefill: sequence) | before, median | after, median | before / after |"
        " before, best | after, best | before / after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for what, length, (old, new, old_best, new_best) in rows:
        lines.append(
            f"| {what} | {length:,} | {fmt(old)} | {fmt(new)} | **{old / new:.2f}×** | {fmt(old_best)} | "
            f"{fmt(new_best)} | {old_best / new_best:.2f}× |"
        )
    publish("gqa-decode", lines, not args.no_write)


if __name__ == "__main__":
    main()
