"""Token shards, their manifest, and deterministic sampling of packed training sequences.

A data folder holds ``shard_00000.bin``, ``shard_00001.bin``, ... (raw little-endian ``uint16`` or
``uint32`` token ids, memory-mapped when read) and ``manifest.json`` (token counts, dtype, tokenizer,
end-of-document id, SHA-256 of every shard and of every source file). Documents are concatenated,
each followed by the end-of-document token, and the stream is cut into packed sequences: sequence
``i`` is tokens ``i*L .. i*L+L`` (``L+1`` tokens: inputs and their shifted targets).

Sampling is a pure function of ``(seed, step)``: step ``s`` takes global positions
``s*B .. s*B+B-1`` of an endless list that visits every sequence once per epoch in an order fixed
by ``(seed, epoch)``. Every process reads its own slice of that global batch, so the batch of a step
does not depend on the number of processes, and a resumed run reads exactly what an uninterrupted
one would have.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from headprobe.core.atomic import atomic_directory
from headprobe.core.errors import HeadprobeError
from headprobe.core.outputs import DATA, MANIFEST_FILE, claim
from headprobe.core.paths import not_a, read_utf8
from headprobe.model.tokenizer import ByteTokenizer, HFTokenizer, encode_spans
from headprobe.text.jsonl import jsonl_records
from headprobe.text.tasks import TaskMix
from trainer.config import ReportCount

MANIFEST = MANIFEST_FILE
FORMAT = "headprobe-tokens-1"
SHARD_TOKENS = 1 << 24  # 16M tokens per shard
TEXT_PROBE_BYTES = 1 << 16  # the first bytes of a source checked for binary content
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


class DataError(HeadprobeError, ValueError):
    """Training data is missing, malformed or inconsistent; the message names the file and the fix."""


@dataclass
class ShardInfo:
    """One shard; ``mask_file`` (one byte per token: 1 = a target of the loss) when the data has masks."""

    file: str
    tokens: int
    sha256: str
    mask_file: str | None = None
    mask_sha256: str | None = None


@dataclass
class SourceInfo:
    path: str
    sha256: str
    documents: int
    tokens: int


@dataclass
class Manifest:
    """Describes one data folder (``manifest.json``)."""

    tokenizer: str
    vocab_size: int
    dtype: str
    eod_id: int
    total_tokens: int = 0
    documents: int = 0
    shards: list[ShardInfo] = field(default_factory=list)
    sources: list[SourceInfo] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    format: str = FORMAT

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def load(cls, folder: Path) -> Manifest:
        path = folder / MANIFEST
        if not path.is_file():
            raise DataError(
                f"{path} is missing: {folder} is not a prepared data folder "
                "(create one with `headprobe data prepare` or `headprobe data synth`)"
            )
        try:
            raw = json.loads(path.read_text())
            raw["shards"] = [ShardInfo(**s) for s in raw["shards"]]
            raw["sources"] = [SourceInfo(**s) for s in raw["sources"]]
            manifest = cls(**raw)
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise DataError(f"{path} is not a valid manifest: {err}") from None
        if manifest.format != FORMAT:
            raise DataError(f"{path}: unknown format {manifest.format!r} (expected {FORMAT!r})")
        return manifest


def shard_dtype(vocab_size: int, requested: str = "auto") -> str:
    """``uint16`` when every id fits, else ``uint32``; a requested dtype that cannot hold the vocabulary
    raises."""
    if requested == "auto":
        return "uint16" if vocab_size <= 1 << 16 else "uint32"
    if requested not in DTYPES:
        raise DataError(f"unknown shard dtype {requested!r}; choose auto, uint16 or uint32")
    limit = np.iinfo(DTYPES[requested]).max + 1
    if vocab_size > limit:
        raise DataError(
            f"the tokenizer has {vocab_size:,} ids but {requested} holds only {limit:,}; use `dtype` uint32 (or auto)"
        )
    return requested


def _sha256(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


class ShardWriter:
    """Collects token ids (and, once any document brings one, per-token loss masks) and writes fixed-size
    shards into a folder, then the manifest. A mask marks which tokens are targets of the loss; documents
    without one count every token, and shards written before the first mask get all-ones masks."""

    def __init__(self, folder: Path, manifest: Manifest, shard_tokens: int = SHARD_TOKENS) -> None:
        self.folder, self.manifest, self.shard_tokens = folder, manifest, shard_tokens
        self.np_dtype = DTYPES[manifest.dtype]
        self._pending: list[np.ndarray] = []
        self._pending_masks: list[np.ndarray] | None = None  # None until a document brings a mask
        self._pending_tokens = 0

    def add_document(self, ids: list[int], mask: list[bool] | None = None) -> int:
        """Append one document and its end-of-document token; returns tokens written. ``mask[i]``: is
        token ``i`` a target (the end-of-document token is one only in documents without a mask)."""
        if ids and max(ids) >= self.manifest.vocab_size:
            raise DataError(f"token id {max(ids)} is outside the vocabulary of {self.manifest.vocab_size}")
        if mask is not None and len(mask) != len(ids):
            raise DataError(f"a document's loss mask has {len(mask)} entries for {len(ids)} tokens")
        arr = np.asarray([*ids, self.manifest.eod_id], dtype=self.np_dtype)
        if mask is not None and self._pending_masks is None:
            self._start_masks()
        if self._pending_masks is not None:
            flags = np.ones(len(arr), dtype=np.uint8) if mask is None else np.asarray([*mask, False], np.uint8)
            self._pending_masks.append(flags)
        self._pending.append(arr)
        self._pending_tokens += len(arr)
        self.manifest.total_tokens += len(arr)
        self.manifest.documents += 1
        while self._pending_tokens >= self.shard_tokens:
            self._flush(self.shard_tokens)
        return len(arr)

    def _start_masks(self) -> None:
        """The first mask: everything written so far counted every token."""
        for shard in self.manifest.shards:
            self._write_mask(shard, np.ones(shard.tokens, dtype=np.uint8))
        self._pending_masks = [np.ones(len(a), dtype=np.uint8) for a in self._pending]

    def _write_mask(self, shard: ShardInfo, flags: np.ndarray) -> None:
        shard.mask_file = shard.file.replace("shard_", "mask_")
        data = flags.tobytes()
        (self.folder / shard.mask_file).write_bytes(data)
        shard.mask_sha256 = _sha256(data)

    def _flush(self, n: int) -> None:
        stream = np.concatenate(self._pending)
        chunk, rest = stream[:n], stream[n:]
        self._pending = [rest] if len(rest) else []
        self._pending_tokens = len(rest)
        name = f"shard_{len(self.manifest.shards):05d}.bin"
        data = chunk.astype(chunk.dtype.newbyteorder("<"), copy=False).tobytes()
        (self.folder / name).write_bytes(data)
        shard = ShardInfo(file=name, tokens=len(chunk), sha256=_sha256(data))
        self.manifest.shards.append(shard)
        if self._pending_masks is not None:
            flags = np.concatenate(self._pending_masks)
            self._pending_masks = [flags[n:]] if len(flags) > n else []
            self._write_mask(shard, flags[:n])

    def close(self) -> Manifest:
        if self._pending_tokens:
            self._flush(self._pending_tokens)
        if self.manifest.total_tokens == 0:
            raise DataError("no tokens were written: every source was empty")
        (self.folder / MANIFEST).write_text(self.manifest.to_json())
        return self.manifest


# ---------------------------------------------------------------------------------------------
# Reading sources
# ---------------------------------------------------------------------------------------------
Spans = list[tuple[int, int]]


def _loss_spans(record: dict, path: Path, lineno: int) -> Spans | None:
    """A JSONL record's ``loss_spans``: ``[[start, end], ...]`` character ranges of ``text`` (or absent)."""
    spans = record.get("loss_spans")
    if spans is None:
        return None
    text = record["text"]
    ok = isinstance(spans, list) and all(
        isinstance(x, list) and len(x) == 2 and all(isinstance(v, int) for v in x) and 0 <= x[0] < x[1] <= len(text)
        for x in spans
    )
    if not ok:
        raise DataError(
            f"{path}:{lineno}: loss_spans must be a list of [start, end] character ranges inside the text "
            f"(0 <= start < end <= {len(text)})"
        )
    return [(a, b) for a, b in spans]


