"""``headprobe demo``: the built-in CPU default run (extended by later milestones into the toy study).

Today it builds every toy preset, runs a forward pass and greedy generation on a built-in text, checks
the KV-cache decode against full re-computation and measures each layer type's normalised attention
entropy with the streaming engine; ``headprobe demo`` prints that with the planner's tables.
"""

from __future__ import annotations

import time

import torch

from headprobe.metrics import attention_entropy
from headprobe.model.presets import list_presets, preset
from headprobe.model.tokenizer import ByteTokenizer
from headprobe.model.transformer import Transformer
from headprobe.probe import HeadprobeModel

DEMO_TEXT = (
    "The archivist kept a ledger of every key she was given. The key for the north door is 4471. "
    "Rain fell on the harbour while the ferries waited, and the town counted its lanterns. "
)


def _greedy_without_cache(model: Transformer, ids: torch.Tensor, n: int) -> torch.Tensor:
    seq = ids
    for _ in range(n):
        nxt = model(seq)[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
    return seq[:, ids.shape[1] :]


def run_demo(seq_len: int = 1024, new_tokens: int = 24, seed: int = 0) -> list[dict]:
    """One row per toy preset: parameters, loss, forward and decode speed, whether cached decoding equals
    full recomputation, a sample, and the normalised entropy of each layer type."""
    torch.manual_seed(seed)
    tok = ByteTokenizer()
    text = (DEMO_TEXT * (seq_len // len(DEMO_TEXT) + 1))[:seq_len]
    ids = torch.tensor([tok.encode(text)])
    results = []
    for name in list_presets("toy"):
        torch.manual_seed(seed)
        model = Transformer(preset(name)).eval()
        with torch.no_grad():
            t0 = time.perf_counter()
            logits = model(ids)
            fwd_s = time.perf_counter() - t0
            loss = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:]).item()
            prompt = ids[:, -200:]  # longer than the window (64): the cache has to drop keys
            t0 = time.perf_counter()
            gen = model.generate(prompt, new_tokens)
            gen_s = time.perf_counter() - t0
            same = torch.equal(gen, _greedy_without_cache(model, prompt, gen.shape[1]))
        entropy = attention_entropy(HeadprobeModel(model, tok, name), ids).groupby("layer_type")["norm_value"].mean()
        cfg = model.cfg
        results.append(
            dict(
                preset=name,
                params=model.num_params(),
                full=f"{cfg.full.n_heads} x {cfg.full.qk_head_dim}/{cfg.full.v_head_dim}",
                loss=loss,
                fwd_tokens_per_s=seq_len / fwd_s,
                decode_tokens_per_s=gen.shape[1] / gen_s,
                cache_matches=same,
                sample=tok.decode(gen[0].tolist()),
                norm_entropy_full=float(entropy["full"]),
                norm_entropy_sliding=float(entropy["sliding"]),
            )
        )

    if not all(r["cache_matches"] for r in results):
        raise RuntimeError("KV-cache decoding disagreed with full recomputation")
    return results
