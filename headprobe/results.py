"""The one format of headprobe's results: tidy Parquet tables that carry what produced them.

Every result (``analyze``, ``ruler eval``, ``shortctx eval``) is a tidy table, one row per
model x layer x head x ... , written here and read back here; figures and the explorer read only
through :func:`read_table` and :func:`collect`.

* A table is a Parquet file ``<table>.parquet``. Its schema metadata (key ``headprobe``) holds a
  :class:`TableMeta`: the table's name, the model it describes, the settings, command and library
  versions that produced it, and the resume key of the work item it came from.
* Files are written atomically (a temporary sibling, then a rename): a reader sees the old table or
  the new one, never a partial file.
* Each table has a :class:`Schema` (its documented columns); writing checks the frame against it.
* A results folder holds one sub-folder per model (``OUT/<model>/<table>.parquet``) plus the run
  record ``OUT/run.json``; :func:`collect` concatenates one table over every model of a folder.
* Results are keyed by what made them: each table records its checkpoint's identity (resolved path, a
  fingerprint of its weights and its config and tokenizer files by content) and settings (input files by
  content too), and :func:`collect` reads the results of different checkpoints, configs, settings or input
  files that share a model's name apart, under labels that say what differs.
"""

from __future__ import annotations

import datetime as _dt
import json
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from headprobe.core.atomic import atomic_file
from headprobe.core.errors import HeadprobeError
from headprobe.core.paths import CONTENT, not_a

FORMAT = "headprobe-results-1"
META_KEY = b"headprobe"
PARQUET_MAGIC = b"PAR1"  # the first (and last) bytes of every Parquet file


class ResultsError(HeadprobeError, ValueError):
    """A result file is missing, is not a headprobe table, or does not match its schema."""


@dataclass(frozen=True)
class Column:
    """One documented column: ``kind`` is ``int``, ``float``, ``str``, ``bool`` or ``list``."""

    name: str
    kind: str
    doc: str = ""


_KINDS = {
    "int": pd.api.types.is_integer_dtype,
    "float": pd.api.types.is_numeric_dtype,  # ints are valid floats (NaN-free integer columns)
    "str": lambda d: pd.api.types.is_object_dtype(d) or pd.api.types.is_string_dtype(d),
    "bool": pd.api.types.is_bool_dtype,
    "list": pd.api.types.is_object_dtype,
}


@dataclass(frozen=True)
class Schema:
    """The columns a table must have, in the order they are written (a ``model`` column first, then a step
    checkpoint's ``step`` and ``tokens``, extra columns after)."""

    table: str
    columns: tuple[Column, ...]
    doc: str = ""

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def check(self, frame: pd.DataFrame) -> pd.DataFrame:
        """``frame`` with the schema's columns first; raises naming missing or mistyped columns."""
        missing = [c.name for c in self.columns if c.name not in frame.columns]
        if missing:
            raise ResultsError(f"table {self.table!r} lacks the columns {missing}")
        if len(frame):
            wrong = [
                f"{c.name} ({frame[c.name].dtype}, expected {c.kind})"
                for c in self.columns
                if not frame[c.name].isna().all() and not _KINDS[c.kind](frame[c.name].dtype)
            ]
            if wrong:
                raise ResultsError(f"table {self.table!r} has mistyped columns: {', '.join(wrong)}")
        # who the rows describe, and where in its training (a step checkpoint's tables)
        lead = [c for c in ("model", "step", "tokens") if c in frame.columns]
        extra = [c for c in frame.columns if c not in self.names and c not in lead]
        return frame[lead + [c for c in self.names if c not in lead] + extra]

    def empty(self) -> pd.DataFrame:
        return pd.DataFrame({c: [] for c in self.names})


@dataclass(frozen=True)
class TableMeta:
    """What produced a table (stored in its Parquet metadata).

    Attributes:
        table: the table's name (its schema).
        model: the model the rows describe (the results sub-folder name), if one.
        checkpoint: the model's path, as given.
        settings: the job's settings.
        key: the resume key of the work item (a rerun skips items whose key matches), if any.
        command: the command line.
        versions: library versions.
        created: UTC time of writing (ISO 8601).
        format: the results format version.
        model_facts: what the model itself declared (:meth:`headprobe.hooked.HookedModel.facts`: the file it
            was converted from, the end tokens decoding stopped on, whether it has a chat template).
        identity: which checkpoint this was, beyond its name (:func:`headprobe.core.identity.checkpoint_identity`):
            ``path``, the checkpoint resolved to an absolute path; ``weights``, a fingerprint of its weight
            files (their names, sizes and modification times), so that a checkpoint retrained at the same
            path is another; ``config``, its config and tokenizer files by name with a fingerprint of each
            one's content (an edited ``config.json`` is another model; absent in tables written before);
            ``modified``, when the newest of those files was written (UTC, ISO 8601). Empty in tables written
            before headprobe recorded it.
    """

    table: str
    model: str | None = None
    checkpoint: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    key: dict[str, Any] | None = None
    command: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    created: str = ""
    format: str = FORMAT
    model_facts: dict[str, Any] = field(default_factory=dict)
    identity: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=str)

    @classmethod
    def from_json(cls, text: str | bytes) -> TableMeta:
        raw = json.loads(text)
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in raw.items() if k in known})


