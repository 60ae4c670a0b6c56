"""What every job (``analyze``, ``ruler eval``, ``shortctx eval``) shares: running over many
checkpoints with failures isolated, result-folder names, resume keys and finished parts, the run
record, library versions, the memory budget, and how progress is reported.

Progress reaches the user through the :class:`Progress` protocol: the library reports, the command
line draws (rich bars in :mod:`headprobe.cli.progress`); the library itself draws nothing.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import platform
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import pandas as pd
import torch

from headprobe.core.atomic import LOCK_FILE, atomic_write_text, folder_lock, missing_folders, remove_if_empty
from headprobe.core.errors import HeadprobeError, SettingError
from headprobe.core.outputs import RUN_FILE, OutputRefused, claim, command_of, job_results
from headprobe.core.paths import CONTENT, changed_files, file_sha256
from headprobe.core.ranks import Ranks
from headprobe.hooked.gguf import SOURCE_FILE
from headprobe.hooked.load import model_name
from headprobe.model.budget import MemoryEstimate
from headprobe.results import Schema, Table, TableMeta, collect, read_meta, read_table, same_path, write_table

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------
# Progress
# ---------------------------------------------------------------------------------------------
class Progress(Protocol):
    """How long work reports itself. ``start`` sets the amount of work, ``advance`` counts finished units,
    ``describe`` says what is being worked on, ``log`` reports a line (e.g. a skipped item)."""

    def start(self, total: int, description: str = "") -> None: ...

    def advance(self, n: int = 1) -> None: ...

    def describe(self, description: str) -> None: ...

    def log(self, message: str) -> None: ...


class Silent:
    """A :class:`Progress` that reports nothing (the default of every library call)."""

    def start(self, total: int, description: str = "") -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass

    def describe(self, description: str) -> None:
        pass

    def log(self, message: str) -> None:
        pass


# ---------------------------------------------------------------------------------------------
# Names, versions, keys
# ---------------------------------------------------------------------------------------------
def checkpoint_name(path: str | Path) -> str:
    """The results sub-folder of a checkpoint: its one name (:func:`headprobe.hooked.model_name`), the name
    its loaded model, logs and errors use too (``runs/grid/toy-d16/s0/pt/final`` -> ``toy-d16-s0-pt-final``)."""
    return model_name(path)


def unique_names(checkpoints: Sequence[str | Path], out: Path | None = None) -> list[str]:
    """:func:`checkpoint_name` of each checkpoint; raises, naming both paths, when two would share a results
    folder (in ``out``)."""
    names = [checkpoint_name(c) for c in checkpoints]
    for i, name in enumerate(names):
        if name in names[:i]:
            first = checkpoints[names.index(name)]
            folder = out / name if out is not None else f"OUT/{name}"
            base = out if out is not None else Path("OUT")
            if Path(first).resolve() == Path(checkpoints[i]).resolve():
                raise SettingError(
                    f"{first} and {checkpoints[i]} are the same checkpoint, and would share a results folder "
                    f"({folder}); give it once"
                )
            raise SettingError(
                f"{first} and {checkpoints[i]} would share a results folder, {folder} (both are named {name}, "
                f"after their last folders); run them one at a time, each into its own `out` (e.g. "
                f"{base.parent / (base.name + '-1')} and {base.parent / (base.name + '-2')})"
            )
    return names


def versions() -> dict[str, str]:
    """Versions of Python and the libraries that decide the numbers."""
    import importlib.metadata as md

    out = {"python": platform.python_version(), "torch": torch.__version__}
    for pkg in ("headprobe", "transformers", "transformer-lens"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[pkg] = md.version(pkg)
    return out


def repeated_lengths(lengths: Sequence[int]) -> str | None:
    """The refusal of a job's ``lengths`` that name a length twice (its items and parts would collide),
    naming the repeats; ``None`` when each length is there once."""
    twice = sorted({n for n in lengths if list(lengths).count(n) > 1})
    return f"`lengths` lists {', '.join(map(str, twice))} more than once; give each length once" if twice else None


def done_earlier(what: str, done: int, total: int) -> str:
    """The line a rerun logs for work it skips: ``what`` (a model, metric or task at a length) and how much
    of it (``done`` of ``total`` samples) was finished by an earlier run."""
    part = "done earlier" if done == total else f"{done} of {total} samples done earlier"
    return f"{what}: {part}, skipped"


def resume_key(**fields: Any) -> dict[str, Any]:
    """A resume key: the values that decide a work item's numbers, in the form they take in JSON (so a
    key read back from a file compares equal to a freshly made one)."""
    return json.loads(json.dumps(fields, default=str))


def table_meta(
    table: str, model: str | None, checkpoint: str | Path | None, settings: dict[str, Any], **kw
) -> TableMeta:
    """A :class:`TableMeta` with this process's command and library versions, and the checkpoint's identity
    (:func:`checkpoint_identity`)."""
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


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")  # the files a checkpoint folder's weights are in
# the files beside the weights that decide a model's numbers too: its shape, RoPE and window (config.json), its
# tokens, chat template and end ids (the tokenizer's and generation files)
CONFIG_FILES = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "chat_template.jinja", "chat_template.json", "tokenizer.model", "vocab.json", "merges.txt",
)  # fmt: skip


def checkpoint_identity(checkpoint: str | Path) -> dict[str, Any]:
    """What tells a checkpoint from every other, read without reading a weight (recorded with its results,
    :attr:`headprobe.results.TableMeta.identity`): ``path``, the checkpoint resolved; ``weights``, a
    fingerprint of its weight files (a GGUF file itself, or a folder's ``*.safetensors``, ``*.bin``,
    ``*.pt``, ``*.pth``, ``*.gguf``: each one's name, size in bytes and modification time in ns, hashed), so
    that a checkpoint retrained or replaced at one path is another; ``config``, a folder's
    :data:`CONFIG_FILES` by name with a fingerprint of each one's content (SHA-256), so that one whose config
    or tokenizer was edited is another too (a GGUF file holds them in itself; tables written before headprobe
    recorded them lack it); ``modified``, when the newest of all those files was written (UTC, ISO 8601 to the
    second). Empty for a path that does not exist."""
    path = Path(checkpoint)
    if path.is_file():
        files, configs = [path], []
    elif path.is_dir():
        files = sorted(f for f in path.iterdir() if f.suffix in WEIGHT_SUFFIXES and f.is_file())
        configs = [path / name for name in CONFIG_FILES if (path / name).is_file()]
    else:
        return {}
    stats = [(f.name, f.stat()) for f in files]
    listed = json.dumps([(name, st.st_size, st.st_mtime_ns) for name, st in stats])
    newest = max((f.stat().st_mtime for f in [*files, *configs]), default=None)
    return {
        "path": str(path.resolve()),
        "weights": hashlib.sha256(listed.encode()).hexdigest()[:16],
        "config": {f.name: file_sha256(f)[:16] for f in configs},
        "modified": None
        if newest is None
        else _dt.datetime.fromtimestamp(newest, _dt.timezone.utc).isoformat(timespec="seconds"),
    }


def identity_changes(made: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What of a checkpoint changed between two of its identities (:func:`checkpoint_identity`): ``weights``
    and the names of the config files added or edited; empty when they agree in all that both record (an
    identity written before the config files were recorded tells nothing of them). A file removed since is
    left to loading the checkpoint, which names it as missing and how to restore it."""
    changed = ["weights"] if made.get("weights") and now.get("weights") and made["weights"] != now["weights"] else []
    before, after = made.get("config"), now.get("config")
    if isinstance(before, dict) and isinstance(after, dict):
        changed += [name for name in CONFIG_FILES if name in after and before.get(name) != after[name]]
    return changed


def changed_since(made: dict[str, Any], now: dict[str, Any]) -> str:
    """:func:`identity_changes` in words, for a message: ``its weights or config changed since (config.json
    differs)``."""
    changed = identity_changes(made, now)
    what = ", ".join("the weights" if c == "weights" else c for c in changed)
    verb = "differs" if len(changed) == 1 and changed != ["weights"] else "differ"
    return f"its weights or config changed since ({what} {verb})"


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

    They are when the table records this checkpoint's identity (:func:`checkpoint_identity`: the same
    weights, at this path or moved), or the GGUF file it is or was converted from (by content; a GGUF file
    and its converted folder are named apart); a table that records no identity (written before headprobe
    did) is taken by its checkpoint's path, else by its name. Without a ``checkpoint``, by the name alone."""
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
    contract of :func:`headprobe.results.collect`), however the frame was made."""
    for schema, frame in tables:
        if "model" not in frame.columns:  # e.g. a table combined from per-sample parts (retrieval's)
            frame = frame.assign(model=model)
        meta = table_meta(schema.table, model, checkpoint, settings, model_facts=facts or {})
        write_table(folder / f"{schema.table}.parquet", frame, meta, schema)


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
        finished part was made from (:func:`checkpoint_identity`), when that was and what changed, in words
        (``on 2026-12-06T10:31:05+00:00; its weights or config changed since (config.json differs)``);
        ``None`` when every part records this checkpoint as it is, or records nothing of it (written before
        headprobe did)."""
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


