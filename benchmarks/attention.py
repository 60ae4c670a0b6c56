"""Attention backends on this machine: time and peak memory against the dense reference.

    python benchmarks/attention.py [--lengths 4096,16384] [--no-write]

Cases: a sliding-window and a full-attention layer, toy-shaped (toy-d32: 4 heads x 32, window 64)
and 0.6B-shaped (2 heads of a 0.6B layer: sliding 128/128 with window 512; full 0.6b-k512v128,
qk 512 / v 128 -- a shape no FlashAttention release runs). Each (case, length, backend) runs in its
own subprocess; forward only, plus forward+backward at the shortest length for backends that train.
Results go to docs/benchmarks.md as ratios to ``reference`` measured in the same run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CASES = {
    "toy sliding (4x32/32, W=64)": dict(heads=4, qk=32, v=32, window=64),
    "toy full (4x32/32)": dict(heads=4, qk=32, v=32, window=None),
    "0.6B sliding (2x128/128, W=512)": dict(heads=2, qk=128, v=128, window=512),
    "0.6B full (2x512/128)": dict(heads=2, qk=512, v=128, window=None),
}
BACKENDS = ["reference", "sdpa", "flex"]


def run_one(case: str, length: int, backend: str, mode: str) -> dict:
    """Child process: one measurement, printed as JSON."""
    import torch
    from _report import measure

    from headprobe.model.attention import AttentionBackendError, attention

    spec = CASES[case]
    torch.manual_seed(0)
    grad = mode == "fwd+bwd"
    q = torch.randn(1, spec["heads"], length, spec["qk"], requires_grad=grad)
    k = torch.randn(1, spec["heads"], length, spec["qk"], requires_grad=grad)
    v = torch.randn(1, spec["heads"], length, spec["v"], requires_grad=grad)

    def step() -> None:
        if grad:
            attention(q, k, v, window=spec["window"], backend=backend).sum().backward()
        else:
            with torch.no_grad():
                attention(q, k, v, window=spec["window"], backend=backend)

    try:
        step()  # warm-up (compiles flex)
    except AttentionBackendError as err:
        return {"error": str(err).split(": ", 1)[-1][:80]}
    repeats = 1 if backend == "reference" and length > 8192 else 3
    seconds, peak = measure(step, repeats)
    return {"seconds": seconds, "peak_bytes": peak}


def child(args: list, timeout: float) -> dict:
    from _report import run_child

    return run_child(__file__, args, timeout)


def fmt_mem(b: float) -> str:
    return f"{b / 2**20:,.0f} MiB" if b >= 2**20 else f"{b / 2**10:,.0f} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child")
    parser.add_argument("--lengths", default="4096,16384")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(*json.loads(args.child))))
        return

    from _report import machine, today, write_section
    from rich.console import Console

    console = Console()
    lengths = [int(x) for x in args.lengths.split(",")]
    jobs = [(c, n, "fwd") for c in CASES for n in lengths] + [(c, lengths[0], "fwd+bwd") for c in CASES]
    rows = []
    for case, length, mode in jobs:
        results = {}
        for backend in BACKENDS:
            if mode == "fwd+bwd" and backend == "flex":
                continue  # FlexAttention has no backward on CPU
            results[backend] = child([case, length, backend, mode], args.timeout)
            console.print(f"{case:34s} L={length:>6} {mode:8s} {backend:10s} {results[backend]}")
        rows.append((case, length, mode, results))

    lines = [
        f"## Attention backends (CPU) — {today()}",
        "",
        f"Machine: {machine()}. Command: `python benchmarks/attention.py --lengths {args.lengths}`.",
        "Batch 1; median of 3 runs (1 for the reference above 8K); peak = RSS growth above the inputs,",
        "sampled every 0.5 ms with large allocations mmapped. Ratios are reference / backend",
        "(time: how many times faster; memory: how many times less).",
        "",
        "| case | L | pass | backend | time | peak extra memory | speed-up vs reference | memory saving vs reference |",
        "|---|---:|---|---|---:|---:|---:|---:|",
    ]
    for case, length, mode, results in rows:
        ref = results.get("reference", {})
        for backend, r in results.items():
            if "error" in r:
                lines.append(f"| {case} | {length} | {mode} | {backend} | — | — | {r['error']} | |")
                continue
            speed = f"{ref['seconds'] / r['seconds']:.1f}×" if "seconds" in ref else "—"
            memory = f"{ref['peak_bytes'] / max(r['peak_bytes'], 1):.0f}×" if "peak_bytes" in ref else "—"
            lines.append(
                f"| {case} | {length} | {mode} | {backend} | {r['seconds'] * 1e3:,.1f} ms | "
                f"{fmt_mem(r['peak_bytes'])} | {speed} | {memory} |"
            )
    body = "\n".join(lines)
    console.print(body)
    if not args.no_write:
        write_section("attention", body)
        console.print(f"written to {Path('docs/benchmarks.md')}")


if __name__ == "__main__":
    main()
