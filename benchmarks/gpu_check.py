"""The GPU check: one command on a machine with one CUDA GPU (``make gpu-check``), about 10 minutes.

    python benchmarks/gpu_check.py [--budget-s 570] [--no-write] [--skip-tests] [--skip-train]

Installs nothing beyond the project's setup (on a machine without a package index, the wheels of
``make device-wheels``: docs/install.md). In order, each stage skipped once the time budget is spent:

1. every CUDA test (tests/test_triton_attention.py, test_attention.py, test_stats.py,
   test_hardening_analyze.py: those skipped on a CPU) against the dense references;
2. attention forward and forward+backward TFLOP/s, bf16, head shapes 128/128, 256/256, 512/512,
   1024/1024, 512/128, 128/512 (heads x width = 2,048 per layer) at L = 4K and 32K, causal and window
   512: our ``triton`` kernel beside flash-attn (where it applies), FlexAttention and SDPA;
3. the fused statistics kernel against one attention forward of the same shape (goal: at most 1.5x);
4. a 0.6B training step per grid member at 4K: tokens/s and MFU (benchmarks/train_gpu.py; goals:
   d128 at least 40% MFU, d512 within 15% of d128's tokens/s).

FLOPs count only visible query-key pairs (causal: L(L+1)/2; window W: about L*W), 2 * pairs * (qk + v)
for the forward and 2.5x that for the backward, so masked work never inflates TFLOP/s. Results go to
docs/benchmarks.md (section ``gpu-check``, with the GPU and date) and a summary table is printed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [(128, 128), (256, 256), (512, 512), (1024, 1024), (512, 128), (128, 512)]
BUDGET = 2048  # heads x qk width per layer, as the 0.6B grid
CUDA_TESTS = ["tests/test_triton_attention.py", "tests/test_attention.py", "tests/test_stats.py",
              "tests/test_hardening_analyze.py"]  # fmt: skip


def pairs(length: int, window: int | None) -> int:
    """Visible query-key pairs of a causal (windowed) pass over ``length`` tokens."""
    if window is None or window >= length:
        return length * (length + 1) // 2
    return window * (window + 1) // 2 + (length - window) * window


def bench(fn, warmup: int = 2, iters: int = 5) -> float:
    """Median seconds of ``fn()`` on the GPU (CUDA events)."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def attention_rows(lengths: list[int], deadline: float) -> list[dict]:
    """TFLOP/s per backend, shape, length and mask (forward, forward+backward); failures named."""
    import torch

    from headprobe.model.attention import AttentionBackendError, attention, select_backend

    rows = []
    for length in lengths:
        for window in (None, 512):
            for qk, v in SHAPES:
                heads = max(1, BUDGET // qk)
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k = (torch.randn(1, heads, length, qk, device="cuda", dtype=torch.bfloat16, generator=g)
                        for _ in range(2))  # fmt: skip
                val = torch.randn(1, heads, length, v, device="cuda", dtype=torch.bfloat16, generator=g)
                flops = 2 * heads * pairs(length, window) * (qk + v)
                for backend in ("triton", "flash", "flex", "sdpa"):
                    row = {"length": length, "window": window, "qk": qk, "v": v, "backend": backend}
                    rows.append(row)
                    if time.monotonic() > deadline:
                        row["error"] = "skipped: time budget spent"
                        continue
                    try:
                        select_backend(q, k, val, window=window, backend=backend)
                        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, val))

                        def fwd(qq=qq, kk=kk, vv=vv, backend=backend, window=window):
                            with torch.no_grad():
                                return attention(qq, kk, vv, window=window, backend=backend)

                        def fwd_bwd(qq=qq, kk=kk, vv=vv, backend=backend, window=window):
                            attention(qq, kk, vv, window=window, backend=backend).sum().backward()

                        row["fwd_tflops"] = flops / bench(fwd) / 1e12
                        row["fwd_bwd_tflops"] = 3.5 * flops / bench(fwd_bwd) / 1e12
                    except AttentionBackendError as err:
                        row["error"] = f"n/a: {str(err).split(': ', 1)[-1][:60]}"
                    except Exception as err:  # an out-of-resources compile, out of memory: record, go on
                        row["error"] = f"failed: {type(err).__name__}: {str(err).splitlines()[0][:60]}"
                    torch.cuda.empty_cache()
    return rows


def stats_rows(deadline: float) -> list[dict]:
    """The fused statistics kernel (every row, no top-k) against one triton attention forward."""
    import torch

    from headprobe.model.attention import attention
    from headprobe.stats import attention_stats

    rows = []
    for length in (4096, 32768):
        for window in (None, 512):
            for qk, v in ((128, 128), (512, 512), (512, 128)):
                row = {"length": length, "window": window, "qk": qk, "v": v}
                rows.append(row)
                if time.monotonic() > deadline:
                    row["error"] = "skipped: time budget spent"
                    continue
                heads = BUDGET // qk
                q, k = (torch.randn(1, heads, length, qk, device="cuda", dtype=torch.bfloat16) for _ in range(2))
                val = torch.randn(1, heads, length, v, device="cuda", dtype=torch.bfloat16)
                try:
                    att = bench(lambda: attention(q, k, val, window=window, backend="triton"))  # noqa: B023
                    st = bench(lambda: attention_stats(q, k, window=window, topk=0, tiles="triton"))  # noqa: B023
                    row.update(attention_s=att, stats_s=st, ratio=st / att)
                except Exception as err:
                    row["error"] = f"failed: {type(err).__name__}: {str(err).splitlines()[0][:60]}"
    return rows