NONE_MEANS = {"dtype": "as saved"}  # what a setting left out (None) means, where a message names it


def shown_value(name: str, value: Any) -> str:
    """A setting's value as a message shows it: ``None`` as what it means (``--dtype`` as saved), anything else
    as Python writes it."""
    return NONE_MEANS.get(name, "not given") if value is None else repr(value)


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


def changed_inputs(files: Sequence[str], folder: Path) -> str:
    """The refusal of a rerun into ``folder`` whose input ``files`` changed since its results were made
    (:func:`headprobe.core.paths.changed_files`): they would be read apart from, or pooled with, results of
    the files' earlier content."""
    its, it = ("its", "it") if len(files) == 1 else ("their", "them")
    return (
        f"{' and '.join(files)} changed since these results were made ({folder} holds results of {its} earlier "
        f"content); restore {it}, give another `out` for the new content, or delete {folder} to redo them"
    )


# ---------------------------------------------------------------------------------------------
# Many checkpoints
# ---------------------------------------------------------------------------------------------
class DoesNotFit(HeadprobeError, RuntimeError):
    """A run would not fit in the memory budget; the message gives the estimate and what to change."""


# errors that fail one checkpoint of a job but not the others (anything else is a bug and propagates)
CHECKPOINT_ERRORS: tuple[type[Exception], ...] = (HeadprobeError, FileNotFoundError)


