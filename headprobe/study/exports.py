"""A trained grid handed to evaluators outside headprobe, by path.

Each chosen run of a grid is exported as a Hugging Face model folder (:func:`headprobe.export.hf.export_hf`)
into ``OUT/hf/<model>/``; an export whose source weights have not changed since is kept, so a rerun exports
only what is new. With a ``command`` (an argument list; ``{path}``, ``{name}`` and ``{out}`` in its
arguments become the export's folder, the run's results name and ``OUT/external/<model>/``), each export is
handed to it: it runs without a shell, its output is kept in ``OUT/external/<model>/log.txt``, and the table
records its exit code. ``OUT/tables/study_exports.parquet`` lists every exported run.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from headprobe.core.atomic import atomic_write_text
from headprobe.core.paths import file_sha256
from headprobe.core.progress import Progress, Silent
from headprobe.export.hf import ORIGIN_KEY, export_hf
from headprobe.jobs.checkpoints import checkpoint_name
from headprobe.jobs.folders import held_folder
from headprobe.model.checkpoint import CONFIG_FILE, WEIGHTS_FILE
from headprobe.results import Column, Schema, TableMeta, table_path, write_table
from headprobe.study.settings import StudyError
from headprobe.study.tables import WHO_COLUMNS

STUDY_EXPORTS = Schema(
    "study_exports",
    (
        *WHO_COLUMNS,
        Column("checkpoint", "str", "the run's checkpoint folder"),
        Column("path", "str", "its Hugging Face folder (headprobe export hf)"),
        Column("exit_code", "float", "the command's exit code; missing without a command"),
    ),
)
PLACEHOLDERS = ("{path}", "{name}", "{out}")


def _current(folder: Path, source: str) -> bool:
    """``folder`` holds an export of the checkpoint whose weights have SHA-256 ``source``."""
    try:
        origin = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8")).get(ORIGIN_KEY) or {}
    except (OSError, json.JSONDecodeError):
        return False
    return origin.get("source_sha256") == source


def export_runs(
    manifest: dict[str, Any],
    out: str | Path,
    runs: Sequence[str] | None = None,
    command: Sequence[str] | None = None,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """Export the finished ``runs`` (names of the recipe's runs; ``None``: every run) of the grid
    ``manifest`` and hand each to ``command`` (module docstring); returns the ``study_exports`` table."""
    out, progress = Path(out), progress or Silent()
    chosen = [r for r in manifest.get("runs", []) if runs is None or r["run"] in runs]
    if not chosen:
        raise StudyError(f"the grid's manifest lists no finished run{' among ' + ', '.join(runs) if runs else ''}")
    if command is not None and (not command or not any(p in arg for arg in command for p in PLACEHOLDERS)):
        raise StudyError(f"the command {list(command)} never names the export: put {{path}} where its folder goes")
    with held_folder(out, "study"):  # a study's results folder, which the analyses scripts share
        progress.start(len(chosen), "export")
        rows = [_export_one(run, out, command, progress) for run in chosen]
        table = pd.DataFrame(rows).astype({"exit_code": float})
        meta = TableMeta(table=STUDY_EXPORTS.table, settings={"runs": list(runs or []), "command": list(command or [])})
        write_table(table_path(out / "tables", STUDY_EXPORTS.table), table, meta, STUDY_EXPORTS)
    return table


def _export_one(run: dict[str, Any], out: Path, command: Sequence[str] | None, progress: Progress) -> dict[str, Any]:
    """Export one run of the grid into ``OUT/hf/<model>/`` (kept while its weights are unchanged) and hand it
    to ``command``; its row of ``study_exports``."""
    name = checkpoint_name(run["checkpoint"])
    folder, source = out / "hf" / name, file_sha256(Path(run["checkpoint"]) / WEIGHTS_FILE)
    if not _current(folder, source):
        export_hf(run["checkpoint"], folder, overwrite=True)
    exit_code = None
    if command is not None:
        external = out / "external" / name
        external.mkdir(parents=True, exist_ok=True)
        fill = {"{path}": str(folder), "{name}": name, "{out}": str(external)}
        args = [_filled(arg, fill) for arg in command]
        done = subprocess.run(args, capture_output=True, text=True)
        atomic_write_text(external / "log.txt", f"$ {' '.join(args)}\n{done.stdout}{done.stderr}")
        exit_code = done.returncode
        if exit_code:
            progress.log(f"{name}: the command exited with {exit_code} (see {external / 'log.txt'})")
    progress.advance()
    return {"model": name, "member": run["member"], "seed": run["seed"], "run": run["run"],
            "checkpoint": str(run["checkpoint"]), "path": str(folder), "exit_code": exit_code}  # fmt: skip


def _filled(arg: str, fill: dict[str, str]) -> str:
    for placeholder, value in fill.items():
        arg = arg.replace(placeholder, value)
    return arg