def read_examples(path: Path) -> Iterator[tuple[str, Spans | None]]:
    """Documents of one source file with their loss spans: a whole text file, or the ``text`` field of
    each JSONL line (with its optional ``loss_spans``: only the tokens they cover are targets) or Parquet
    row. ``None`` spans: every token counts."""
    if why := not_a(path, "file"):
        raise DataError(f"source {path} {why}")
    if path.stat().st_size == 0:
        raise DataError(f"source {path} is empty")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pandas as pd
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            columns = [c for c in pq.read_schema(path).names if not c.startswith("__")]  # not pandas' own index
        except (OSError, pa.ArrowException) as err:
            raise DataError(f"{path} is not a readable Parquet file ({err})") from None
        if "text" not in columns:
            raise DataError(
                f"{path} has no 'text' column, the one data prepare reads documents from (its columns: "
                f"{', '.join(columns) or 'none'}); rename the column that holds the documents to 'text'"
            )
        try:
            frame = pd.read_parquet(path, columns=["text"])
        except (KeyError, ValueError, OSError, pa.ArrowException) as err:
            raise DataError(f"{path}: cannot read a 'text' column ({err})") from None
        yield from ((str(t), None) for t in frame["text"] if isinstance(t, str) and t)
        return
    with open(path, "rb") as f:
        head = f.read(TEXT_PROBE_BYTES)
    if b"\0" in head:  # no text holds NUL bytes; a token shard (shard_00000.bin) is full of them
        raise DataError(
            f"source {path} is not text: it holds NUL bytes, as binary files do (a data folder's token shard, a "
            "checkpoint); give text, JSONL or Parquet files (a data folder is trained on as it is: train --data DIR)"
        )
    text = read_utf8(path, "source", DataError)
    if suffix in (".jsonl", ".ndjson"):
        for lineno, record in jsonl_records(text, path, DataError):
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise DataError(f"{path}:{lineno}: expected an object with a string 'text' field")
            if record["text"]:
                yield record["text"], _loss_spans(record, path, lineno)
        return
    if not text.strip():
        raise DataError(f"source {path} holds only whitespace")
    yield text, None


