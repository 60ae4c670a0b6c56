"""headprobe's streaming analysis against TransformerLens and against a plain SDPA forward.

    python benchmarks/analysis.py [--lengths 2048,4096,8192] [--reach 16384,...,131072] [--no-write]

1. Per-head attention entropy of a small Llama-style Hugging Face model (built locally with random
   weights: 4 layers, 2 heads of width 64, d_model 128): TransformerLens 4.x
   ``TransformerBridge.run_with_cache`` (dense ``hook_pattern``, entropy from it) against
   ``headprobe.metrics.attention_entropy`` on the same input. Peak memory and time, as ratios.
2. The longest length each reaches within a 16 GiB budget (each run is capped at 16 GiB of address
   space above its start; a failure or a run over ``--timeout`` ends the search).
3. ``attention_stats`` (entropy etc., no top-k; and with top-16) against one dense attention forward
   (PyTorch SDPA, fused) of the same shapes.

Every measurement runs in its own subprocess; results go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

BUDGET = 16 * 2**30
KINDS = ("sdpa", "stats", "stats+top16")
SECTIONS = ("tl", "reach", "stats")
MODEL = dict(hidden_size=128, layers=4, heads=2, kv_heads=2, head_dim=64, vocab_size=512)


def _model_dir() -> Path:
    from headprobe.testing import build_toy_hf_model

    folder = Path(tempfile.gettempdir()) / "headprobe-bench-llama"
    if not (folder / "config.json").is_file():
        build_toy_hf_model("llama", folder, **MODEL)
    return folder


def run_tl(length: int) -> dict:
    import torch
    from _report import measure
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(str(_model_dir()), device="cpu")
    ids = torch.randint(3, 512, (1, length), generator=torch.Generator().manual_seed(0))
    result = {}

    def step():
        with torch.no_grad():
            _, cache = bridge.run_with_cache(ids, names_filter=lambda n: n.endswith("hook_pattern"))
        ent = []
        for name in sorted(cache.keys()):
            p = cache[name]
            ent.append(-(p * torch.log(p.clamp_min(1e-30))).sum(-1).mean((0, 2)))
        result["entropy"] = torch.stack(ent).tolist()

    seconds, peak = measure(step, 1)
    return {"seconds": seconds, "peak_bytes": peak, **result}


def run_headprobe(length: int) -> dict:
    import torch
    from _report import measure

    from headprobe.hooked import load_model
    from headprobe.metrics import attention_entropy

    model = load_model(_model_dir())
    ids = torch.randint(3, 512, (1, length), generator=torch.Generator().manual_seed(0))
    warm = torch.randint(3, 512, (1, 4096), generator=torch.Generator().manual_seed(1))
    t0 = time.perf_counter()
    attention_entropy(model, warm)  # compiles the fused tile update (both variants) once per process
    compile_s = time.perf_counter() - t0
    result = {}

    def step():
        frame = attention_entropy(model, ids)
        result["entropy"] = frame.pivot(index="layer", columns="head", values="value").values.tolist()

    seconds, peak = measure(step, 1)
    return {"seconds": seconds, "peak_bytes": peak, "warmup_s": compile_s, **result}


def run_stats(length: int, kind: str) -> dict:
    import torch
    import torch.nn.functional as F
    from _report import measure

    from headprobe.stats import attention_stats

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, length, 64) for _ in range(3))
    if kind == "sdpa":
        fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    else:
        topk = 16 if kind == "stats+top16" else 0
        fn = lambda: attention_stats(q, k, topk=topk)  # noqa: E731
    fn()  # warm-up (compiles the fused tile update)
    seconds, peak = measure(fn, 3)
    return {"seconds": seconds, "peak_bytes": peak}


def child(args: list, timeout: float, cap: bool = False, for_memory: bool = True) -> dict:
    """One measurement in a fresh process; ``cap`` limits it to 16 GiB of address space above the
    interpreter's own (about 6 GiB of mappings)."""
    from _report import run_child

    result = run_child(
        __file__,
        args,
        timeout,
        for_memory,
        address_space=BUDGET + 6 * 2**30 if cap else None,
        env={"HF_HUB_OFFLINE": "1"},
    )
    if result.get("error") == "out of memory":
        result["error"] = "out of memory (16 GiB cap)"
    return result


