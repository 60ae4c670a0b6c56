"""Trainer throughput and overhead on this machine.

    python benchmarks/train.py [--steps 6] [--presets toy-d16,...] [--no-write]

For each toy preset, in separate subprocesses and at the toy recipe's pretraining shape
(16 x 512 tokens per step):

* ``trainer``: ``trainer.train.train`` on the built-in corpus; step time = median of the logged
  ``step_time_s`` after the first step; peak RSS of the process.
* ``bare``: the same model, batch shape and AdamW in a plain forward / backward / step loop.

The overhead ratio is trainer / bare step time (goal: under 1.10). Results go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time
from pathlib import Path

SEQ_LEN, BATCH = 512, 16


def run_trainer(name: str, steps: int) -> dict:
    from trainer.config import TrainConfig
    from trainer.train import train

    with tempfile.TemporaryDirectory() as tmp:
        train(
            TrainConfig(
                preset=name, out=tmp, steps=steps, batch_size=BATCH, seq_len=SEQ_LEN, warmup_steps=1, progress=False
            )
        )
        rows = [json.loads(x) for x in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    times = [r["step_time_s"] for r in rows[1:]]
    return {"step_s": statistics.median(times), "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def run_bare(name: str, steps: int) -> dict:
    import numpy as np
    import torch

    from headprobe.model.presets import preset
    from headprobe.model.tokenizer import ByteTokenizer
    from headprobe.model.transformer import Transformer
    from trainer.data import PackedSequences, TokenData
    from trainer.distributed import init_world
    from trainer.optim import build_optimizer
    from trainer.setup import builtin_corpus

    torch.manual_seed(0)
    model = Transformer(preset(name))
    opt = build_optimizer(model, 3e-3, 0.1, (0.9, 0.95))
    corpus = builtin_corpus(steps * BATCH * SEQ_LEN, 0, init_world("cpu"), ByteTokenizer())  # the trainer's default
    seqs = PackedSequences(TokenData(corpus), SEQ_LEN)
    times = []
    for step in range(steps):
        batch = torch.from_numpy(np.stack([seqs[step * BATCH + i] for i in range(BATCH)]))
        t0 = time.perf_counter()
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return {
        "step_s": statistics.median(times[1:]),
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def child(kind: str, name: str, steps: int) -> dict:
    from _report import run_child

    result = run_child(__file__, [kind, name, steps], for_memory=False)
    if "error" in result:
        raise RuntimeError(result["error"])
    return result


def main() -> None:
    from headprobe.model.presets import list_presets

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--presets", default=",".join(list_presets("toy")))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.child:
        kind, name, steps = json.loads(args.child)
        print(json.dumps((run_trainer if kind == "trainer" else run_bare)(name, steps)))
        return

    from _report import machine, publish, today

    lines = [
        f"## Trainer on CPU — {today()}",
        "",
        f"Machine: {machine()}. Command: `python benchmarks/train.py --steps {args.steps}`.",
        f"Pretraining step of {BATCH} x {SEQ_LEN} tokens (the toy recipe's shape), median step time after the",
        "first; `bare` is a plain forward/backward/clip/AdamW loop on the same model and batch shape, run in its",
        "own process just before the trainer. Peak memory is the process's maximum RSS (includes Python/torch).",
        "",
        "| preset | trainer tokens/s | bare tokens/s | overhead (trainer / bare step time) | trainer peak RSS |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in args.presets.split(","):
        bare = child("bare", name, args.steps)
        trainer = child("trainer", name, args.steps)
        tokens = BATCH * SEQ_LEN
        row = (
            f"| {name} | {tokens / trainer['step_s']:,.0f} | {tokens / bare['step_s']:,.0f} | "
            f"{trainer['step_s'] / bare['step_s']:.3f} | {trainer['peak_rss'] / 2**20:,.0f} MiB |"
        )
        print(row, flush=True)
        lines.append(row)
    publish("train-cpu", lines, not args.no_write)


if __name__ == "__main__":
    main()
