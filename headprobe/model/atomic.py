"""Atomic writes: a reader sees the old content or the complete new content, never a partial write.

Files and folders are first written under a hidden temporary name in the same directory, flushed to
disk, then renamed into place (``os.replace`` is atomic on POSIX within one filesystem).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some platforms cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


@contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling folder to fill; on success it replaces ``path`` in one rename.

    If the block raises (or the process dies), ``path`` is untouched and the temporary folder is
    removed (or left as a hidden ``.name.tmp-*`` folder that no loader looks at). An existing
    ``path`` is moved aside first and deleted after the new folder is in place.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
        for child in tmp.iterdir():
            if child.is_file():
                with open(child, "rb") as f:
                    os.fsync(f.fileno())
        _fsync_dir(tmp)
        old = None
        if path.exists():
            old = path.parent / f".{path.name}.old-{os.getpid()}"
            if old.exists():
                shutil.rmtree(old)
            os.replace(path, old)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
