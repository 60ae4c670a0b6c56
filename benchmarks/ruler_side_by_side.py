"""headprobe's RULER-style samples side by side with RULER's own scripts, on the same tokenizer.

Runs RULER's ``scripts/data/prepare.py`` (a local checkout of NVIDIA/RULER; nothing is downloaded) and
``headprobe``'s generator with ``fit="ruler"`` for the same tasks, length and tokenizer, and compares
what a seed cannot change: the number of haystack units per sample (noise lines, distractor needles,
distinct words, coded words), the token counts, and the template text (every random item masked:
numbers, UUIDs, word keys, variable names, list items, coded words; runs of haystack collapsed).
Writes a Markdown table to stdout (paste it into docs/evaluation.md with the machine and date).

    python benchmarks/ruler_side_by_side.py --ruler ~/src/RULER --tokenizer path/to/hf-tokenizer-folder

RULER's scripts need ``wonderwords``, ``nltk``, ``tenacity`` and ``transformers`` importable by the
``python`` on PATH (add a folder with ``--pythonpath``). Nothing is downloaded: both sides read the same
data, headprobe's built-in essay and QA sets written in RULER's file formats into a copy of RULER's
scripts (``json/PaulGrahamEssays.json``, ``squad.json``, ``hotpotqa.json``). Without nltk's punkt
download RULER's essays are split by an untrained Punkt (the table says which). The tokenizer folder
must load with ``AutoTokenizer`` (a ``tokenizer.json`` and a ``tokenizer_config.json``);
``--tokenizer toy`` writes one for headprobe's built-in toy BPE.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from headprobe.evals.ruler import templates as T
from headprobe.evals.ruler.generate import RulerGenerator
from headprobe.evals.ruler.tasks import TASKS
from headprobe.model.tokenizer import load_tokenizer

RULER_TASKS = {  # RULER's synthetic.yaml names
    "niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2", "niah_multikey_3",
    "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2",
}  # fmt: skip
DEFAULT_TASKS = [name for name in TASKS if name in RULER_TASKS]
NEEDLE_LINE = re.compile(r"One of the special magic \w+ for \S+ is: \S+\.")


def units(task: str, text: str) -> int:
    """Haystack units of a sample's input, counted from its text alone."""
    family = TASKS[task].family
    if family == "niah" and TASKS[task].haystack == "essay":  # words of the essay, needles left out
        context = text.split("afterwards.\n", 1)[1].rsplit("\nWhat ", 1)[0]
        return len(NEEDLE_LINE.sub(" ", context).split())
    if family == "qa":
        return len(re.findall(r"^Document \d+:$", text, flags=re.M))
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


MASKED_NEEDLE = re.compile(r"One of the special magic \w+ for <key> is: <\w+>\.")
MASKED_VAR = re.compile(r"VAR <name> = (?:<n>|VAR <name>)\.?\s*")


def masked(text: str) -> str:
    """The template text, what a seed cannot change: random items replaced by placeholders (UUIDs,
    numbers, word keys, variable names, cwe list items, coded words, QA documents), an essay's prose
    replaced by ``<essay>`` and the needle forms it holds, and every run of haystack lines (noise,
    needles, variable assignments: their order is random) by the sorted set of its distinct lines."""
    cwe, coded = "Below is a numbered list" in text, "coded words" in text
    text = re.sub(r"(Document \d+:\n)(?:doc \d+\n)?[^\n]*", r"\1<doc>", text)  # hotpot: a title line
    # word keys (RULER's nouns may hold a space) where needles and questions name them
    text = re.sub(r"(special magic \w+ for )([^:?]+?)( is: | mentioned in)", r"\1<key>\3", text)
    text = text.replace(T.NOISE_SENTENCE, "<noise>")
    text = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<uuid>", text)
    text = re.sub(r"\d+\. \S+", "<item>", text) if cwe else text
    text = re.sub(r"\d+", "<n>", text)
    text = re.sub(r"\b[a-z]+(?:-[a-z]+)+\b", "<key>", text)
    text = re.sub(r"\b(?!VAR\b)[A-Z]{3,5}\b", "<name>", text)
    if coded:
        text = re.sub(r"\b[a-z]{6}\b", "<word>", text).replace("...", "<word>")
    lines = []
    for line in text.split("\n"):
        needles = MASKED_NEEDLE.findall(line)
        if needles and len(MASKED_NEEDLE.sub(" ", line).split()) > 30:  # an essay with needles inside
            line = "<essay> " + " ".join(sorted(set(needles)))
        lines.append(line)
    out: list[str] = []
    run: list[str] = []
    for line in [*lines, None]:
        if line is not None and (line == "<noise>" or MASKED_NEEDLE.fullmatch(line) or MASKED_VAR.fullmatch(line)):
            run.append(line)
            continue
        out += sorted(set(run))
        run = []
        if line is not None:
            out.append(line)
    text = "\n".join(out)
    for unit in ("<item>", "<word>"):
        text = re.sub(rf"{unit}(?:\s*{unit})+", unit, text)
    return text


