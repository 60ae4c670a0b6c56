"""Paths in words: what a path given as input is when it is not what was asked for, and reading a text
file with errors that name it. Every "does not exist" of the package goes through :func:`not_a`, so a
file given where a folder is expected (or the reverse) is called what it is."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Literal

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
