"""The explorer on 2 CPU cores: time to the first map, time per zoom tile, server memory; and the dense tools.

    python benchmarks/explore.py [--lengths 1024,16384,131072] [--dense 512,1024,2048,4096] [--no-write]

1. For each length, in a fresh process: a toy-d64 ``ModelView`` over a needle prompt (the forward pass
   capturing q/k, the per-head metrics, the answer decoded with each head's argmax), then the first
   overview map (the one tile of the whole map) of a full-attention head and of a sliding one, then
   zoom tiles once the rows' lse is known (token level at the needle, and a middle level), and the
   process's peak resident memory (what a server holding this input needs).
2. The dense tools at the lengths they reach: the attention pattern of one head materialised from the
   same q/k (float32 ``softmax(q k^T)``), then CircuitsVis ``attention_heads`` and bertviz ``head_view``
   HTML for it (both embed every probability as JSON); against the explorer's whole-map tile of that
   head. Size of what reaches the browser and time to produce it, as ratios. (Neither tool can be
   rendered offline here: CircuitsVis's page loads its script from a CDN, bertviz's from cdnjs.)

``--checkpoint`` uses a trained toy checkpoint instead of a random-init toy-d64 (the timings depend
only on the shapes). Results go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time


def _model(checkpoint: str | None):
    import torch

    from headprobe.hooked import HeadprobeModel, load_model
    from headprobe.model.presets import preset
    from headprobe.model.transformer import Transformer
    from headprobe.text.toy_tokenizer import open_tokenizer

    if checkpoint:
        return load_model(checkpoint)
    torch.manual_seed(0)
    return HeadprobeModel(Transformer(preset("toy-d64")), open_tokenizer("toy"), "toy-d64")


def _timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def run_length(length: int, checkpoint: str | None) -> dict:
    """Everything of part 1 at one length (run in a child process)."""
    import torch
    from _report import rss

    from headprobe.explore import ModelView, TileSpec, top_level
    from headprobe.explore.inputs import needle_input

    torch.set_num_threads(2)
    model = _model(checkpoint)
    inp = needle_input(model, length, 50.0, needles="codes")
    before = rss()
    load, view = _timed(lambda: ModelView(model, inp, "toy-d64"))
    loaded = rss()
    top = top_level(inp.length)
    full = next(i.index for i in model.layers if i.window is None)
    sliding = next(i.index for i in model.layers if i.window is not None)
    first_full, _ = _timed(lambda: view.tile(full, 0, TileSpec(top, 0, 0)))
    first_sliding, _ = _timed(lambda: view.tile(sliding, 0, TileSpec(top, 0, 0)))
    (a, _), q = inp.spans[0], inp.question[1] - 1

    # token level at the needle: head 1's rows have no lse yet, so its first tile computes the row band;
    # head 0's rows got theirs from the first map, so its tiles compute only their own keys
    token_first, _ = _timed(lambda: view.tile(full, 1, TileSpec(0, q // 256, a // 256)))
    cols = range(max(0, a // 256 - 2), a // 256 + 1)
    token_known = statistics.median([_timed(lambda c=c: view.tile(full, 0, TileSpec(0, q // 256, c)))[0] for c in cols])
    middle = max(0, top - 3)
    mid = statistics.median(
        [
            _timed(lambda c=c: view.tile(full, 0, TileSpec(middle, q // TileSpec(middle, 0, 0).span, c)))[0]
            for c in range(3)
        ]
    )
    return {
        "length": inp.length,
        "load_s": load,
        "first_full_s": first_full,
        "first_sliding_s": first_sliding,
        "token_tile_first_s": token_first,
        "token_tile_s": token_known,
        "mid_tile_s": mid,
        "mid_level": middle,
        "capture_mib": view.capture_bytes() / 2**20,
        "rss_loaded_mib": (loaded - before) / 2**20,
        "rss_before_mib": before / 2**20,
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10,
    }


def run_dense(length: int, checkpoint: str | None) -> dict:
    """Part 2 at one length (run in a child process)."""
    import torch

    from headprobe.explore import ModelView, api_answer, top_level
    from headprobe.explore.inputs import needle_input

    torch.set_num_threads(2)
    model = _model(checkpoint)
    inp = needle_input(model, length, 50.0, needles="codes")
    view = ModelView(model, inp, "toy-d64")
    full = next(i.index for i in model.layers if i.window is None)
    cap = view.captures[full]
    n = inp.length
    ours_s, answer = _timed(
        lambda: api_answer(
            [view],
            "tile",
            {"model": "0", "layer": str(full), "head": "0", "level": str(top_level(n)), "row": "0", "col": "0"},
        )
    )
    ours_bytes = len(json.dumps(answer))

    def pattern() -> torch.Tensor:
        q, k = cap.head(0)
        s = (q @ k.T) * cap.scale
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -float("inf"))
        return torch.softmax(s, -1)

    dense_s, p = _timed(pattern)
    out = {
        "length": n,
        "ours_s": ours_s,
        "ours_bytes": ours_bytes,
        "dense_s": dense_s,
        "pattern_mib": p.numel() * 4 / 2**20,
    }
    tokens = inp.tokens
    try:
        import circuitsvis.attention as cv

        cv_s, html = _timed(lambda: str(cv.attention_heads(p[None].numpy(), tokens)))
        out |= {"circuitsvis_s": cv_s, "circuitsvis_bytes": len(html)}
    except ImportError:
        pass
    try:
        from bertviz import head_view

        bv_s, html = _timed(lambda: head_view([p[None, None]], tokens, html_action="return").data)
        out |= {"bertviz_s": bv_s, "bertviz_bytes": len(html)}
    except ImportError:
        pass
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1024,16384,131072")
    parser.add_argument("--dense", default="512,1024,2048,4096")
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--child", default=None)
    args = parser.parse_args()
    if args.child:
        kind, length, checkpoint = json.loads(args.child)
        result = (run_length if kind == "length" else run_dense)(length, checkpoint)
        print(json.dumps(result))
        return
    from _report import machine, publish, run_child, today

    rows = [run_child(__file__, ["length", int(n), args.checkpoint], for_memory=False) for n in args.lengths.split(",")]
    dense = [run_child(__file__, ["dense", int(n), args.checkpoint], for_memory=False) for n in args.dense.split(",")]
    model = args.checkpoint or "toy-d64 (random init; the timings depend only on the shapes)"
    lines = [
        f"## Attention-map explorer — {today()}",
        "",
        f"Machine: {machine()}. Command: `python benchmarks/explore.py --lengths {args.lengths} --dense {args.dense}`.",
        f"Model: {model}; input: a needle prompt (codes needle at 50%).",
        "Each length in a fresh process (2 torch threads).",
        "",
        "Load = the forward pass capturing every layer's q/k, the per-head metrics over about 2,048 rows and the",
        "answer decoded with each head's argmax per step. First map = the one tile of the whole map (256 x 256",
        "pixels), exact, computed with the rows' lse in one pass. Zoom tiles: token level (256 x 256 tokens) at",
        "the needle, first with the rows' lse unknown (the tile's row band is computed), then known; a middle level.",
        "Held = the process's resident memory once loaded (Python, torch, the model, the captures); peak = its",
        "highest resident memory (the chunked forward pass and the KV cache on top). Python and torch alone: about",
        "450 MiB.",
        "",
        "| tokens | load | first map, full head | first map, sliding head | token tile (band / lse known) "
        "| middle-level tile | captured q/k | held after load | peak memory |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| ? | {r['error']} | | | | | | | |")
            continue
        lines.append(
            f"| {r['length']:,} | {r['load_s']:.1f} s | {r['first_full_s']:.2f} s | {r['first_sliding_s']:.2f} s | "
            f"{r['token_tile_first_s'] * 1e3:,.1f} / {r['token_tile_s'] * 1e3:,.1f} ms | "
            f"{r['mid_tile_s'] * 1e3:,.1f} ms (level {r['mid_level']}) | {r['capture_mib']:,.0f} MiB | "
            f"{r['rss_loaded_mib'] + r['rss_before_mib']:,.0f} MiB | {r['peak_mib']:,.0f} MiB |"
        )
    lines += [
        "",
        "Dense tools on one full-attention head: the pattern materialised, then the page each tool writes (every",
        "probability as JSON), against the explorer's whole-map tile (its JSON answer). Ratios = theirs / ours.",
        "",
        "| tokens | dense pattern (float32) | ours: bytes, time | CircuitsVis: bytes, time | bertviz: bytes, time |",
        "|---:|---:|---:|---:|---:|",
    ]
    for d in dense:
        if "error" in d:
            lines.append(f"| ? | {d['error']} | | | |")
            continue

        def tool(name: str, d=d) -> str:
            if f"{name}_bytes" not in d:
                return "not installed"
            size, secs = d[f"{name}_bytes"], d["dense_s"] + d[f"{name}_s"]
            return (
                f"{size / 2**20:,.1f} MiB ({size / d['ours_bytes']:,.0f}×), {secs:.2f} s ({secs / d['ours_s']:,.1f}×)"
            )

        lines.append(
            f"| {d['length']:,} | {d['pattern_mib']:,.0f} MiB, {d['dense_s']:.2f} s | "
            f"{d['ours_bytes'] / 2**10:,.0f} KiB, {d['ours_s']:.2f} s | {tool('circuitsvis')} | {tool('bertviz')} |"
        )
    lines += [
        "",
        "At 131,072 tokens one head's dense float32 pattern alone is 64 GiB (its JSON several times that): the",
        "dense tools cannot show it on any machine here, while the explorer's first map of that head is the row above.",
    ]
    publish("explore", lines, not args.no_write)


if __name__ == "__main__":
    main()