# nltk's trained punkt model cannot be downloaded offline; RULER's scripts then split essays with an
# untrained Punkt (the same algorithm without learned abbreviations). Installed only when punkt is absent.
PUNKT_SHIM = """
import nltk, nltk.tokenize
try:
    nltk.data.find("tokenizers/punkt_tab")
except LookupError:
    _punkt = nltk.tokenize.PunktSentenceTokenizer()
    nltk.tokenize.sent_tokenize = lambda text, language="english": _punkt.tokenize(text)
"""


def builtin_data(ruler: Path, work: Path) -> tuple[Path, dict[str, Path]]:
    """A copy of RULER's scripts whose ``json/`` holds headprobe's built-in data in RULER's file formats
    (the essay as ``PaulGrahamEssays.json``, the built-in QA sets as SQuAD v2 and HotpotQA files), and
    the same data as the files headprobe reads."""
    from headprobe.evals.ruler.builders import EssayCorpus, _pseudo_word
    from headprobe.evals.ruler.qa import builtin_qa

    scripts = work / "RULER" / "scripts"
    shutil.copytree(ruler / "scripts", scripts, dirs_exist_ok=True)
    folder = scripts / "data" / "synthetic" / "json"
    # cwe's word list beyond wonderwords' (a git-LFS file absent from a checkout): our pseudo-words
    (folder / "english_words.json").write_text(json.dumps({str(i): _pseudo_word(i) for i in range(50_000)}))
    essay = " ".join(EssayCorpus().first(200_000))
    (folder / "PaulGrahamEssays.json").write_text(json.dumps({"text": essay}))
    (work / "essay.txt").write_text(essay)
    squad = builtin_qa("squad", 400)
    articles = [
        {
            "title": f"article {a}",
            "paragraphs": [
                {
                    "context": squad.document(q.gold[0]),
                    "qas": [
                        {
                            "question": q.question,
                            "id": str(i),
                            "is_impossible": False,
                            "answers": [{"text": t, "answer_start": 0} for t in q.answers],
                        }
                    ],
                }
                for i, q in enumerate(squad.questions[5 * a : 5 * a + 5], start=5 * a)
            ],
        }
        for a in range(len(squad.questions) // 5)
    ]
    (folder / "squad.json").write_text(json.dumps({"version": "v2.0", "data": articles}))
    hotpot = builtin_qa("hotpotqa", 400)

    def titled(i: int) -> list:
        text = hotpot.document(i)
        return [f"doc {i}", [text]]

    items = [
        {
            "_id": str(i),
            "question": q.question,
            "answer": q.answers[0],
            "context": [titled(j) for j in (*q.gold, *range(2 * i + 2, 2 * i + 10))],
        }
        for i, q in enumerate(hotpot.questions)
    ]
    (folder / "hotpotqa.json").write_text(json.dumps(items))
    return work / "RULER", {"squad": folder / "squad.json", "hotpotqa": folder / "hotpotqa.json"}


def ruler_samples(ruler: Path, task: str, length: int, n: int, tokenizer: Path, out: Path, path: str) -> list[dict]:
    """RULER's samples of ``task``: ``out/<task>/validation.jsonl``, made by RULER's ``prepare.py`` unless
    an earlier run left it there (``--reuse``)."""
    done = out / task / "validation.jsonl"
    if done.is_file() and len(done.read_text().splitlines()) == n:
        return [json.loads(line) for line in done.read_text().splitlines()]
    shim = out.parent / "punkt-shim"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "sitecustomize.py").write_text(PUNKT_SHIM)
    paths = (str(shim), path, os.environ.get("PYTHONPATH", ""))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    cmd = [
        sys.executable, "prepare.py", "--save_dir", str(out), "--benchmark", "synthetic", "--task", task,
        "--tokenizer_path", str(tokenizer), "--tokenizer_type", "hf", "--max_seq_length", str(length),
        "--model_template_type", "base", "--num_samples", str(n),
    ]  # fmt: skip
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")  # prepare.py calls `python`
    run = subprocess.run(cmd, cwd=ruler / "scripts" / "data", env=env, capture_output=True, text=True)
    if run.returncode or not done.is_file():
        last = (run.stderr or run.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"RULER's prepare.py failed: {last[0][:160]}")
    return [json.loads(line) for line in done.read_text().splitlines()]


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
    ap.add_argument("--reuse", type=Path, help="the work folder of an earlier run: RULER's samples there are reused")
    args = ap.parse_args()
    work = args.reuse or Path(tempfile.mkdtemp(prefix="ruler-side-by-side-"))
    print(f"work folder {work}", file=sys.stderr)
    folder = toy_tokenizer_folder(work / "tokenizer") if args.tokenizer == "toy" else Path(args.tokenizer)
    ruler, qa_files = builtin_data(args.ruler, work)
    tokenizer = load_tokenizer(str(folder / "tokenizer.json"))
    ours = RulerGenerator(tokenizer, seed=42, fit="ruler", haystack_files=[work / "essay.txt"], qa_files=qa_files)
    print(f"{args.samples} samples per task, tokenizer {args.tokenizer}, seed 42 (RULER's default)\n")
    print("| task @ length | RULER size (largest sample) | headprobe size | RULER units per sample | headprobe units "
          "| RULER tokens | headprobe tokens | template |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for item in args.tasks.split(","):
        task, _, at = item.partition("@")
        length = int(at or args.length)
        out = work / ("ruler" if length == args.length else f"ruler-{length}")
        try:
            theirs = ruler_samples(ruler, task, length, args.samples, folder, out, args.pythonpath)
        except RuntimeError as err:
            print(f"| {task} @ {length:,} | {err} | | | | | | |")
            continue
        mine = [ours.sample(task, length, i) for i in range(args.samples)]
        gen = TASKS[task].tokens_to_generate
        size = ours.ruler_size(TASKS[task], length, length - gen) if task != "fwe" else None
        r_units, o_units = [units(task, s["input"]) for s in theirs], [units(task, s["input"]) for s in mine]
        r_tok, o_tok = [s["length"] - gen for s in theirs], [s["token_count"] for s in mine]
        a = masked(theirs[0]["input"] + theirs[0]["answer_prefix"])
        b = masked(mine[0]["input"] + mine[0]["answer_prefix"])
        print(
            f"| {task} @ {length:,} | {max(r_units)} | {size if size is not None else max(o_units)} | "
            f"{', '.join(map(str, r_units))} | {', '.join(map(str, o_units))} | "
            f"{min(r_tok):,}–{max(r_tok):,} | {min(o_tok):,}–{max(o_tok):,} | {'equal' if a == b else 'differs'} |"
        )
        if a != b:
            a, b = a.splitlines(), b.splitlines()
            diff = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            print(f"  first difference at line {diff}: RULER {a[diff : diff + 1]} | headprobe {b[diff : diff + 1]}")


if __name__ == "__main__":
    main()