def run_tests() -> dict:
    """Every CUDA test (the CPU ones of these files run too; they are quick)."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *CUDA_TESTS],
                          cwd=ROOT, capture_output=True, text=True, check=False)  # fmt: skip
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-200:]
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAILED")]
    return {"returncode": proc.returncode, "summary": tail, "failed": failed, "seconds": time.monotonic() - t0}


def run_training(timeout: float) -> str:
    """benchmarks/train_gpu.py's table (tokens/s, MFU, memory per 0.6B member at 4K), or why not."""
    cmd = [sys.executable, "benchmarks/train_gpu.py", "--steps", "8", "--no-write"]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        done = [line for line in (err.stdout or b"").decode().splitlines() if line.startswith("| 0.6b")]
        return "\n".join(["| member | tokens/s | MFU | peak GPU memory |", "|---|---:|---:|---:|", *done,
                          f"(stopped after {timeout:.0f} s: the time budget)"])  # fmt: skip
    table = [line for line in proc.stdout.splitlines() if line.startswith("|")]
    return "\n".join(table) if table else f"failed: {proc.stderr.strip()[-200:]}"


def report(gpu: str, tests: dict | None, att: list[dict], stats: list[dict], train: str | None) -> str:
    import torch
    from _report import today

    lines = [f"## GPU check — {today()}", "", f"Machine: {gpu}, torch {torch.__version__}. Command: "
             "`make gpu-check` (`python benchmarks/gpu_check.py`).", ""]  # fmt: skip
    if tests:
        lines += [f"CUDA tests: `{tests['summary']}` ({tests['seconds']:.0f} s).", *tests["failed"][:20], ""]
    lines += [
        "### Attention, bf16, TFLOP/s (forward / forward+backward; visible pairs only)",
        "",
        "| L | mask | qk/v | heads | triton | flash | flex | sdpa |",
        "|---:|---|---|---:|---|---|---|---|",
    ]
    cells: dict[tuple, dict[str, str]] = {}
    for r in att:
        key = (r["length"], r["window"], r["qk"], r["v"])
        text = r.get("error") or f"{r['fwd_tflops']:.0f} / {r['fwd_bwd_tflops']:.0f}"
        cells.setdefault(key, {})[r["backend"]] = text
    for (length, window, qk, v), by in cells.items():
        mask = "causal" if window is None else f"window {window}"
        lines.append(f"| {length:,} | {mask} | {qk}/{v} | {max(1, BUDGET // qk)} | "
                     + " | ".join(by.get(b, "") for b in ("triton", "flash", "flex", "sdpa")) + " |")  # fmt: skip
    lines += ["", "### Fused statistics kernel vs one attention forward (triton, bf16; goal <= 1.5x)", "",
              "| L | mask | qk/v | attention | statistics | ratio |", "|---:|---|---|---:|---:|---:|"]  # fmt: skip
    for r in stats:
        mask = "causal" if r["window"] is None else f"window {r['window']}"
        if "error" in r:
            lines.append(f"| {r['length']:,} | {mask} | {r['qk']}/{r['v']} | {r['error']} | | |")
        else:
            lines.append(f"| {r['length']:,} | {mask} | {r['qk']}/{r['v']} | {r['attention_s'] * 1e3:.1f} ms | "
                         f"{r['stats_s'] * 1e3:.1f} ms | {r['ratio']:.2f}x |")  # fmt: skip
    if train:
        lines += ["", "### Training step, 0.6B members at 4K", "", train]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-s", type=float, default=570.0, help="stop starting new stages after this")
    parser.add_argument("--lengths", default="4096,32768")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--json", type=Path, help="also write every measurement here")
    args = parser.parse_args()
    import torch
    from _report import write_section

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: the GPU check needs one (the CPU paths are tested by `make test`)")
    start = time.monotonic()
    deadline = start + args.budget_s
    gpu = torch.cuda.get_device_name(0)
    print(f"GPU check on {gpu}", flush=True)
    tests = None if args.skip_tests else run_tests()
    if tests:
        print(f"[{time.monotonic() - start:.0f} s] CUDA tests: {tests['summary']}", flush=True)
    lengths = [int(x) for x in args.lengths.split(",")]
    # the rest of the budget: attention 50%, statistics 15%, training 35%
    left = deadline - time.monotonic()
    att = attention_rows(lengths, time.monotonic() + 0.5 * left)
    print(f"[{time.monotonic() - start:.0f} s] attention benchmark done", flush=True)
    stats = stats_rows(time.monotonic() + 0.15 * left)
    print(f"[{time.monotonic() - start:.0f} s] statistics benchmark done", flush=True)
    train = None
    if not args.skip_train and time.monotonic() < deadline:
        train = run_training(max(60.0, deadline - time.monotonic()))
    body = report(gpu, tests, att, stats, train)
    print(body)
    if args.json:
        args.json.write_text(json.dumps({"tests": tests, "attention": att, "stats": stats, "train": train}, indent=1))
    if not args.no_write:
        write_section("gpu-check", body)
    print(f"GPU check finished in {time.monotonic() - start:.0f} s", flush=True)
    if tests and tests["returncode"] != 0:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
