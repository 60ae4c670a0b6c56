"""Narrow sliding windows without gradients: SDPA's blocks against local blocks, side by side in one run.

    python benchmarks/local_blocks.py [--no-write]

* one attention layer (float32, forward): SDPA on blocks of 256 queries against their band (what every
  window took before), and :func:`headprobe.model.attention.local_blocks`, at several lengths and windows;
* a toy model's whole forward pass (toy-d64, window 8, no gradients: an analysis or RULER prefill) with
  local blocks off (``LOCAL_MAX_WINDOW = 0``) and on, alternating.

Training keeps SDPA's kernel (:func:`headprobe.model.attention.local_applies`). Results go to
docs/benchmarks.md (section ``local-blocks``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def seconds(fn, repeats: int = 5) -> float:
    times = []
    for i in range(repeats + 2):
        t0 = time.perf_counter()
        fn()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def layer_rows(lengths=(512, 4096, 16384), widths=(8, 16, 32, 64, 128)) -> list[str]:
    from headprobe.model.attention import BACKENDS, local_blocks
    from headprobe.model.config import Backend
    from headprobe.model.masks import CausalMask

    sdpa = BACKENDS[Backend.SDPA]
    rows = []
    for length in lengths:
        shape = (4, 4, length, 32) if length <= 512 else (1, 4, length, 32)
        q, k, v = (torch.randn(shape) for _ in range(3))
        cells = []
        for w in widths:
            mask = CausalMask(w)
            with torch.no_grad():
                blocks = seconds(lambda m=mask, q=q, k=k, v=v: sdpa._banded(q, k, v, m, 32**-0.5))
                local = seconds(lambda m=mask, q=q, k=k, v=v: local_blocks(q, k, v, m, 32**-0.5))
            cells.append(f"{blocks * 1e3:.1f} / {local * 1e3:.1f} ms = {blocks / local:.2f}x")
        rows.append(f"| {length:,} ({shape[0]} x {shape[1]} heads x 32) | " + " | ".join(cells) + " |")
    return rows


def model_rows(lengths=(4096, 16384), rounds: int = 3) -> list[str]:
    import headprobe.model.attention as attention
    from headprobe.model.presets import preset
    from headprobe.model.transformer import Transformer

    torch.manual_seed(0)
    model = Transformer(preset("toy-d64")).eval()
    rows = []
    for length in lengths:
        ids = torch.randint(0, 4096, (1, length))
        times: dict[str, list[float]] = {"off": [], "on": []}
        outs = {}
        for _ in range(rounds):
            for variant, limit in (("off", 0), ("on", 32)):
                attention.LOCAL_MAX_WINDOW = limit
                with torch.no_grad():
                    times[variant].append(seconds(lambda ids=ids: model(ids, last_only=True), repeats=2))
                    outs[variant] = model(ids, last_only=True)
        attention.LOCAL_MAX_WINDOW = 32
        off, on = (statistics.median(times[v]) for v in ("off", "on"))
        diff = (outs["off"] - outs["on"]).abs().max().item()
        rows.append(f"| {length:,} | {off:.3f} | {on:.3f} | {off / on:.2f}x | {diff:.1e} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    from _report import machine, publish, today

    torch.set_num_threads(1)
    widths = (8, 16, 32, 64, 128)
    lines = [
        f"## Narrow sliding windows: local blocks — {today()}",
        "",
        f"Machine: {machine()}; one torch thread. Command: `python benchmarks/local_blocks.py`.",
        "",
        "One attention layer, float32, forward without gradients, median of 5: SDPA on blocks of 256 queries",
        "against their band / local blocks, and the ratio (above 1: local blocks faster).",
        "",
        "| length (batch x heads x dim) | " + " | ".join(f"window {w}" for w in widths) + " |",
        "|---|" + "---:|" * len(widths),
        *layer_rows(widths=widths),
        "",
        "toy-d64's whole forward pass (window 8 in its two sliding layers; batch 1, no gradients), local blocks",
        "off and on, alternating over 3 rounds; the largest difference of the last position's logits.",
        "",
        "| tokens | off, s | on, s | speed-up | max logit difference |",
        "|---:|---:|---:|---:|---:|",
        *model_rows(),
    ]
    publish("local-blocks", lines, not args.no_write)


if __name__ == "__main__":
    main()
