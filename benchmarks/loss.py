"""What the training loss costs: the LM head on counted positions only, logits kept or recomputed.

    python benchmarks/loss.py [--repeats 7] [--no-write]

One training step (forward, backward, AdamW) of toy-d64 at the toy recipe's shape (4 x 512 tokens), one
torch thread, in one process, side by side:

* ``all positions, recomputed``: every position counted and its logits made again in backward (the
  LM-head work of a step before the loss skipped uncounted positions and kept small chunks' logits);
* ``all positions, kept``: every position counted (prose rows), logits kept;
* ``25% / 5% counted, kept``: a loss mask counting that share of positions (curriculum rows: lists and
  copies count about a quarter, needles at long distances a few per cent).

Median step time over ``--repeats`` steps after two warm-up steps; ratios against the first case.
"""

from __future__ import annotations

import argparse
import time

BATCH, SEQ_LEN = 4, 512


def step_time(counted: float, recompute: bool, repeats: int) -> float:
    import torch

    import headprobe.model.transformer as transformer
    from headprobe.model.presets import preset

    torch.manual_seed(0)
    transformer.RECOMPUTE_LOGITS = 0 if recompute else 1 << 40
    model = transformer.Transformer(preset("toy-d64"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, model.cfg.vocab_size, (BATCH, SEQ_LEN))
    targets = torch.randint(0, model.cfg.vocab_size, (BATCH, SEQ_LEN))
    mask = None if counted >= 1 else torch.rand(BATCH, SEQ_LEN) < counted
    times = []
    for i in range(repeats + 2):
        t0 = time.perf_counter()
        model(ids, targets=targets, loss_mask=mask).backward()
        opt.step()
        opt.zero_grad()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    import torch
    from _report import machine, publish, today

    torch.set_num_threads(1)
    cases = [
        ("all positions, recomputed", 1.0, True),
        ("all positions, kept", 1.0, False),
        ("25% counted, kept", 0.25, False),
        ("5% counted, kept", 0.05, False),
    ]
    results = [(name, step_time(share, recompute, args.repeats)) for name, share, recompute in cases]
    base = results[0][1]
    lines = [
        f"## Training loss: counted positions only, logits kept — {today()}",
        "",
        f"Machine: {machine()}. Command: `python benchmarks/loss.py --repeats {args.repeats}` (one torch thread).",
        f"One step (forward, backward, AdamW) of toy-d64 at {BATCH} x {SEQ_LEN} tokens; median of "
        f"{args.repeats} steps. The first row is the LM-head work every step did before the loss skipped",
        "uncounted positions and kept small chunks' logits (it also counted hits with argmax, about 35 ms",
        "more on this machine); curriculum rows count about 5-25% of their positions.",
        "",
        "| case | step time | speed-up vs the first row |",
        "|---|---:|---:|",
        *(f"| {name} | {seconds * 1e3:,.0f} ms | {base / seconds:.2f}× |" for name, seconds in results),
    ]
    publish("loss", lines, not args.no_write)


if __name__ == "__main__":
    main()
