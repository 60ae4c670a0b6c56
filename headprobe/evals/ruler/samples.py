"""Where an evaluation's samples come from: generated for the model's tokenizer, or read from a file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headprobe.evals.ruler.generate import RulerError
from headprobe.text.jsonl import jsonl_records

SAMPLE_FIELDS = {"index", "input", "outputs", "length", "answer_prefix", "task"}


def qa_file_kinds(paths: list[str] | None) -> dict[str, Path]:
    """Tell SQuAD (an object with ``data``) from HotpotQA (a list) by their original formats."""
    out: dict[str, Path] = {}
    for p in paths or []:
        path = Path(p)
        if not path.is_file():
            raise RulerError(f"QA file {path} does not exist")
        with path.open(encoding="utf-8") as f:
            head = f.read(1 << 16).lstrip()
        kind = "hotpotqa" if head.startswith("[") else "squad" if head.startswith("{") else None
        if kind is None:
            raise RulerError(f"{path} is neither SQuAD v2 (a JSON object) nor HotpotQA (a JSON list)")
        out[kind] = path
    return out


def read_samples(path: str | Path) -> list[dict[str, Any]]:
    """RULER-format samples from a JSON-lines file (``headprobe ruler generate`` or RULER's own)."""
    path = Path(path)
    if not path.is_file():
        raise RulerError(f"data file {path} does not exist")
    samples = []
    for lineno, sample in jsonl_records(path.read_text(encoding="utf-8"), path, RulerError):
        missing = SAMPLE_FIELDS - set(sample)
        if missing:
            raise RulerError(f"{path}:{lineno}: missing RULER fields {sorted(missing)}")
        samples.append(sample)
    return samples
