"""Where an evaluation's samples come from: generated for the model's tokenizer, or read from a file; the
tasks skipped at a length, as the samples record them."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from headprobe.core.paths import not_a, read_utf8
from headprobe.evals.ruler.settings import RulerError
from headprobe.text.jsonl import jsonl_records

SAMPLE_FIELDS = {"index", "input", "outputs", "length", "answer_prefix", "task"}


def qa_file_kinds(paths: list[str] | None) -> dict[str, Path]:
    """Tell SQuAD (an object with ``data``) from HotpotQA (a list) by their original formats."""
    out: dict[str, Path] = {}
    for p in paths or []:
        path = Path(p)
        if why := not_a(path, "file"):
            raise RulerError(f"`qa_files` {path} {why}")
        with path.open("rb") as f:  # enough to tell the formats apart; the whole file is read as UTF-8 later
            head = f.read(1 << 16).decode("utf-8", errors="replace").lstrip()
        kind = "hotpotqa" if head.startswith("[") else "squad" if head.startswith("{") else None
        if kind is None:
            raise RulerError(f"{path} is neither SQuAD v2 (a JSON object) nor HotpotQA (a JSON list)")
        out[kind] = path
    return out


def read_samples(path: str | Path) -> list[dict[str, Any]]:
    """RULER-format samples from a JSON-lines file (``headprobe ruler generate`` or RULER's own)."""
    path = Path(path)
    samples = []
    for lineno, sample in jsonl_records(read_utf8(path, "`data`", RulerError), path, RulerError):
        missing = SAMPLE_FIELDS - set(sample)
        if missing:
            raise RulerError(f"{path}:{lineno}: missing RULER fields {sorted(missing)}")
        samples.append(sample)
    return samples


def skipped_tasks(samples: Iterable[dict[str, Any]], tasks: Collection[str] | None = None) -> dict[int, dict[str, int]]:
    """Length -> task -> about the shortest length it fits, for the tasks the samples say were skipped at
    their length (``skipped_tasks``, written by :meth:`~headprobe.evals.ruler.RulerGenerator.samples`),
    of ``tasks`` only when given."""
    out: dict[int, dict[str, int]] = {}
    for x in samples:
        for task, needed in (x.get("skipped_tasks") or {}).items():
            if tasks is None or task in tasks:
                out.setdefault(int(x["length"]), {})[task] = int(needed)
    return dict(sorted(out.items()))


def skip_warnings(skipped: dict[int, dict[str, int]]) -> list[str]:
    """One warning per length of :func:`skipped_tasks`, naming the tasks and the length each needs (and,
    for cwe from 4,096 tokens, where RULER's rule keeps its large word counts, the rule that fits)."""
    return [
        f"warning: skipped at length {length:,}, too short for their smallest prompts: "
        + ", ".join(f"{task} (needs about {needed:,})" for task, needed in tasks.items())
        + "; left out of that length's mean over tasks"
        + ("; `cwe_rule` fit keeps cwe with its small word counts" if "cwe" in tasks and length >= 4096 else "")
        for length, tasks in skipped.items()
    ]
