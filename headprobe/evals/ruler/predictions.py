"""The working files of ``ruler eval``: ``OUT/<model>/predictions/<task>-<length>.jsonl``, appended as batches
finish, so a rerun continues where a run stopped; ``OUT/<model>/predictions/run.json`` holds the resume key they
were made with, and a run with another key is refused instead of mixing predictions. Under ``torchrun``
process ``r > 0`` appends to ``<task>-<length>.p<r>.jsonl`` instead (one writer per file), and every
reader takes the predictions of all of a task and length's files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from headprobe.core.atomic import atomic_write_text
from headprobe.core.identity import changed_since, identity_changes
from headprobe.core.paths import CONTENT, changed_files
from headprobe.core.resume import changed_inputs, shown_value
from headprobe.evals.ruler.settings import RulerError

CLAIM = "run.json"


def _shown(value: Any, name: str = "") -> str:
    """A key's value in a message: a list as its comma list (the command line's form), a long path short,
    ``None`` as what it means (:func:`headprobe.core.resume.shown_value`: ``--dtype`` as saved)."""
    if value is None:
        return shown_value(name, value)
    if isinstance(value, list):
        return ",".join(map(str, value)) or "none"
    text = str(value)
    return text if len(text) <= 60 else f"...{text[-57:]}"


class Predictions:
    """The prediction files of one model's evaluation (in ``OUT/<model>/predictions/``)."""

    def __init__(self, out: Path, writer: int = 0) -> None:
        """``writer``: the process (rank) whose file :meth:`append` writes and :meth:`done` may repair."""
        self.folder = Path(out) / "predictions"
        self.writer = writer

    def check(self, key: dict[str, Any]) -> bool:
        """Refuse when the folder holds predictions made from something other than ``key``; whether it
        holds a claim (writes nothing: call it before costly work, :meth:`claim` once there is work)."""
        path = self.folder / CLAIM
        if not path.exists():
            return False
        old = json.loads(path.read_text(encoding="utf-8"))
        differ = sorted(k for k in key if k in old and old[k] != key[k])  # a field older runs did not record: any
        made = {"weights": old.get("weights"), "config": old.get("config")}
        now = {"weights": key.get("weights"), "config": key.get("config")}
        if "checkpoint" not in differ and identity_changes(made, now):
            raise RulerError(
                f"{self.folder.parent} holds predictions of {key.get('checkpoint')} as it was when they were made; "
                f"{changed_since(made, now)}, so they are no longer its predictions: use another `out`, or delete "
                f"{self.folder.parent} to start over"
            )
        if files := changed_files(old, key):
            raise RulerError(changed_inputs(files, self.folder.parent))
        differ = [k for k in differ if not k.endswith(CONTENT)]  # a file's path differs: named by its setting
        if differ:
            changes = "; ".join(f"`{k}` {_shown(old[k], k)} there, {_shown(key[k], k)} now" for k in differ)
            raise RulerError(
                f"{self.folder.parent} holds predictions made with other settings ({changes}); rerun with those, "
                f"use another `out`, or delete {self.folder.parent} to start over"
            )
        return True

    def claim(self, key: dict[str, Any]) -> None:
        """Record what the predictions are made from, or refuse when they were made from something else."""
        if not self.check(key):
            self.folder.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.folder / CLAIM, json.dumps(key, indent=2) + "\n")

    def path(self, task: str, length: int) -> Path:
        """This writer's file of ``task`` at ``length``."""
        tail = "" if self.writer == 0 else f".p{self.writer}"
        return self.folder / f"{task}-{length}{tail}.jsonl"

    def done(self, task: str, length: int) -> dict[int, dict[str, Any]]:
        """Predictions already written, in every writer's file, by sample index in increasing order (a torn
        last line from an interruption is dropped, and removed from this writer's own file)."""
        own = self.path(task, length)
        files = [self.folder / f"{task}-{length}.jsonl", *sorted(self.folder.glob(f"{task}-{length}.p*.jsonl"))]
        rows = {}
        for path in (f for f in files if f.exists()):
            good, lines = [], path.read_text(encoding="utf-8").splitlines()
            for line in lines:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                rows[row["index"]] = row
                good.append(line)
            if path == own and len(good) < len(lines):  # only to drop a torn line; others' files are read only
                atomic_write_text(path, "".join(g + "\n" for g in good))
        return dict(sorted(rows.items()))

    def append(self, task: str, length: int, rows: list[dict[str, Any]]) -> None:
        """Add finished predictions (one JSON line each) to this writer's file."""
        path = self.path(task, length)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write("".join(json.dumps(row) + "\n" for row in rows))