def _encode(
    tokenizer: ByteTokenizer | HFTokenizer, text: str, spans: Spans | None
) -> tuple[list[int], list[bool] | None]:
    if spans is None:
        return tokenizer.encode(text), None
    return encode_spans(tokenizer, text, spans)


def _new_manifest(tokenizer: ByteTokenizer | HFTokenizer, dtype: str, extra: dict[str, Any]) -> Manifest:
    if tokenizer.eos_id is None:
        raise DataError(
            f"tokenizer {tokenizer.name} has no end-of-document token (looked for "
            "<|endoftext|>, </s>, <eos>, ...); add one to tokenizer.json"
        )
    name = "byte" if isinstance(tokenizer, ByteTokenizer) else str(tokenizer.name)
    if isinstance(tokenizer, HFTokenizer):
        extra = {**extra, "tokenizer_sha256": _sha256(Path(tokenizer.path).read_bytes())}
    return Manifest(
        tokenizer=name,
        vocab_size=tokenizer.vocab_size,
        dtype=shard_dtype(tokenizer.vocab_size, dtype),
        eod_id=tokenizer.eos_id,
        extra=extra,
    )


def _free_bytes(out: Path) -> int:
    """Free bytes on the filesystem that will hold ``out`` (its nearest existing folder)."""
    folder = out.absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder if folder.is_dir() else folder.parent).free


