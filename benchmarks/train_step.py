"""The toy pretraining step before and after a speed-up, side by side in one run.

    python benchmarks/train_step.py [--steps 40] [--rounds 2] [--presets toy-d64,toy-d16] [--no-write]

The step is the toy recipe's (``trainer/configs/toy.json``, pt: 4 x 512 tokens of the toy-pt curriculum, the
built-in 4,096-id BPE, one thread) run by the trainer itself; its time is the median of the logged
``step_time_s`` after the first two steps. Each variant trains in its own process, the variants alternating
(``--rounds`` times each), so that both see the same machine state.

Variants:

* ``sdpa-blocks``: sliding windows run as SDPA's fused kernel on blocks of 256 queries against their key band
  (what every window took before local blocks);
* ``local-blocks``: windows of at most ``LOCAL_MAX_WINDOW`` keys run as local blocks
  (:func:`headprobe.model.attention.local_blocks`; the toys' window is 8).

Results go to docs/benchmarks.md (section ``train-step``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

VARIANTS = ("sdpa-blocks", "local-blocks")


def run(variant: str, preset: str, steps: int) -> dict:
    import headprobe.model.attention as attention
    from trainer.config import TrainConfig
    from trainer.train import train

    if variant == "sdpa-blocks":
        attention.LOCAL_MAX_WINDOW = 0
    recipe = Path(__file__).resolve().parents[1] / "trainer" / "configs"
    with tempfile.TemporaryDirectory() as tmp:
        train(
            TrainConfig(
                preset=preset,
                out=tmp,
                steps=steps,
                batch_size=4,
                seq_len=512,
                curriculum=str(recipe / "curricula" / "toy-pt.json"),
                tokenizer="toy",
                lr=3e-3,
                warmup_steps=5,
                threads=1,
                progress=False,
            )
        )
        rows = [json.loads(x) for x in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    return {"step_s": statistics.median(r["step_time_s"] for r in rows[2:]), "loss": rows[-1]["loss"]}


def windows(lengths: tuple[int, ...] = (512, 4096), widths: tuple[int, ...] = (8, 16, 32, 64, 128)) -> list[str]:
    """Sliding-window attention alone, forward and backward: SDPA's blocks against local blocks (rows of a
    table: the ratio of their times, above 1 where local blocks are faster)."""
    import time

    import torch

    from headprobe.model.attention import BACKENDS, local_blocks
    from headprobe.model.config import Backend
    from headprobe.model.masks import CausalMask

    torch.set_num_threads(1)
    sdpa = BACKENDS[Backend.SDPA]

    def seconds(fn, shape: tuple[int, ...], repeats: int = 5) -> float:
        q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
        times = []
        for i in range(repeats + 2):
            t0 = time.perf_counter()
            fn(q, k, v).sum().backward()
            if i >= 2:
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    rows = []
    for length in lengths:
        shape = (4, 4, length, 32) if length <= 512 else (1, 4, length, 32)
        cells = []
        for w in widths:
            mask = CausalMask(w)
            blocks = seconds(lambda q, k, v, m=mask: sdpa._banded(q, k, v, m, 32**-0.5), shape)
            local = seconds(lambda q, k, v, m=mask: local_blocks(q, k, v, m, 32**-0.5), shape)
            cells.append(f"{blocks * 1e3:.1f} / {local * 1e3:.1f} ms = {blocks / local:.2f}x")
        rows.append(f"| {length:,} ({' x '.join(map(str, shape[:2]))} heads x 32) | " + " | ".join(cells) + " |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--presets", default="toy-d64,toy-d16")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.child:
        variant, preset, steps = json.loads(args.child)
        print(json.dumps(run(variant, preset, steps)))
        return

    from _report import machine, run_child, today, write_section

    lines = [
        f"## Toy training step, before and after — {today()}",
        "",
        f"Machine: {machine()}. Command: `python benchmarks/train_step.py --steps {args.steps} --rounds "
        f"{args.rounds}`. The toy recipe's pt step (4 x 512 tokens, toy-pt curriculum, one thread) by the trainer;",
        "median `step_time_s` of each process, then the median over the rounds; the variants alternate.",
        "",
        "| preset | sdpa-blocks s/step | local-blocks s/step | speed-up | last loss (equal: same numbers) |",
        "|---|---:|---:|---:|---|",
    ]
    for preset in args.presets.split(","):
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        losses: dict[str, float] = {}
        for _ in range(args.rounds):
            for variant in VARIANTS:
                result = run_child(__file__, [variant, preset, args.steps], for_memory=False)
                if "error" in result:
                    raise RuntimeError(result["error"])
                times[variant].append(result["step_s"])
                losses[variant] = result["loss"]
        before, after = (statistics.median(times[v]) for v in VARIANTS)
        row = (
            f"| {preset} | {before:.3f} | {after:.3f} | {before / after:.2f}x | "
            f"{losses['sdpa-blocks']:.4f} / {losses['local-blocks']:.4f} |"
        )
        print(row, flush=True)
        lines.append(row)
    widths = (8, 16, 32, 64, 128)
    lines += [
        "",
        "Sliding-window attention alone (one layer, float32, forward and backward, median of 5): SDPA on blocks",
        "of 256 queries against their band / local blocks, and the ratio (above 1: local blocks faster).",
        "",
        "| length (batch x heads x dim) | " + " | ".join(f"window {w}" for w in widths) + " |",
        "|---|" + "---:|" * len(widths),
        *windows(widths=widths),
    ]
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        write_section("train-step", body)


if __name__ == "__main__":
    main()
