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
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from headprobe.core.atomic import atomic_file
from headprobe.core.errors import HeadprobeError
from headprobe.core.paths import not_a

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
    """The columns a table must have, in the order they are written (a ``model`` column first, extra
    columns after)."""

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
        lead = [c for c in ("model",) if c in frame.columns and c not in self.names]  # who the rows describe
        extra = [c for c in frame.columns if c not in self.names and c not in lead]
        return frame[lead + self.names + extra]

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

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=str)

    @classmethod
    def from_json(cls, text: str | bytes) -> TableMeta:
        raw = json.loads(text)
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in raw.items() if k in known})


@dataclass(frozen=True)
class Table:
    """A table read back: its rows and what produced them."""

    frame: pd.DataFrame
    meta: TableMeta


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
    return Table(frame, TableMeta.from_json(raw))


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


def results_of(held: Iterable[str], model: str) -> str | None:
    """Whose results in a folder describe ``model``: its own by name; or, when the folder holds one model's
    results only, that model's whatever its name (a GGUF file and its converted folder are named apart);
    ``None`` when the folder holds several models and none is ``model``, or none at all."""
    held = sorted(set(held))
    if model in held:
        return model
    return held[0] if len(held) == 1 else None


def collect(folder: str | Path, table: str, recursive: bool = False) -> pd.DataFrame:
    """One table over every model of a results folder: ``OUT/<table>.parquet`` and
    ``OUT/*/<table>.parquet`` concatenated (every table has a ``model`` column); empty when none.
    ``recursive``: every ``<table>.parquet`` below ``folder`` (a study's ``analysis/``, ``ruler/``, ...)."""
    folder = Path(folder)
    if recursive:
        paths = sorted(p for p in folder.rglob(f"{table}.parquet") if p.is_file())
    else:
        paths = [p for p in [table_path(folder, table)] if p.is_file()]
        paths += sorted(p for p in folder.glob(f"*/{table}.parquet") if p.is_file())
    frames = [read_table(p).frame for p in paths]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