@dataclass
class RunReport(Generic[T]):
    """What a job over several checkpoints produced.

    Attributes:
        results: each checkpoint's result by name (its results sub-folder).
        errors: the failed checkpoints' messages by name.
        checkpoints: every checkpoint's path by name.
        out: the results folder; :meth:`table` reads one table over every model in it.
        primary: whether this process wrote the results (``False`` on the other processes of a
            ``torchrun`` launch, whose ``results`` are placeholders; :mod:`headprobe.core.ranks`).
    """

    results: dict[str, T] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    checkpoints: dict[str, str] = field(default_factory=dict)
    out: Path | None = None
    primary: bool = True  # False on a torchrun launch's other processes (:mod:`headprobe.core.ranks`)

    def table(self, name: str) -> pd.DataFrame:
        """Table ``name`` of every model of this run (:func:`headprobe.results.collect`)."""
        if self.out is None:
            raise ValueError("this run wrote no results folder")
        return collect(self.out, name)


def run_each(
    checkpoints: Sequence[str | Path],
    job: Callable[[Path, str], T],
    progress: Progress,
    out: Path | None = None,
    on_error: Callable[[str], None] = lambda name: None,
) -> RunReport[T]:
    """``job(path, name)`` for every checkpoint; a checkpoint that fails (it is missing, does not load,
    does not fit, has bad inputs) is recorded in ``errors`` and the others still run."""
    report: RunReport[T] = RunReport(out=out)
    for ckpt, name in zip(checkpoints, unique_names(checkpoints, out), strict=True):
        report.checkpoints[name] = str(ckpt)
        try:
            report.results[name] = job(Path(ckpt), name)
        except CHECKPOINT_ERRORS as err:
            report.errors[name] = str(err)
            on_error(name)
    return report


