"""Where a result table came from, written with it and read back: the library versions that decide the
numbers (:func:`versions`), each table's metadata (:func:`table_meta`: this process's command, the versions,
the checkpoint's identity) and the tables written with it (:func:`write_results`); and whose rows a table
holds (:func:`not_of`, :func:`tables_of`: of this checkpoint, by its identity, or of another)."""

from __future__ import annotations

import contextlib
import json
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from headprobe.core.identity import changed_since, checkpoint_identity, identity_changes
from headprobe.core.paths import file_sha256
from headprobe.core.resume import resume_key
from headprobe.core.steps import StepInfo
from headprobe.hooked.gguf import SOURCE_FILE
from headprobe.results import Schema, Table, TableMeta, same_path, write_table


def versions() -> dict[str, str]:
    """Versions of Python and the libraries that decide the numbers."""
    import importlib.metadata as md

    out = {"python": platform.python_version(), "torch": torch.__version__}
    for pkg in ("headprobe", "transformers", "transformer-lens"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[pkg] = md.version(pkg)
    return out


def table_meta(
    table: str, model: str | None, checkpoint: str | Path | None, settings: dict[str, Any], **kw
) -> TableMeta:
    """A :class:`TableMeta` with this process's command and library versions, and the checkpoint's identity
    (:func:`headprobe.core.identity.checkpoint_identity`)."""
    return TableMeta(
        table=table,
        model=model,
        checkpoint=None if checkpoint is None else str(checkpoint),
        settings=resume_key(**settings),
        command=list(sys.argv),
        versions=versions(),
        identity={} if checkpoint is None else checkpoint_identity(checkpoint),
        **kw,
    )


def write_results(
    folder: Path,
    model: str,
    checkpoint: str | Path,
    settings: dict[str, Any],
    tables: Sequence[tuple[Schema, pd.DataFrame]],
    facts: dict[str, Any] | None = None,
) -> None:
    """Write each ``(schema, frame)`` as ``folder/<table>.parquet`` with this run's metadata (``facts``: what
    the model declared, :meth:`headprobe.hooked.HookedModel.facts`), and with a ``model`` column (``model``
    where the frame has none): every table of a results folder names the model its rows describe (the
    contract of :func:`headprobe.results.collect`), however the frame was made. A checkpoint that is a training
    step folder (:mod:`headprobe.core.steps`) gives every table ``step`` and ``tokens`` columns too: where in
    its training the model was (``analyze RUN --steps``)."""
    step = StepInfo.of(checkpoint)
    for schema, frame in tables:
        if "model" not in frame.columns:  # e.g. a table combined from per-sample parts (retrieval's)
            frame = frame.assign(model=model)
        if step is not None:
            frame = frame.assign(step=step.step, tokens=pd.array([step.tokens] * len(frame), dtype="Int64"))
        meta = table_meta(schema.table, model, checkpoint, settings, model_facts=facts or {})
        write_table(folder / f"{schema.table}.parquet", frame, meta, schema)


def _gguf_sha256(path: Path) -> str | None:
    """The SHA-256 of the GGUF file a checkpoint is, or was converted from (a converted folder's record)."""
    if path.is_file():
        return file_sha256(path)
    try:
        return json.loads((path / SOURCE_FILE).read_text()).get("sha256")
    except (OSError, ValueError, AttributeError):
        return None


def not_of(meta: TableMeta, checkpoint: str | Path | None, name: str) -> str | None:
    """Why a table's rows are not of the checkpoint at ``checkpoint`` (whose results name is ``name``), as
    words that follow its model's name (``(another checkpoint, /x/d32/final)``); ``None`` when they are of it.

    They are when the table records this checkpoint's identity
    (:func:`headprobe.core.identity.checkpoint_identity`: the same weights, at this path or moved), or the
    GGUF file it is or was converted from (by content; a GGUF file and its converted folder are named apart);
    a table that records no identity (written before headprobe did) is taken by its checkpoint's path, else
    by its name. Without a ``checkpoint``, by the name alone."""
    if checkpoint is None:
        return None if meta.model == name else "(another model)"
    path, found = Path(checkpoint), meta.identity or {}
    source = (meta.model_facts or {}).get("source") or {}
    if source.get("sha256") and source.get("sha256") == _gguf_sha256(path):
        return None
    if not found:
        recorded = meta.checkpoint
        if recorded and (same_path(recorded, path.resolve()) or Path(recorded).resolve() == path.resolve()):
            return None
        return None if meta.model == name else f"(another checkpoint{f', {recorded}' if recorded else ''})"
    mine = checkpoint_identity(path)
    if found.get("weights") == mine.get("weights") and not identity_changes(found, mine):
        return None
    if same_path(found.get("path", ""), mine.get("path", path.resolve())):
        return f"(made from {path} as it was on {found.get('modified')}; {changed_since(found, mine)})"
    return f"(another checkpoint, {found.get('path')})"


def tables_of(tables: Sequence[Table], checkpoint: str | Path | None, name: str) -> tuple[list[Table], str]:
    """The ``tables`` whose rows are of the checkpoint at ``checkpoint`` (:func:`not_of`) and, when none is,
    what the others are of, to name in a refusal (``toy-d32-s0-pt-final (another checkpoint, /x/d32/final)``)."""
    mine = [t for t in tables if not_of(t.meta, checkpoint, name) is None]
    others = dict.fromkeys(f"{t.meta.model or t.path} {not_of(t.meta, checkpoint, name)}" for t in tables)
    return mine, ", ".join(others)
