"""RULER-style generation speed and evaluation throughput on this machine.

    python benchmarks/ruler.py [--lengths 4096,32768,131072] [--no-write]

1. Samples/s of ``RulerGenerator`` (one sample of each of the 13 tasks per length) with the byte
   tokenizer and with a BPE tokenizer trained locally (8K vocabulary), against a naive search that
   re-tokenises the whole prompt at every trial of the same binary search (RULER's own method).
2. ``headprobe ruler eval`` on a toy checkpoint (random init, toy-d32) at 4,096 tokens: throughput
   decoding one sample at a time against batches of left-padded caches, and whether both predict alike.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def bpe_tokenizer(folder: Path):
    from headprobe.model.tokenizer import load_tokenizer
    from headprobe.testing import build_toy_bpe
    from headprobe.text.corpus import document

    texts = (document(0, i)[1] for i in range(3000))
    return load_tokenizer(build_toy_bpe(folder / "tokenizer.json", 8192, ("<s>", "</s>"), texts))


def naive_fit(draft, budget, counter, what):
    """The same binary search, but every trial renders and tokenises the whole prompt."""
    lo, hi = draft.n_min, draft.n_max

    def count(n: int) -> int:
        text, prefix, _ = draft.render(n)
        return counter.one(text + prefix)

    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    text, prefix, outputs = draft.render(lo)
    return text, prefix, outputs, lo, counter.one(text + prefix)


def time_generation(tokenizer, length: int, naive: bool) -> float:
    import headprobe.evals.ruler.fitting as fitting_mod
    import headprobe.evals.ruler.generate as gen_mod
    from headprobe.evals.ruler import TASKS, RulerGenerator

    real = fitting_mod.fit
    for mod in (fitting_mod, gen_mod):  # the tight fit, and RULER's fit where no whole step fits
        mod.fit = naive_fit if naive else real
    try:
        gen = RulerGenerator(tokenizer, seed=1)
        for task in TASKS:  # warm imports, the essay corpus and word caches
            gen.sample(task, 4096, 99)
        t0 = time.perf_counter()
        for task in TASKS:
            gen.sample(task, length, 0)
        return len(TASKS) / (time.perf_counter() - t0)
    finally:
        fitting_mod.fit = gen_mod.fit = real


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="4096,32768,131072")
    parser.add_argument("--eval-samples", type=int, default=8)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    from _report import machine, publish, today

    from headprobe.model.tokenizer import ByteTokenizer

    tmp = Path(tempfile.mkdtemp())
    tokenizers = {"byte": ByteTokenizer(), "BPE 8K (local)": bpe_tokenizer(tmp)}
    lines = [
        f"## RULER-style generation and evaluation — {today()}",
        "",
        f"Machine: {machine()}. Command: `python benchmarks/ruler.py --lengths {args.lengths}`.",
        "Generation: one sample of each of the 13 tasks per length (samples/s over the 13). `piece counts` is",
        "headprobe's fitting (token counts of pieces, one full tokenisation to confirm); `naive` runs the same",
        "binary search but re-tokenises the whole prompt at every trial.",
        "",
        "| tokenizer | tokens | piece counts (samples/s) | naive (samples/s) | speed-up |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, tok in tokenizers.items():
        for length in [int(x) for x in args.lengths.split(",")]:
            fast = time_generation(tok, length, naive=False)
            slow = time_generation(tok, length, naive=True)
            row = f"| {name} | {length:,} | {fast:.2f} | {slow:.3f} | {fast / slow:.0f}x |"
            print(row, flush=True)
            lines.append(row)

    import torch

    from headprobe.evals.ruler.job import evaluate
    from headprobe.evals.ruler.resolve import resolve_run
    from headprobe.evals.ruler.settings import RulerSettings
    from headprobe.model.checkpoint import save_checkpoint
    from headprobe.model.presets import preset
    from headprobe.model.transformer import Transformer

    torch.manual_seed(0)
    save_checkpoint(Transformer(preset("toy-d32")), tmp / "toy")
    tasks = ["niah_single_1", "vt"]
    run = resolve_run(RulerSettings(tasks=tasks, lengths=[4096], samples=args.eval_samples))
    n = len(tasks) * args.eval_samples
    seconds = {}
    for batch in (1, args.eval_samples):
        t0 = time.perf_counter()
        evaluate(tmp / "toy", tmp / f"eval-{batch}", run, batch_size=batch)
        seconds[batch] = time.perf_counter() - t0
        print(f"batch {batch}: {seconds[batch]:.1f} s", flush=True)
    same = all(
        (tmp / "eval-1" / "predictions" / f"{t}-4096.jsonl").read_text()
        == (tmp / f"eval-{args.eval_samples}" / "predictions" / f"{t}-4096.jsonl").read_text()
        for t in tasks
    )
    one, many = seconds[1], seconds[args.eval_samples]
    lines += [
        "",
        f"`ruler eval` on toy-d32 (random init, so it generates the full budget of each task: 128 tokens for "
        f"niah, 30 for vt) at 4,096 tokens, {args.eval_samples} samples of {', '.join(tasks)} ({n} samples; "
        "each: generate the sample, a 4K prefill, greedy steps with the KV cache):",
        "",
        "| decoding | seconds | samples/s |",
        "|---|---:|---:|",
        f"| one sample at a time (`--batch-size 1`) | {one:.1f} | {n / one:.2f} |",
        f"| batches of {args.eval_samples} (left-padded caches) | {many:.1f} | {n / many:.2f} |",
        "",
        f"Batched: {one / many:.1f}x the throughput; predictions identical: {same}.",
    ]
    publish("ruler", lines, not args.no_write)


if __name__ == "__main__":
    main()
