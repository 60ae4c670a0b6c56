"""Tokens/s and MFU of the 0.6B grid members at 4,096 tokens on one GPU (run when a GPU is lent).

    python benchmarks/train_gpu.py [--members d128,d256,d512,k512v128,k128v512] [--steps 12] [--no-write]

Each member trains ``--steps`` pretraining steps of 8 x 4,096 tokens (micro-batch 2, bf16 autocast,
activation checkpointing off, the default attention backend choice) on the built-in corpus; the
median of the logged ``tokens_per_s`` and ``mfu`` after three warm-up steps is reported. MFU uses the
planner's causal, window-aware FLOP count, so it is not inflated by masked attention.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", default="d128,d256,d512,k512v128,k128v512")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    import torch
    from _report import publish, today

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: this benchmark needs one")
    gpu = torch.cuda.get_device_name(0)
    lines = [
        f"## Trainer on GPU, 0.6B members at 4,096 tokens — {today()}",
        "",
        f"Machine: {gpu}, torch {torch.__version__}. Command: `python benchmarks/train_gpu.py --steps {args.steps}"
        f"{' --compile' if args.compile else ''}`.",
        "8 x 4,096 tokens per step, micro-batch 2, bf16 autocast; median after 3 warm-up steps.",
        "",
        "| member | tokens/s | MFU | peak GPU memory |",
        "|---|---:|---:|---:|",
    ]
    for member in args.members.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [
                sys.executable,
                "-m",
                "headprobe",
                "train",
                "--preset",
                f"0.6b-{member}",
                "--out",
                tmp,
                "--steps",
                str(args.steps),
                "--batch-size",
                "8",
                "--micro-batch-size",
                "2",
                "--seq-len",
                "4096",
                "--warmup-steps",
                "1",
                "--lr",
                "3e-4",
            ] + (["--compile"] if args.compile else [])
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                lines.append(f"| {member} | failed: {proc.stderr.strip().splitlines()[-1][:80]} | | |")
                continue
            rows = [json.loads(x) for x in (Path(tmp) / "metrics.jsonl").read_text().splitlines()][3:]
        tps = statistics.median(r["tokens_per_s"] for r in rows)
        mfu = statistics.median(r["mfu"] for r in rows if r["mfu"] is not None) if rows[0]["mfu"] else None
        mem = max(r.get("peak_gpu_mem_gib", 0.0) for r in rows)
        lines.append(
            f"| 0.6b-{member} | {tps:,.0f} | {'n/a' if mfu is None else f'{mfu * 100:.1f}%'} | {mem:.1f} GiB |"
        )
        print(lines[-1], flush=True)
    publish("train-gpu", lines, not args.no_write)


if __name__ == "__main__":
    main()
