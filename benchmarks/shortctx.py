"""Short-context multiple-choice scoring: right-padded batches against one pair at a time.

    python benchmarks/shortctx.py [--preset toy-d64] [--items 90] [--batch 16] [--no-write]

Scores the built-in multiple-choice items (4 choices each) with a random-init toy checkpoint, once
with ``batch_size=1`` and once batched, in one run; reports pairs/s, the ratio, and whether both give
the same per-choice log-likelihoods.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="toy-d64")
    parser.add_argument("--items", type=int, default=90)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    import torch
    from _report import machine, today, write_section

    from headprobe.evals.shortctx import builtin_items, evaluate_items
    from headprobe.hooked import HeadprobeModel
    from headprobe.model.presets import preset
    from headprobe.model.tokenizer import ByteTokenizer
    from headprobe.model.transformer import Transformer

    torch.manual_seed(0)
    model = HeadprobeModel(Transformer(preset(args.preset)), ByteTokenizer(), args.preset)
    items = builtin_items(args.items)
    pairs = sum(len(item.pairs) for item in items)
    seconds, results = {}, {}
    for batch in (1, args.batch):
        evaluate_items(model, items[:2], batch_size=batch)  # warm-up
        t0 = time.perf_counter()
        results[batch] = evaluate_items(model, items, batch_size=batch)
        seconds[batch] = time.perf_counter() - t0
        print(f"batch {batch}: {seconds[batch]:.2f} s", flush=True)
    diff = max(
        abs(a - b)
        for r1, rb in zip(results[1]["items"], results[args.batch]["items"], strict=True)
        for a, b in zip(r1["loglikelihoods"], rb["loglikelihoods"], strict=True)
    )
    one, many = seconds[1], seconds[args.batch]
    body = "\n".join(
        [
            f"## Short-context multiple choice — {today()}",
            "",
            f"Machine: {machine()}. Command: `python benchmarks/shortctx.py --preset {args.preset} "
            f"--items {args.items} --batch {args.batch}`.",
            f"{len(items)} built-in items x 4 choices = {pairs} (context, continuation) pairs, {args.preset} "
            "(random init, float32):",
            "",
            "| scoring | seconds | pairs/s |",
            "|---|---:|---:|",
            f"| one pair at a time | {one:.2f} | {pairs / one:.1f} |",
            f"| right-padded batches of {args.batch} | {many:.2f} | {pairs / many:.1f} |",
            "",
            f"Batched: {one / many:.1f}x the throughput; largest log-likelihood difference {diff:.1e} "
            f"(accuracy {results[1]['acc']:.3f} vs {results[args.batch]['acc']:.3f}).",
        ]
    )
    print(body)
    if not args.no_write:
        write_section("shortctx", body)


if __name__ == "__main__":
    main()
