"""A job's finished parts, and a rerun checked against them: :class:`Parts` (one model's finished work items,
``<folder>/parts/<table>-<item>.parquet``, each with the resume key it was made with) and
:func:`check_parts` (the refusal, before any work, of a folder whose parts were made from another checkpoint,
with other settings or from other input files)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from headprobe.core.identity import changed_since, checkpoint_identity, identity_changes
from headprobe.core.outputs import OutputRefused
from headprobe.core.paths import CONTENT, changed_files
from headprobe.core.resume import changed_inputs, shown_value
from headprobe.results import Schema, TableMeta, read_meta, read_table, write_table


class Parts:
    """The finished work items of one model's job: ``<folder>/parts/<table>-<item>.parquet``, each carrying
    the resume key that produced it. A rerun skips items whose key matches and redoes the rest; an
    interrupted run leaves the finished parts and nothing half-written."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder) / "parts"

    def path(self, table: str, item: str) -> Path:
        return self.folder / f"{table}-{item}.parquet"

    def done(self, table: str, item: str, key: dict[str, Any]) -> bool:
        meta = read_meta(self.path(table, item))
        return meta is not None and meta.key == key

    def write(self, table: Schema, item: str, frame: pd.DataFrame, meta: TableMeta) -> None:
        write_table(self.path(table.table, item), frame, meta, table)

    def differences(
        self, keys: Sequence[dict[str, Any]], free: Sequence[str], by: str = "metric", own: Sequence[str] = ()
    ) -> dict[str, tuple[Any, Any]]:
        """What the finished parts were made from that ``keys`` (this run's, one per work item) would change:
        ``{field: (the part's value, this run's)}`` for each field, other than the ``free`` ones (those a
        rerun may vary: the metric, the length ...), in which a part's key differs from this run's key of
        the same ``by`` (the metric; ablate's task), or of any when this run has none of it (then without the
        fields ``own`` to each, e.g. the needle task's depths); empty when every part fits this run."""
        by_group = {k.get(by): k for k in keys}
        found: dict[str, tuple[Any, Any]] = {}
        for path in sorted(self.folder.glob("*.parquet")) if keys else []:
            meta = read_meta(path)
            if meta is None or meta.key is None:
                continue
            same = meta.key.get(by) in by_group
            new = by_group.get(meta.key.get(by), keys[0])
            for name in sorted(set(meta.key) & set(new) - set(free) - (set() if same else set(own))):
                if meta.key[name] != new[name]:
                    found.setdefault(name, (meta.key[name], new[name]))
        return found

    def weights_changed(self, checkpoint: str | Path) -> str | None:
        """If the checkpoint at ``checkpoint`` (the same path) holds other weights or config files now than a
        finished part was made from (:func:`headprobe.core.identity.checkpoint_identity`), when that was and
        what changed, in words (``on 2026-12-06T10:31:05+00:00; its weights or config changed since
        (config.json differs)``); ``None`` when every part records this checkpoint as it is, or records nothing
        of it (written before headprobe did)."""
        now = checkpoint_identity(checkpoint)
        for path in sorted(self.folder.glob("*.parquet")) if now else []:
            meta = read_meta(path)
            made = (meta.identity or {}) if meta is not None else {}
            if identity_changes(made, now):
                return f"on {made.get('modified')}; {changed_since(made, now)}"
        return None

    def keys(self, table: str) -> dict[str, dict[str, Any] | None]:
        """Every finished part of ``table`` by item (``entropy-512-s0.parquet`` -> ``512-s0``), with its
        resume key (``None`` for a file without one)."""
        found = {}
        for path in sorted(self.folder.glob(f"{table}-*.parquet")):
            meta = read_meta(path)
            found[path.stem[len(table) + 1 :]] = None if meta is None else meta.key
        return found

    def gather(self, table: str, items: Sequence[str]) -> pd.DataFrame:
        """The parts of ``items`` in order, concatenated."""
        return pd.concat([read_table(self.path(table, i)).frame for i in items], ignore_index=True)


def check_parts(
    parts: Parts,
    keys: Sequence[dict[str, Any]],
    folder: Path,
    free: Sequence[str],
    by: str = "metric",
    own: Sequence[str] = (),
) -> None:
    """Refuse, before any work, a model's results folder whose finished parts were made from another
    checkpoint or with other settings than this run's ``keys`` would (:meth:`Parts.differences`): a rerun
    adds what the ``free`` fields vary (metrics, lengths, head sets ...) to a folder, and never replaces one
    model's results by another's, or mixes settings."""
    found = parts.differences(keys, free, by, own)
    checkpoint = next((k["checkpoint"] for k in keys if k.get("checkpoint")), None)
    if checkpoint and "checkpoint" not in found and (when := parts.weights_changed(checkpoint)):
        raise OutputRefused(
            f"{folder} holds results of {checkpoint} as it was {when}, so they are no longer its results: give "
            f"another `out`, or delete {folder} to redo them"
        )
    if "checkpoint" in found:
        raise OutputRefused(
            f"{folder} holds the results of another checkpoint ({found['checkpoint'][0]}); give another `out`, "
            f"or delete {folder} to start over"
        )
    if files := changed_files({k: v[0] for k, v in found.items()}, {k: v[1] for k, v in found.items()}):
        raise OutputRefused(changed_inputs(files, folder))
    found = {k: v for k, v in found.items() if not k.endswith(CONTENT)}  # a file's path differs: named by its setting
    if found:
        changes = "; ".join(f"`{k}` {shown_value(k, a)} there, {shown_value(k, b)} now" for k, (a, b) in found.items())
        raise OutputRefused(
            f"{folder} holds results made with other settings ({changes}); rerun with the same settings, give "
            f"another `out`, or delete {folder} to start over"
        )