@contextlib.contextmanager
def held_folder(
    out: Path, job: str, record: dict[str, Any] | None = None, inputs: Sequence[str | Path] = ()
) -> Iterator[None]:
    """Hold ``out`` for a ``job`` whose steps write into it (a study, the real-model demo): claim it
    (:func:`headprobe.core.outputs.claim`: a new or empty folder, or ``job``'s own results; never one of the
    ``inputs`` or around or inside one) and mark it at once (``OUT/run.json`` naming the job), so that it is
    known as ``job``'s from its first step on. A folder the block left holding nothing but that mark is taken
    back (a refused or failed run writes nothing); otherwise, with a ``record`` (what this run was asked:
    recipe, seeds ...), the record lists it under ``runs`` and its lists (seeds ...) hold every run's."""
    claim(out, job_results(job), inputs=inputs, fix=f"give `{command_of(job)}` another `out`")
    path, created = Path(out) / RUN_FILE, missing_folders(out)
    marked = not path.exists()
    if marked:
        atomic_write_text(path, json.dumps({"job": job}, indent=2) + "\n")
    try:
        yield
    finally:
        alone = not any(p.name not in (RUN_FILE, LOCK_FILE) for p in Path(out).iterdir())
        if marked and alone:
            path.unlink(missing_ok=True)
            remove_if_empty(created)
        elif record is not None:
            earlier = _record(path, job)
            run = {**resume_key(**record), "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
            runs = [*earlier.get("runs", []), run]
            merged = merged_settings(
                earlier, resume_key(**record), [k for k, v in record.items() if isinstance(v, list)]
            )
            atomic_write_text(path, json.dumps({"job": job, **merged, "runs": runs}, indent=2) + "\n")


def _record(path: Path, job: str) -> dict[str, Any]:
    """The run record at ``path`` when it is ``job``'s (``{}`` when missing, unreadable or another's)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) and record.get("job") == job else {}


@contextlib.contextmanager
def job_folder(out: Path, job: str, inputs: Sequence[str | Path] = ()) -> Iterator[None]:
    """Hold ``out`` for one run of ``job`` (:func:`folder_lock`) once :func:`headprobe.core.outputs.claim`
    allows it: a new or empty folder, or ``job``'s own results; never another command's results, a
    checkpoint, a training run or other files, and never one of the ``inputs`` or a folder around or
    inside one. A new folder's record (``OUT/run.json``, naming the job) is written at once, so that an
    interrupted first run is known as ``job``'s on the rerun, and taken back when the run wrote nothing."""
    claim(out, job_results(job), inputs=inputs, fix=f"give `{command_of(job)}` another `out`")
    with folder_lock(out):
        record, marker = Path(out) / RUN_FILE, json.dumps({"job": job}, indent=2) + "\n"
        marked = not record.exists()
        if marked:
            atomic_write_text(record, marker)
        try:
            yield
        finally:
            alone = not any(p.name not in (RUN_FILE, LOCK_FILE) for p in Path(out).iterdir())
            if marked and alone and record.read_text(encoding="utf-8") == marker:
                record.unlink()  # a refused or failed run writes nothing


def run_models(
    checkpoints: Sequence[str | Path],
    out: Path,
    job: Callable[[Path, Path, str], T],
    progress: Progress,
    record: tuple[str, dict[str, Any]],
    ranks: Ranks | None = None,
    adds: Sequence[str] = (),
    reads: Sequence[str | Path | None] = (),
) -> RunReport[T]:
    """``job(path, folder, name)`` for every checkpoint, each writing into ``out/<name>/`` (however many
    there are, so that adding a checkpoint to a run never moves the results already there). One
    checkpoint's failure is the run's; of several, a failure is recorded and the others run. ``record`` is
    the job's name and settings for ``OUT/run.json`` (:func:`write_run_record`, when anything succeeded;
    ``adds``: the list settings a rerun adds to, e.g. analyze's ``metrics`` and ``lengths``). ``out`` must not
    be, hold or lie inside a checkpoint or another path the job ``reads`` (a haystack file, ``from_results``).
    The run holds ``out`` (:func:`job_folder`) throughout; with ``ranks`` of several processes, the first
    holds it and writes the record."""
    names, ranks = unique_names(checkpoints, out), ranks or Ranks()
    inputs = [*checkpoints, *(p for p in reads if p is not None and Path(p).exists())]
    with ranks.held_by_main(job_folder(out, record[0], inputs)):
        if len(checkpoints) == 1:
            report: RunReport[T] = RunReport(checkpoints={names[0]: str(checkpoints[0])}, out=out)
            report.results[names[0]] = job(Path(checkpoints[0]), out / names[0], names[0])
        else:
            report = run_each(checkpoints, lambda path, name: job(path, out / name, name), progress, out)
        report.primary = ranks.is_main
        if report.results and ranks.is_main:
            write_run_record(out, record[0], record[1], report, adds)
    return report


def merged_settings(earlier: dict[str, Any], now: dict[str, Any], adds: Sequence[str]) -> dict[str, Any]:
    """The settings of a folder that two runs wrote: ``now``'s, with each field of ``adds`` holding
    ``earlier``'s items and then ``now``'s new ones (a rerun that asked for fewer lengths keeps the others;
    a single value, e.g. shortctx's ``task``, becomes the list of the values the runs gave)."""
    merged = dict(now)
    for name in adds:
        if name not in earlier:
            continue
        old, new = earlier[name], now.get(name)
        if not isinstance(new, list):
            old, new = (old if isinstance(old, list) else [old]), [new]
        items: dict[str, Any] = {}
        for item in [*(old or []), *new]:
            items.setdefault(json.dumps(item, sort_keys=True), item)
        merged[name] = list(items.values()) if len(items) > 1 or isinstance(now.get(name), list) else new[0]
    return merged


def write_run_record(
    out: Path, job: str, settings: dict[str, Any], report: RunReport[Any], adds: Sequence[str] = ()
) -> None:
    """``OUT/run.json``: what the folder holds, however many runs wrote it. ``settings``: this run's, merged
    with the earlier runs' (:func:`merged_settings`: each list of ``adds`` keeps what earlier runs added; a
    setting other runs gave other values, e.g. each checkpoint's ``samples``, holds every value given, and
    ``varies`` names it: look up each run's under ``runs``);
    ``checkpoints``: every checkpoint any run measured there, by name; ``errors``: the failures among them
    (a checkpoint's last: one that succeeded since has none); ``command`` and ``versions``: the last run's;
    ``runs``: every run's own command, settings, versions, checkpoints and failures, oldest first."""
    path = out / RUN_FILE
    earlier = _record(path, job)
    now = resume_key(**settings)
    run = {
        "command": list(sys.argv),
        "settings": now,
        "versions": versions(),
        "checkpoints": report.checkpoints,
        "errors": report.errors,
        "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    errors = {k: v for k, v in earlier.get("errors", {}).items() if k not in report.results} | report.errors
    runs = [*earlier.get("runs", []), run]
    merged = merged_settings(earlier.get("settings", {}), now, adds)
    varies = []
    for name in (n for n in now if n not in adds):  # a setting the runs gave other values: every value, said so
        values: dict[str, Any] = {}
        for r in runs:
            if name in r.get("settings", {}):
                values.setdefault(json.dumps(r["settings"][name], sort_keys=True), r["settings"][name])
        if len(values) > 1:
            merged[name], varies = list(values.values()), [*varies, name]
    record = {
        "job": job,
        "command": run["command"],
        "settings": merged,
        "varies": varies,
        "versions": run["versions"],
        "checkpoints": {**earlier.get("checkpoints", {}), **report.checkpoints},
        "errors": errors,
        "runs": runs,
    }
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")


# ---------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------
def available_memory(device: torch.device | str) -> int:
    """Free bytes on ``device``: free GPU memory, or the host's available memory."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


USABLE = 0.9  # the share of the budget a run may plan to use


@dataclass(frozen=True)
class MemoryBudget:
    """The bytes a run may use: the ``memory_limit`` given (``limited``), else what the device has free."""

    bytes: int
    limited: bool = False

    @classmethod
    def of(cls, device: torch.device | str, memory_limit: int | None) -> MemoryBudget:
        return cls(memory_limit, True) if memory_limit else cls(available_memory(device))

    def __str__(self) -> str:
        gib = f"{self.bytes / 2**30:.3g} GiB"
        return f"`memory_limit` allows only {gib}" if self.limited else f"only {gib} is available"

    def fix(self, fix: str) -> str:
        """``fix`` (what to change to need less), with raising the limit first when one was given."""
        return f"raise `memory_limit`, or {fix}" if self.limited else f"{fix}, or use a larger machine"


def require_fits(what: str, estimate: MemoryEstimate, budget: MemoryBudget, fix: str) -> None:
    """Raise :class:`DoesNotFit` when ``estimate`` exceeds the usable share of ``budget``; ``fix`` says how
    to need less."""
    if estimate.total > USABLE * budget.bytes:
        raise DoesNotFit(f"{what} needs about {estimate.describe()}, but {budget}; {budget.fix(fix)}")
