"""headprobe's RULER-style samples side by side with RULER's own scripts, on the same tokenizer.

Runs RULER's ``scripts/data/prepare.py`` (a local checkout of NVIDIA/RULER; nothing is downloaded) and
``headprobe``'s generator with ``fit="ruler"`` for the same tasks, length and tokenizer, and compares
what a seed cannot change: the number of haystack units per sample (noise lines, distractor needles,
distinct words, coded words), the token counts, and the template text (every random item masked:
numbers, UUIDs, word keys, variable names, list items, coded words; runs of haystack collapsed).
Writes a Markdown table to stdout (paste it into docs/evaluation.md with the machine and date).

    python benchmarks/ruler_side_by_side.py --ruler ~/src/RULER --tokenizer path/to/hf-tokenizer-folder

RULER's scripts need ``wonderwords``, ``nltk``, ``tenacity`` and ``transformers`` importable by the
``python`` on PATH (add a folder with ``--pythonpath``). The default tasks need no data download;
essay tasks need RULER's ``json/PaulGrahamEssays.json`` and nltk's punkt, qa tasks SQuAD/HotpotQA.
The tokenizer folder must load with ``AutoTokenizer`` (a ``tokenizer.json`` and a
``tokenizer_config.json``); ``--tokenizer toy`` writes one for headprobe's built-in toy BPE.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from headprobe.evals.ruler import templates as T
from headprobe.evals.ruler.generate import RulerGenerator
from headprobe.evals.ruler.tasks import TASKS
from headprobe.model.tokenizer import load_tokenizer

DEFAULT_TASKS = ["niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt", "cwe", "fwe"]
NEEDLE_LINE = re.compile(r"One of the special magic \w+ for \S+ is: \S+\.")


def units(task: str, text: str) -> int:
    """Haystack units of a sample's input, counted from its text alone."""
    family = TASKS[task].family
    if family == "niah" and TASKS[task].haystack == "noise":
        return text.count(T.NOISE_SENTENCE)
    if family == "niah":  # needle haystack: every needle line, less the real ones
        t = TASKS[task]
        return len(NEEDLE_LINE.findall(text)) - t.num_needle_k * t.num_needle_v
    if family == "vt":
        return text[text.rindex("Memorize and track") :].count(T.NOISE_SENTENCE)
    if family == "cwe":
        return len(set(re.findall(r"\d+\. (\S+)", text[text.rindex("Below is a numbered list") :])))
    if family == "fwe":
        return len(text.split("coded words. ", 1)[1].split("\nQuestion:")[0].split())
    raise ValueError(f"{task}: no unit count")


def masked(text: str) -> str:
    """The template text: random items replaced by placeholders, runs of haystack collapsed to one."""
    text = text.replace(T.NOISE_SENTENCE, "<noise>")
    text = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<uuid>", text)
    text = re.sub(r"\d+\. \S+", "<item>", text)
    text = re.sub(r"\d+", "<n>", text)
    text = re.sub(r"\b[a-z]+-[a-z]+\b", "<key>", text)
    text = re.sub(r"\b(?!VAR\b)[A-Z]{3,5}\b", "<name>", text)
    text = re.sub(r"\b[a-z]{6}\b", "<word>", text) if "coded words" in text else text
    text = text.replace("...", "<word>") if "coded words" in text else text
    for unit in ("<noise>", "<item>", "<word>"):
        text = re.sub(rf"{unit}(?:\s*{unit})+", unit, text)
    lines = text.split("\n")
    return "\n".join(line for i, line in enumerate(lines) if i == 0 or line != lines[i - 1])


def ruler_samples(ruler: Path, task: str, length: int, n: int, tokenizer: Path, out: Path, path: str) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (path, os.environ.get("PYTHONPATH", "")) if p)}
    cmd = [
        sys.executable, "prepare.py", "--save_dir", str(out), "--benchmark", "synthetic", "--task", task,
        "--tokenizer_path", str(tokenizer), "--tokenizer_type", "hf", "--max_seq_length", str(length),
        "--model_template_type", "base", "--num_samples", str(n),
    ]  # fmt: skip
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")  # prepare.py calls `python`
    subprocess.run(cmd, cwd=ruler / "scripts" / "data", env=env, check=True, capture_output=True)
    with open(out / task / "validation.jsonl") as f:
        return [json.loads(line) for line in f]


def toy_tokenizer_folder(where: Path) -> Path:
    from headprobe.text.toy_tokenizer import toy_tokenizer_path

    where.mkdir(parents=True, exist_ok=True)
    (where / "tokenizer.json").write_text(toy_tokenizer_path().read_text())
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}
    (where / "tokenizer_config.json").write_text(json.dumps(config))
    return where


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--ruler", type=Path, required=True, help="a checkout of NVIDIA/RULER")
    ap.add_argument("--tokenizer", default="toy", help="a Hugging Face tokenizer folder, or toy")
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--tasks", default=",".join(DEFAULT_TASKS))
    ap.add_argument("--pythonpath", default="", help="folder with RULER's requirements")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ruler-side-by-side-"))
    folder = toy_tokenizer_folder(work / "tokenizer") if args.tokenizer == "toy" else Path(args.tokenizer)
    ours = RulerGenerator(load_tokenizer(str(folder / "tokenizer.json")), seed=42, fit="ruler")
    print(f"{args.length:,} tokens, {args.samples} samples, tokenizer {args.tokenizer}\n")
    print("| task | RULER units | headprobe units | RULER tokens | headprobe tokens | template |")
    print("|---|---|---|---|---|---|")
    for task in args.tasks.split(","):
        theirs = ruler_samples(args.ruler, task, args.length, args.samples, folder, work / "ruler", args.pythonpath)
        mine = [ours.sample(task, args.length, i) for i in range(args.samples)]
        gen = TASKS[task].tokens_to_generate
        r_units, o_units = [units(task, s["input"]) for s in theirs], [units(task, s["input"]) for s in mine]
        r_tok, o_tok = [s["length"] - gen for s in theirs], [s["token_count"] for s in mine]
        same = masked(theirs[0]["input"] + theirs[0]["answer_prefix"]) == masked(
            mine[0]["input"] + mine[0]["answer_prefix"]
        )
        print(
            f"| {task} | {min(r_units)}–{max(r_units)} | {min(o_units)}–{max(o_units)} | "
            f"{min(r_tok):,}–{max(r_tok):,} | {min(o_tok):,}–{max(o_tok):,} | {'equal' if same else 'differs'} |"
        )
        if not same:
            a = masked(theirs[0]["input"] + theirs[0]["answer_prefix"]).splitlines()
            b = masked(mine[0]["input"] + mine[0]["answer_prefix"]).splitlines()
            diff = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            print(f"  first difference at line {diff}: RULER {a[diff : diff + 1]} | headprobe {b[diff : diff + 1]}")


if __name__ == "__main__":
    main()