@dataclass(frozen=True)
class Table:
    """A table read back: its rows, what produced them and the file it was read from."""

    frame: pd.DataFrame
    meta: TableMeta
    path: Path | None = None


def table_path(folder: str | Path, table: str) -> Path:
    return Path(folder) / f"{table}.parquet"


def write_table(path: str | Path, frame: pd.DataFrame, meta: TableMeta, schema: Schema | None = None) -> Path:
    """Atomically write ``frame`` with ``meta`` to ``path`` (checked against ``schema`` when given)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if schema is not None:
        frame = schema.check(frame)
    if not meta.created:
        meta = TableMeta(**{**asdict(meta), "created": _dt.datetime.now(_dt.timezone.utc).isoformat()})
    table = pa.Table.from_pandas(frame, preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), META_KEY: meta.to_json().encode()})
    path = Path(path)
    with atomic_file(path) as tmp:
        pq.write_table(table, str(tmp))
    return path


def read_meta(path: str | Path) -> TableMeta | None:
    """The metadata of a headprobe table, or ``None`` when ``path`` is missing or not one."""
    import pyarrow.parquet as pq

    try:
        raw = (pq.read_schema(path).metadata or {}).get(META_KEY)
    except (OSError, ValueError):
        return None
    return TableMeta.from_json(raw) if raw else None


def read_table(path: str | Path) -> Table:
    """A table and its metadata; raises :class:`ResultsError` for a missing file, a damaged one
    (:func:`unreadable`) or a foreign one."""
    import pyarrow.parquet as pq

    path = Path(path)
    if why := not_a(path, "file"):
        raise ResultsError(f"result table {path} {why}")
    try:
        raw = (pq.read_schema(path).metadata or {}).get(META_KEY)
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise unreadable(path, err) from None
    if not raw:
        raise ResultsError(f"{path} is not a headprobe result table (no headprobe metadata)")
    try:
        frame = pd.read_parquet(path)
    except (OSError, ValueError) as err:  # the footer is whole, a data page is not
        raise unreadable(path, err) from None
    return Table(frame, TableMeta.from_json(raw), path)


def unreadable(path: Path, err: Exception) -> ResultsError:
    """The refusal of a result file pyarrow cannot read (``err``): a Parquet file cut short (it begins as one
    and lacks the footer that ends one) or corrupted, or no Parquet file at all. Tables are written
    atomically, so a damaged one was changed afterwards (a copy cut short, a full disk); the command that
    wrote it writes it again."""
    magic = len(PARQUET_MAGIC)
    with open(path, "rb") as f:
        head = f.read(magic)
        f.seek(max(0, path.stat().st_size - magic))
        tail = f.read(magic)
    if head != PARQUET_MAGIC:
        return ResultsError(f"{path} is not a Parquet file, so not a headprobe result table")
    what = "cut short (it ends before its Parquet footer)" if tail != PARQUET_MAGIC else f"corrupted ({err})"
    return ResultsError(
        f"{path} is damaged: {' '.join(what.split())}; rerun the command that wrote it into the same results folder: "
        "it writes the table again, redoing only the work whose finished parts are gone"
    )


class ResultsWarning(UserWarning):
    """What a reader of results must know that is no error: e.g. that results sharing a model's name were
    made from different checkpoints or settings, and are read apart under labels saying so."""


# Settings that say which rows a run made, each row naming its value (its table, ``length``, ``task``,
# ``depth``, an ablation's condition columns), or that change no number. Results of one checkpoint that
# differ only in these were made the same way; every other setting decides the numbers, so results that
# differ in one are never read as one model (:func:`collect`).
ROW_SETTINGS = frozenset(
    {"metrics", "lengths", "tasks", "task", "heads", "modes", "seeds", "depths", "allow_beyond_trained"}
)


@dataclass(frozen=True)
class Origin:
    """What made a table's rows, beyond the model's name (from its :class:`TableMeta`).

    Attributes:
        checkpoint: the checkpoint's resolved path (:attr:`TableMeta.identity`), else (tables written
            before headprobe recorded it) its path as given; ``None`` when neither was recorded.
        weights: the fingerprint of its weight files (``None`` in older tables).
        modified: when its newest weight or config file was written (UTC, ISO 8601; ``None`` in older tables).
        settings: the settings that decide the numbers (all but :data:`ROW_SETTINGS`), input files by content.
        config: its config and tokenizer files by name, with a fingerprint of each one's content (``None`` in
            older tables).
    """

    checkpoint: str | None
    weights: str | None
    modified: str | None
    settings: dict[str, Any]
    config: dict[str, str] | None = None

    @classmethod
    def of(cls, meta: TableMeta) -> Origin:
        found = meta.identity or {}
        settings = {k: v for k, v in meta.settings.items() if k not in ROW_SETTINGS}
        path, config = found.get("path") or meta.checkpoint, found.get("config")
        return cls(path, found.get("weights"), found.get("modified"), settings, config)

    def differences(self, other: Origin) -> list[str]:
        """What tells ``self`` from ``other``: ``checkpoint`` (another path), ``weights`` (the same path,
        other weights), ``config`` (the same path and weights, other config or tokenizer files) and the names
        of the settings whose values differ. What either does not record (a table written before the identity
        was, a setting added since) tells nothing apart."""
        out = []
        if self.checkpoint and other.checkpoint and not same_path(self.checkpoint, other.checkpoint):
            out.append("checkpoint")
        elif self.weights and other.weights and self.weights != other.weights:
            out.append("weights")
        elif self.config is not None and other.config is not None and self.config != other.config:
            out.append("config")
        both = set(self.settings) & set(other.settings)
        return out + sorted(k for k in both if self.settings[k] != other.settings[k])


IDENTITY = ("checkpoint", "weights", "config")  # what Origin.differences names of the checkpoint itself


def same_path(a: str | Path, b: str | Path) -> bool:
    """Whether two recorded checkpoint paths name one checkpoint: equal, or one relative (as given, by a
    table written before headprobe resolved paths) whose parts end the other's."""
    pa, pb = Path(a), Path(b)
    if pa.is_absolute() == pb.is_absolute():
        return pa == pb
    short, full = (pa.parts, pb.parts) if pb.is_absolute() else (pb.parts, pa.parts)
    short = tuple(p for p in short if p != ".")
    return 0 < len(short) <= len(full) and full[-len(short) :] == short


