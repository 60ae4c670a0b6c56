"""The attention and analysis benchmarks on two source trees, side by side in one run.

    python benchmarks/trees.py --before /path/to/old/checkout [--after .] [--rounds 2] [--no-write]

For a restructuring that must not change speed: the same measurements, each in its own fresh
interpreter with ``PYTHONPATH`` set to one tree (so ``import headprobe`` loads that tree's code), the
trees alternating (A B, then B A, ...) so that drift of a shared machine hits both alike. Reported:
the median over the rounds per tree and the ratio after / before.

1. Attention forward (and forward+backward) with the ``sdpa`` and ``flex`` backends, the shapes of
   ``benchmarks/attention.py``.
2. ``attention_stats`` (no top-k; top-16) on ``1 x 2 heads x L x 64``, causal, after a warm-up.
3. ``attention_entropy`` of a local Llama-style toy model (as in ``benchmarks/analysis.py``), peak memory
   and time.

Both layouts are supported: the model family under ``trainer/`` (before) or ``headprobe/model/``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ATTENTION = [
    # label, heads, qk, v, window, length, backend, backward
    ("toy sliding (4x32/32, W=64)", 4, 32, 32, 64, 4096, "sdpa", False),
    ("toy sliding (4x32/32, W=64)", 4, 32, 32, 64, 16384, "sdpa", False),
    ("toy sliding (4x32/32, W=64)", 4, 32, 32, 64, 16384, "flex", False),
    ("toy full (4x32/32)", 4, 32, 32, None, 16384, "sdpa", False),
    ("0.6B full (2x512/128)", 2, 512, 128, None, 8192, "sdpa", False),
    ("toy sliding (4x32/32, W=64)", 4, 32, 32, 64, 4096, "sdpa", True),
    ("0.6B full (2x512/128)", 2, 512, 128, None, 4096, "sdpa", True),
]
STATS = [(length, topk) for length in (4096, 8192, 16384) for topk in (0, 16)]
ENTROPY = [2048, 4096, 8192]
CALIBRATION = ("attention_stats top-16 @ 4,096", "attention toy full (4x32/32) fwd sdpa @ 16,384")  # run A/A too


# ---------------------------------------------------------------------------------------------
# children (run inside one tree)
# ---------------------------------------------------------------------------------------------
def child_attention(label, heads, qk, v, window, length, backend, backward) -> dict:
    import torch
    from _report import measure

    try:
        from headprobe.model.attention import attention
    except ImportError:  # the layout before headprobe/model/
        from trainer.attention import attention
    torch.manual_seed(0)
    q = torch.randn(1, heads, length, qk, requires_grad=backward)
    k = torch.randn(1, heads, length, qk, requires_grad=backward)
    val = torch.randn(1, heads, length, v, requires_grad=backward)

    def step():
        if backward:
            attention(q, k, val, window=window, backend=backend).sum().backward()
        else:
            with torch.no_grad():
                attention(q, k, val, window=window, backend=backend)

    step()  # warm-up (compiles flex)
    seconds, peak = measure(step, 3)
    return {"seconds": seconds, "peak_bytes": peak}


def child_stats(length, topk) -> dict:
    import torch
    from _report import measure

    from headprobe.stats import attention_stats

    torch.manual_seed(0)
    q, k = torch.randn(1, 2, length, 64), torch.randn(1, 2, length, 64)
    attention_stats(q[:, :, :4096], k[:, :, :4096], topk=topk)  # warm-up: compiles the fused tile update
    seconds, peak = measure(lambda: attention_stats(q, k, topk=topk), 3)
    return {"seconds": seconds, "peak_bytes": peak}


def child_entropy(length) -> dict:
    import torch
    from _report import measure

    try:
        from headprobe.hooked import load_model
    except ImportError:  # the layouts before headprobe/hooked/: headprobe/probe/, and before it headprobe/models/
        try:
            from headprobe.probe import load_model  # type: ignore[no-redef]
        except ImportError:
            from headprobe.models import load_model  # type: ignore[no-redef]
    from headprobe.metrics import attention_entropy

    model = load_model(os.environ["HEADPROBE_BENCH_MODEL"])
    warm = torch.randint(3, 512, (1, 4096), generator=torch.Generator().manual_seed(1))
    attention_entropy(model, warm)
    ids = torch.randint(3, 512, (1, length), generator=torch.Generator().manual_seed(0))
    seconds, peak = measure(lambda: attention_entropy(model, ids), 1)
    return {"seconds": seconds, "peak_bytes": peak}


CHILDREN = {"attention": child_attention, "stats": child_stats, "entropy": child_entropy}


# ---------------------------------------------------------------------------------------------
# the comparison
# ---------------------------------------------------------------------------------------------
def run_in(tree: Path, kind: str, args: list, model_dir: Path) -> dict:
    from _report import run_child

    env = {"PYTHONPATH": str(tree), "HEADPROBE_BENCH_MODEL": str(model_dir)}
    return run_child(__file__, [kind, *args], timeout=900, env=env)


def compare(
    before: Path, after: Path, rounds: int, model_dir: Path, only: str | None = None
) -> list[tuple[str, str, dict, dict]]:
    cases = [("attention", list(c)) for c in ATTENTION] + [("stats", list(c)) for c in STATS]
    cases += [("entropy", [n]) for n in ENTROPY]
    cases = [c for c in cases if only is None or only in _label(*c)]
    rows = []
    for kind, args in cases:
        runs: dict[str, list[dict]] = {"before": [], "after": []}
        for r in range(rounds):
            order = [("before", before), ("after", after)][:: 1 if r % 2 == 0 else -1]
            for name, tree in order:
                runs[name].append(run_in(tree, kind, args, model_dir))
        label = _label(kind, args)
        rows.append((label, kind, _median(runs["before"]), _median(runs["after"])))
        print(label, rows[-1][2], rows[-1][3], flush=True)
    return rows


def _median(results: list[dict]) -> dict:
    ok = [r for r in results if "error" not in r]
    if not ok:
        return {"error": results[0].get("error", "?")}
    return {k: statistics.median(r[k] for r in ok) for k in ("seconds", "peak_bytes")}


def _label(kind: str, args: list) -> str:
    if kind == "attention":
        label, _, _, _, _, length, backend, backward = args
        return f"attention {label} {'fwd+bwd' if backward else 'fwd'} {backend} @ {length:,}"
    if kind == "stats":
        return f"attention_stats {'top-16' if args[1] else 'no top-k'} @ {args[0]:,}"
    return f"attention_entropy (toy llama) @ {args[0]:,}"


def _fmt(r: dict, key: str) -> str:
    if "error" in r:
        return r["error"]
    return f"{r[key] * 1000:,.1f} ms" if key == "seconds" else f"{r[key] / 2**20:,.0f} MiB"


def _ratio(a: dict, b: dict, key: str) -> str:
    if "error" in a or "error" in b or not a[key]:
        return "-"
    return f"{b[key] / a[key]:.2f}"


def report(rows, before: Path, after: Path, rounds: int, commits: tuple[str, str]) -> str:
    from _report import machine, today

    lines = [
        f"## Before and after the package restructuring (issue 9) — {today()}",
        "",
        f"Machine: {machine()}. Command: `python benchmarks/trees.py --before <checkout of {commits[0]}>` "
        f"(after: {commits[1]}). Each measurement in its own process with one tree on `PYTHONPATH`, the "
        f"trees alternating, {rounds} rounds; medians. Ratios are after / before (1.00 = unchanged; this "
        "machine's timings vary by about 10-30% between runs).",
        "",
        "| measurement | time before | time after | time ratio | peak before | peak after | peak ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    lines[4:4] = [_spread(rows), ""]
    for label, kind, a, b in rows:
        if kind == "calibration":
            label = f"{label} (before vs before: the noise)"
        lines.append(
            f"| {label} | {_fmt(a, 'seconds')} | {_fmt(b, 'seconds')} | {_ratio(a, b, 'seconds')} | "
            f"{_fmt(a, 'peak_bytes')} | {_fmt(b, 'peak_bytes')} | {_ratio(a, b, 'peak_bytes')} |"
        )
    return "\n".join(lines)


def _spread(rows) -> str:
    """One sentence: the range of the time ratios, and how far the same tree measured against itself."""

    def ratios(calibration: bool) -> list[float]:
        return [
            b["seconds"] / a["seconds"]
            for _, kind, a, b in rows
            if (kind == "calibration") == calibration and "error" not in a and "error" not in b
        ]

    main, noise = ratios(False), ratios(True)
    if not main:
        return "No measurement succeeded."
    text = f"Time ratios after / before range from {min(main):.2f} to {max(main):.2f}"
    if noise:
        text += f"; the same tree measured against itself gave {', '.join(f'{r:.2f}' for r in noise)}"
    return text + "."


def _commit(tree: Path) -> str:
    import subprocess

    out = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or str(tree)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        kind, *args = json.loads(sys.argv[2])
        print(json.dumps(CHILDREN[kind](*args)))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="checkout of the earlier tree")
    parser.add_argument("--after", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", help="run only the measurements whose label contains this text")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    from _report import write_section

    from headprobe.testing import build_toy_hf_model

    model_dir = Path(tempfile.gettempdir()) / "headprobe-bench-trees-llama"
    if not (model_dir / "config.json").is_file():
        build_toy_hf_model("llama", model_dir, hidden_size=128, layers=4, heads=2, kv_heads=2, head_dim=64)
    rows = compare(args.before.resolve(), args.after.resolve(), args.rounds, model_dir, args.only)
    if args.only is None:  # the same tree twice: how far apart two identical trees measure here
        for label in CALIBRATION:
            for row in compare(args.before.resolve(), args.before.resolve(), args.rounds, model_dir, label):
                rows.append((row[0], "calibration", row[2], row[3]))
    body = report(rows, args.before, args.after, args.rounds, (_commit(args.before), _commit(args.after)))
    print(body)
    if not args.no_write:
        write_section("trees", body)


if __name__ == "__main__":
    main()
