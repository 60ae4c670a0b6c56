"""Paths in words: what a path given as input is when it is not what was asked for, and reading a text
file with errors that name it. Every "does not exist" of the package goes through :func:`not_a`, so a
file given where a folder is expected (or the reverse) is called what it is."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

Kind = Literal["file", "folder"]
GGUF_SUFFIX = ".gguf"


def is_gguf(path: str | Path) -> bool:
    """Whether ``path`` names a GGUF model file: its name ends in ``.gguf`` and it is not a folder (a folder
    of that name is a folder; whether the file really is GGUF, its header says:
    :func:`headprobe.hooked.gguf.check_gguf`)."""
    path = Path(path)
    return path.suffix.lower() == GGUF_SUFFIX and not path.is_dir()


def not_a(path: str | Path, kind: Kind) -> str | None:
    """Why ``path`` is not a ``kind``, to follow its name in a message (``"does not exist"``, ``"is a
    folder, not a file"``, ``"is a file, not a folder"``); ``None`` when it is one."""
    path = Path(path)
    if path.is_dir():
        return None if kind == "folder" else "is a folder, not a file"
    if path.is_file():
        return None if kind == "file" else "is a file, not a folder"
    if path.exists():
        return f"is neither a file nor a folder; give a {kind}"
    return "does not exist"


def read_utf8(path: str | Path, what: str, error: type[Exception]) -> str:
    """The text of the file ``path``; ``error`` (naming it as ``what path``) when it is not a file or not
    UTF-8 text."""
    path = Path(path)
    if why := not_a(path, "file"):
        raise error(f"{what} {path} {why}")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise error(
            f"{what} {path} is not UTF-8 text ({err.reason} at byte {err.start:,}); convert it to UTF-8 "
            "(e.g. `iconv -t utf-8`)"
        ) from None


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, hex (remembered per path, size and modification time, so a run
    that asks twice reads a multi-GB file once)."""
    path = Path(path).resolve()
    st = path.stat()
    return _sha256(path, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=32)
def _sha256(path: Path, size: int, mtime_ns: int, chunk: int = 1 << 24) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


CONTENT = "_sha256"  # a setting NAME that names input files is keyed by their content as NAME_sha256


def content_keys(**files: str | Path | Sequence[str | Path] | None) -> dict[str, dict[str, str]]:
    """The input files a job reads, by content, for its resume keys and the settings its tables carry: for
    each setting ``NAME`` that names files (one path or a list), ``{"NAME_sha256": {path as given: its
    SHA-256}}``. A setting that names no existing file (``None``, a built-in name) adds nothing, so that the
    keys of runs without files stay as they were and their results still resume."""
    out: dict[str, dict[str, str]] = {}
    for name, value in files.items():
        paths = [value] if isinstance(value, (str, Path)) else list(value or [])
        found = {str(p): file_sha256(p) for p in paths if Path(p).is_file()}
        if found:
            out[f"{name}{CONTENT}"] = found
    return out


def changed_files(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The input files that two resume keys (or settings) record under one path with other content
    (:func:`content_keys`): those a rerun would read changed since the earlier run; each once, in order."""
    changed: dict[str, None] = {}
    for name, digests in new.items():
        before = old.get(name)
        if name.endswith(CONTENT) and isinstance(digests, dict) and isinstance(before, dict):
            changed.update((path, None) for path, digest in digests.items() if before.get(path, digest) != digest)
    return list(changed)