def _path_labels(paths: list[str]) -> list[str]:
    """The shortest part of each path that tells it from the others: the parents in which they differ,
    without the trailing parts all share (``/x/gridA/toy-d64/s0/pt/final`` beside ``/x/gridB/...`` -> ``gridA``)."""
    parts = [Path(p).parts for p in paths]
    shared = 0
    while all(len(p) > shared for p in parts) and len({p[-1 - shared] for p in parts}) == 1:
        shared += 1
    for depth in range(shared + 1, max(len(p) for p in parts) + 1):
        tails = [p[max(0, len(p) - depth) : len(p) - shared] for p in parts]
        if len(set(tails)) == len(set(parts)):
            return ["/".join(t) or "." for t in tails]
    return list(paths)


def _value(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def _differ(origins: list[Origin]) -> list[str]:
    """What tells some of ``origins`` apart (:meth:`Origin.differences`), checkpoint and weights first."""
    found = {d for a in origins for b in origins for d in a.differences(b)}
    return [d for d in IDENTITY if d in found] + sorted(found - set(IDENTITY))


def _apart_because(differ: list[str], origins: list[Origin] | None = None) -> str:
    """``differ`` (:func:`_differ`) in words: ``from different checkpoints, with other settings (seed)``; input
    files whose content differs among ``origins`` by name: ``from other contents of mc.jsonl``."""
    words = {
        "checkpoint": "from different checkpoints",
        "weights": "from other weights at one path",
        "config": "from other config files at one path",
    }
    said = [words[d] for d in differ if d in words]
    settings = [d for d in differ if d not in words and not d.endswith(CONTENT)]
    contents = [d for d in differ if d.endswith(CONTENT)]
    files = dict.fromkeys(path for d in contents for o in origins or [] for path in o.settings.get(d) or {})
    said += [f"from other contents of {', '.join(files)}"] if files else []
    return ", ".join(said + ([f"with other settings ({', '.join(settings)})"] if settings else []))


def _setting_label(name: str, value: Any) -> str:
    """One setting of a label: ``seed 7``; input files by path and the start of their SHA-256: ``mc.jsonl
    24cd07d7``."""
    if name.endswith(CONTENT) and isinstance(value, dict):
        return ", ".join(f"{path} {digest[:8]}" for path, digest in value.items())
    return f"{name} {_value(value)}"


def labels_apart(name: str, origins: list[Origin]) -> list[str]:
    """A label per origin of one model's results (all different): ``name``, then in parentheses what tells
    that origin from the others: the checkpoint's distinguishing parents (``toy-d64-s0-pt-final (gridA)``),
    the time its weights were written when one path held other weights, the settings that differ
    (``tiny (seed 7)``)."""
    if len(origins) == 1:
        return [name]
    differ = _differ(origins)
    paths = [o.checkpoint or "?" for o in origins]
    paths = [next((q for q in paths if Path(q).is_absolute() and same_path(p, q)), p) for p in paths]  # one form
    places = _path_labels(paths) if "checkpoint" in differ else None
    labels = []
    for i, origin in enumerate(origins):
        parts = [places[i]] if places else []
        if "weights" in differ:
            parts.append(f"weights of {origin.modified or origin.weights}")
        if "config" in differ and "weights" not in differ:
            parts.append(f"config of {origin.modified or '?'}")
        parts += [_setting_label(k, origin.settings.get(k)) for k in differ if k not in IDENTITY]
        labels.append(f"{name} ({', '.join(parts)})")
    if len(set(labels)) < len(labels):  # what tells them apart was not recorded alike: number them
        labels = [f"{label} #{i + 1}" for i, label in enumerate(labels)]
    return labels


def read_tables(folder: str | Path, table: str, recursive: bool = False) -> list[Table]:
    """Every ``<table>.parquet`` of a results folder, ``folder/<table>.parquet`` and
    ``folder/*/<table>.parquet`` (``recursive``: every one below ``folder``, e.g. a study's ``analysis/``,
    ``ruler/``...), each frame with a ``model`` column: its own, else the model its metadata names, else its
    folder's name (tables written before every table had one)."""
    folder = Path(folder)
    if recursive:
        paths = sorted(p for p in folder.rglob(f"{table}.parquet") if p.is_file())
    else:
        paths = [p for p in [table_path(folder, table)] if p.is_file()]
        paths += sorted(p for p in folder.glob(f"*/{table}.parquet") if p.is_file())
    found = []
    for path in paths:
        read = read_table(path)
        if "model" not in read.frame.columns:
            read = Table(read.frame.assign(model=read.meta.model or path.parent.name), read.meta, path)
        found.append(read)
    return found


def collect(folder: str | Path, table: str, recursive: bool = False) -> pd.DataFrame:
    """One table over every model of a results folder (:func:`read_tables`) concatenated; empty when none.

    Results are keyed by what made them, not only by the model's name: where one name stands for the
    results of several checkpoints (another path, or other weights at one path: :attr:`TableMeta.identity`)
    or of other settings (all but :data:`ROW_SETTINGS`), each origin's rows get a ``model`` label of their
    own saying what differs (:func:`labels_apart`: ``toy-d64-s0-pt-final (gridA)``, ``tiny (seed 7)``) and a
    :class:`ResultsWarning` says so, so that no reader pools them. (Tables of many models, e.g. a study's,
    keep their names.)"""
    tables = [t for t in read_tables(folder, table, recursive) if len(t.frame)]
    by_name: dict[str, list[tuple[Origin, list[int]]]] = {}  # name -> origins, each with its tables
    for i, t in enumerate(tables):
        if t.meta.model is None or set(t.frame["model"]) != {t.meta.model}:
            continue
        origin, known = Origin.of(t.meta), by_name.setdefault(t.meta.model, [])
        same = next((members for o, members in known if not o.differences(origin)), None)
        if same is None:
            known.append((origin, [i]))
        else:
            same.append(i)
    frames = [t.frame for t in tables]
    for name, known in by_name.items():
        if len(known) == 1:
            continue
        labels = labels_apart(name, [o for o, _ in known])
        for label, (_, members) in zip(labels, known, strict=True):
            for i in members:
                frames[i] = frames[i].assign(model=label)
        origins = [o for o, _ in known]
        warnings.warn(
            f"results named {name} were made {_apart_because(_differ(origins), origins)}; shown apart as "
            + ", ".join(labels),
            ResultsWarning,
            stacklevel=2,
        )
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