def check_disk(out: str | Path, tokens: int, per_token: int, what: str, fix: str, least: bool = False) -> None:
    """Refuse, before any work, a data folder of ``tokens`` tokens of ``per_token`` bytes each (ids, and loss
    masks) that the disk holding ``out`` has no room for (``least``: ``tokens`` is a lower bound), naming both
    numbers and ``fix``."""
    need, free = tokens * per_token, _free_bytes(Path(out))
    if need <= free:
        return
    about = "at least" if least else "about"
    raise DataError(
        f"`out` {out}: {what} needs {about} {_gib(need)} ({tokens:,} tokens x {per_token} bytes), but the disk that "
        f"would hold it has {_gib(free)} free; {fix}"
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_new_folder(out: str | Path, overwrite: bool = False, sources: Sequence[str | Path] = ()) -> None:
    """Refuse, before any work, to put a data folder where something else is
    (:func:`headprobe.core.outputs.claim`): an existing data folder, file or link is replaced only with
    ``overwrite``, anything else never, nor one of the ``sources`` or a folder holding one; a missing or
    empty folder is fine."""
    claim(out, DATA, inputs=sources, overwrite=overwrite, fix="give a new or empty folder")


def prepare(
    sources: Iterable[str | Path],
    tokenizer: ByteTokenizer | HFTokenizer,
    out: str | Path,
    dtype: str = "auto",
    shard_tokens: int = SHARD_TOKENS,
    progress: ReportCount | None = None,
) -> Manifest:
    """Tokenise ``sources`` (text, JSONL or Parquet files) into a new data folder ``out`` (atomically);
    ``progress(files done, files, what)`` hears of each file."""
    paths = [Path(s) for s in sources]
    if not paths:
        raise DataError("no source files given")
    manifest = _new_manifest(tokenizer, dtype, {"kind": "prepared"})
    size = sum(p.stat().st_size for p in paths if p.is_file())
    byte = isinstance(tokenizer, ByteTokenizer)  # a token per byte; any other, at least one per 8 bytes
    check_disk(
        out,
        size if byte else size // 8,
        np.dtype(DTYPES[manifest.dtype]).itemsize,
        f"tokenising {size:,} bytes of sources",
        "give fewer or smaller sources, or an `out` on a disk with room for them",
        least=not byte,
    )
    with atomic_directory(out) as tmp:
        writer = ShardWriter(tmp, manifest, shard_tokens)
        for done, path in enumerate(paths):
            if progress:
                progress(done, len(paths), f"tokenising {path.name}")
            raw = path.read_bytes() if path.is_file() else b""
            docs, tokens = 0, 0
            for text, spans in read_examples(path):
                tokens += writer.add_document(*_encode(tokenizer, text, spans))
                docs += 1
            manifest.sources.append(SourceInfo(str(path), _sha256(raw), docs, tokens))
        writer.close()
        if progress:
            progress(len(paths), len(paths), "tokenised")
    return manifest


def synth(
    tokens: int,
    out: str | Path,
    tokenizer: ByteTokenizer | HFTokenizer | None = None,
    seed: int = 0,
    dtype: str = "auto",
    shard_tokens: int = SHARD_TOKENS,
    progress: ReportCount | None = None,
    tasks: TaskMix | None = None,
) -> Manifest:
    """Write at least ``tokens`` tokens to ``out``: the built-in corpus (:mod:`headprobe.text.corpus`), or
    with ``tasks`` a mixture of synthetic retrieval tasks (:mod:`headprobe.text.tasks`) whose loss masks are
    stored with the tokens. ``progress(tokens done, tokens, what)`` hears of each document."""
    from headprobe.text.corpus import MIXTURE, documents

    if tokens < 1:
        raise DataError("`tokens` must be positive")
    tokenizer = tokenizer or ByteTokenizer()
    extra: dict[str, Any] = {"kind": "synthetic", "seed": seed, "mixture": MIXTURE}
    if tasks is not None:
        extra = {"kind": "tasks", "seed": seed, "tasks": tasks.describe()}
    manifest = _new_manifest(tokenizer, dtype, extra)
    per_token = np.dtype(DTYPES[manifest.dtype]).itemsize + (1 if tasks is not None else 0)  # ids (and loss masks)
    check_disk(out, tokens, per_token, "the data folder", "give fewer `tokens`, or an `out` on a disk with room for it")
    kinds: dict[str, int] = {}
    stream = (
        ((ex.kind, ex.text, list(ex.loss_spans) or None) for ex in tasks.examples(seed))
        if tasks is not None
        else ((kind, text, None) for kind, text in documents(seed))
    )
    with atomic_directory(out) as tmp:
        writer = ShardWriter(tmp, manifest, shard_tokens)
        for kind, text, spans in stream:
            writer.add_document(*_encode(tokenizer, text, spans))
            kinds[kind] = kinds.get(kind, 0) + 1
            if progress:
                progress(min(manifest.total_tokens, tokens), tokens, "generating")
            if manifest.total_tokens >= tokens:
                break
        manifest.extra["documents_by_kind"] = kinds
        name = "builtin:headprobe.text.tasks" if tasks is not None else "builtin:headprobe.text.corpus"
        manifest.sources.append(SourceInfo(name, "", manifest.documents, manifest.total_tokens))
        writer.close()
    return manifest


# ---------------------------------------------------------------------------------------------
# Reading shards
# ---------------------------------------------------------------------------------------------
class TokenData:
    """The token stream of a data folder, memory-mapped shard by shard."""

    def __init__(self, folder: str | Path, verify: bool = False) -> None:
        self.folder = Path(folder)
        if why := not_a(self.folder, "folder"):
            raise DataError(f"data folder {self.folder} {why} (`headprobe data prepare` writes one)")
        self.manifest = Manifest.load(self.folder)
        itemsize = np.dtype(DTYPES[self.manifest.dtype]).itemsize
        self._maps: list[np.ndarray] = []
        self._masks: list[np.ndarray] | None = [] if any(s.mask_file for s in self.manifest.shards) else None
        for shard in self.manifest.shards:
            path = self.folder / shard.file
            if not path.is_file():
                raise DataError(f"{path} is listed in {MANIFEST} but missing")
            size = path.stat().st_size
            if size != shard.tokens * itemsize:
                raise DataError(
                    f"{path} has {size:,} bytes but {MANIFEST} says {shard.tokens:,} "
                    f"{self.manifest.dtype} tokens ({shard.tokens * itemsize:,} bytes): the shard "
                    "does not match its manifest; prepare the data again"
                )
            mapped = np.memmap(path, dtype=np.dtype(DTYPES[self.manifest.dtype]).newbyteorder("<"), mode="r")
            if verify and _sha256(memoryview(mapped)) != shard.sha256:
                raise DataError(f"{path}: SHA-256 differs from {MANIFEST}; the shard is corrupted")
            self._maps.append(mapped)
            if self._masks is not None:
                self._masks.append(self._mask_map(shard, verify))
        self._starts = np.cumsum([0] + [s.tokens for s in self.manifest.shards])
        if self._starts[-1] != self.manifest.total_tokens:
            raise DataError(f"{self.folder / MANIFEST}: shard token counts do not add up to total_tokens")

    def _mask_map(self, shard: ShardInfo, verify: bool) -> np.ndarray:
        path = self.folder / (shard.mask_file or "")
        if not shard.mask_file or not path.is_file() or path.stat().st_size != shard.tokens:
            raise DataError(
                f"{self.folder}: the loss mask of {shard.file} is missing or of the wrong size "
                f"({shard.tokens:,} bytes expected); prepare the data again"
            )
        mapped = np.memmap(path, dtype=np.uint8, mode="r")
        if verify and _sha256(memoryview(mapped)) != shard.mask_sha256:
            raise DataError(f"{path}: SHA-256 differs from {MANIFEST}; the mask is corrupted")
        return mapped

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _read(self, maps: list[np.ndarray], start: int, stop: int, dtype: type) -> np.ndarray:
        out = np.empty(stop - start, dtype=dtype)
        pos = start
        shard = int(np.searchsorted(self._starts, start, side="right") - 1)
        while pos < stop:
            lo = pos - self._starts[shard]
            take = min(stop - pos, self.manifest.shards[shard].tokens - lo)
            out[pos - start : pos - start + take] = maps[shard][lo : lo + take]
            pos += take
            shard += 1
        return out

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``start .. stop-1`` of the stream as ``int64``."""
        return self._read(self._maps, start, stop, np.int64)

    def masks(self, start: int, stop: int) -> np.ndarray | None:
        """Loss masks of tokens ``start .. stop-1`` (``True`` = a target), or ``None`` without masks."""
        return None if self._masks is None else self._read(self._masks, start, stop, np.bool_)


class PackedSequences:
    """Fixed-length training sequences cut from a token stream (``seq_len + 1`` tokens each)."""

    def __init__(self, data: TokenData, seq_len: int) -> None:
        self.data, self.seq_len = data, seq_len
        self.count = (len(data) - 1) // seq_len
        if self.count < 1:
            raise DataError(
                f"{data.folder} holds {len(data):,} tokens, fewer than one sequence of "
                f"{seq_len + 1:,}; use more data or a shorter `seq_len`"
            )

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> np.ndarray:
        return self.data.tokens(i * self.seq_len, i * self.seq_len + self.seq_len + 1)

    def item(self, i: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Sequence ``i`` and its loss mask (``None``: every token is a target)."""
        start, stop = i * self.seq_len, i * self.seq_len + self.seq_len + 1
        return self.data.tokens(start, stop), self.data.masks(start, stop)


@dataclass(frozen=True)
class Sampler:
    """Global batch ``step`` -> item indices, a pure function of ``(seed, step)``.

    Attributes:
        num_items: items per epoch (sequences or examples).
        global_batch: items per optimizer step, over all processes.
        seed: data-order seed.
    """

    num_items: int
    global_batch: int
    seed: int

    @functools.lru_cache(maxsize=2)  # noqa: B019 (frozen value object; a batch spans <= 2 epochs)
    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_items)

    def batch(self, step: int) -> np.ndarray:
        positions = np.arange(step * self.global_batch, (step + 1) * self.global_batch)
        epochs = positions // self.num_items
        out = np.empty(self.global_batch, dtype=np.int64)
        for epoch in np.unique(epochs):
            sel = epochs == epoch
            out[sel] = self._order(int(epoch))[positions[sel] % self.num_items]
        return out

    def shard(self, step: int, rank: int, world: int) -> np.ndarray:
        """This process's part of the global batch of ``step``."""
        if self.global_batch % world:
            raise DataError(f"global batch {self.global_batch} is not divisible by {world} processes")
        per = self.global_batch // world
        return self.batch(step)[rank * per : (rank + 1) * per]


@dataclass
class Batch:
    """One micro-batch: ``inputs``, ``targets`` and ``loss_mask`` are ``[batch, seq]`` (``int64``,
    ``int64``, ``bool``); the loss counts targets where ``loss_mask`` is true."""

    inputs: np.ndarray
    targets: np.ndarray
    loss_mask: np.ndarray

    @property
    def target_tokens(self) -> int:
        return int(self.loss_mask.sum())


def collate(items: list[tuple[np.ndarray, np.ndarray | None]], pad_id: int) -> Batch:
    """Stack ``(tokens, token_mask)`` items (mask ``None`` = every token is a target) into a
    :class:`Batch`, right-padding to the longest item."""
    width = max(len(t) for t, _ in items) - 1
    inputs = np.full((len(items), width), pad_id, dtype=np.int64)
    targets = np.full((len(items), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(items), width), dtype=bool)
    for row, (tokens, token_mask) in enumerate(items):
        n = len(tokens) - 1
        inputs[row, :n] = tokens[:-1]
        targets[row, :n] = tokens[1:]
        mask[row, :n] = True if token_mask is None else token_mask[1:]
    return Batch(inputs, targets, mask)