def gib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB" if b >= 2**28 else f"{b / 2**20:.0f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child")
    parser.add_argument("--lengths", default="2048,4096,8192")
    parser.add_argument("--reach", default="16384,32768,65536,131072")
    parser.add_argument("--stats-lengths", default="4096,8192,16384")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--sections", default=",".join(SECTIONS), help="which of tl,reach,stats to run")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.child:
        kind, *rest = json.loads(args.child)
        fn = {"tl": run_tl, "headprobe": run_headprobe, "stats": run_stats}[kind]
        print(json.dumps(fn(*rest)))
        return

    from _report import write_section

    _model_dir()
    sections = {"tl": section_tl, "reach": section_reach, "stats": section_stats}
    for name in args.sections.split(","):
        body = "\n".join(sections[name](args))
        print(body, flush=True)
        if not args.no_write:
            write_section(f"analysis-{name}", body)


def _header(title: str, args, *text: str) -> list[str]:
    from _report import machine, today

    return [
        f"## {title} — {today()}",
        "",
        f"Machine: {machine()}. Command: `python benchmarks/analysis.py --sections {args.sections} --lengths "
        f"{args.lengths} --reach {args.reach} --stats-lengths {args.stats_lengths}`.",
        *text,
    ]


def section_tl(args) -> list[str]:
    import numpy as np

    lines = _header(
        "Analysis engine vs TransformerLens: per-head entropy",
        args,
        "Model: Llama-style, random weights, built locally (4 layers, 2 heads x 64, d_model 128). Per-head mean",
        "attention entropy of one sequence. TransformerLens 4.x: `TransformerBridge.run_with_cache` keeping only",
        "`hook_pattern`, entropy from the dense patterns. headprobe: `attention_entropy` (streaming, exact).",
        "Peak = RSS growth during the call (model already loaded; large allocations mmapped for the reading,",
        "which also slows allocation-heavy code a little). Ratios are TransformerLens / headprobe. headprobe's",
        "times exclude a one-time warm-up per process (a 4K pass that compiles the fused tile update).",
        "",
        "| tokens | TL time | TL peak | headprobe time | headprobe peak | memory ratio | speed ratio "
        "| max entropy diff |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    )
    warmups = []
    for length in [int(x) for x in args.lengths.split(",")]:
        tl = child(["tl", length], args.timeout, cap=True)
        hp = child(["headprobe", length], args.timeout, cap=True)
        print(length, {k: v for k, v in tl.items() if k != "entropy"}, {k: v for k, v in hp.items() if k != "entropy"})
        if "error" in tl or "error" in hp:
            lines.append(f"| {length} | {tl.get('error', '')} | | {hp.get('error', '')} | | | | |")
            continue
        warmups.append(hp["warmup_s"])
        diff = float(np.abs(np.array(tl["entropy"]) - np.array(hp["entropy"])).max())
        lines.append(
            f"| {length:,} | {tl['seconds']:.2f} s | {gib(tl['peak_bytes'])} | {hp['seconds']:.2f} s | "
            f"{gib(hp['peak_bytes'])} | {tl['peak_bytes'] / max(hp['peak_bytes'], 1):.1f}x | "
            f"{tl['seconds'] / hp['seconds']:.1f}x | {diff:.1e} |"
        )
    if warmups:
        lines += ["", f"headprobe warm-up (compile + a 4K pass): {min(warmups):.0f}-{max(warmups):.0f} s per process."]
    return lines


def section_reach(args) -> list[str]:
    lines = _header(
        "Longest context within 16 GiB: TransformerLens vs headprobe",
        args,
        "Same model and measurement as above, doubling the length until a run fails; each run's address space",
        "is capped at 16 GiB above the interpreter's.",
        "",
    )
    for kind in ("tl", "headprobe"):
        reached, note = None, ""
        for length in [int(x) for x in (args.lengths + "," + args.reach).split(",")]:
            r = child([kind, length], args.timeout, cap=True)
            print(kind, length, {k: v for k, v in r.items() if k != "entropy"}, flush=True)
            if "error" in r:
                note = f" (at {length:,}: {r['error']})"
                break
            reached = (length, r)
        name = "TransformerLens" if kind == "tl" else "headprobe"
        if reached:
            length, r = reached
            lines.append(f"- {name}: **{length:,} tokens** ({r['seconds']:.0f} s, peak {gib(r['peak_bytes'])}){note}")
        else:
            lines.append(f"- {name}: none{note}")
    return lines


def section_stats(args) -> list[str]:
    lines = _header(
        "Streaming statistics vs one SDPA forward",
        args,
        "`attention_stats` (every statistic but top-k; then with top-16) against one fused SDPA forward of the",
        "same shapes: 1 x 2 heads x L x 64, causal; median of 3 after a warm-up that also compiles the fused tile",
        "update; timing-only processes (no mmap setting).",
        "",
        "| tokens | SDPA forward | attention_stats | ratio | with top-16 | ratio |",
        "|---:|---:|---:|---:|---:|---:|",
    )
    for length in [int(x) for x in args.stats_lengths.split(",")]:
        res = {kind: child(["stats", length, kind], args.timeout, for_memory=False) for kind in KINDS}
        print(length, res, flush=True)
        base = res["sdpa"]["seconds"]
        lines.append(
            f"| {length:,} | {base * 1e3:.0f} ms | {res['stats']['seconds'] * 1e3:.0f} ms | "
            f"{res['stats']['seconds'] / base:.2f}x | {res['stats+top16']['seconds'] * 1e3:.0f} ms | "
            f"{res['stats+top16']['seconds'] / base:.2f}x |"
        )
    return lines


if __name__ == "__main__":
    main()
