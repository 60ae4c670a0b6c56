"""Atomic writes: a reader sees the old content or the complete new content, never a partial write.

Files and folders are first written under a hidden temporary name (``.NAME.tmp-XXXXXXXX``) in the same
directory, flushed to disk, then renamed into place (``os.replace`` is atomic on POSIX within one
filesystem). The temporary file or folder is created as any new file or folder is (mode ``0o666`` or
``0o777`` less the process umask, default ACLs applied), not with the private ``0o600`` / ``0o700`` of
:func:`tempfile.mkstemp` / :func:`tempfile.mkdtemp`, so what lands at the final name is readable by whoever
the umask lets read it. Files that a library wrote into an atomic folder through a private temporary file
of its own (safetensors does) are made as readable as a new file before the folder is renamed into place.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from headprobe.core.cleanup import CLEANUPS
from headprobe.core.errors import HeadprobeError

_T = TypeVar("_T")

FILE_MODE = 0o666  # the mode a new file is created with; the kernel removes the umask's bits
DIR_MODE = 0o777  # the mode a new folder is created with; the kernel removes the umask's bits
_NAME_TRIES = 100  # random temporary names tried before giving up
_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process umask. Read from ``/proc/self/status`` where there is one (Linux), which changes nothing;
    elsewhere set and restored at once under a lock, the short-lived value ``0o077`` so that a file another
    thread creates meanwhile is private rather than world-writable."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o077)
        os.umask(mask)
    return mask


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


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _readable_as_new(path: Path, file_mode: int) -> None:
    """Add to the file ``path`` the permission bits of ``file_mode`` (a new file's) that it lacks."""
    current = stat.S_IMODE(path.stat().st_mode)
    if current & file_mode != file_mode:
        os.chmod(path, current | file_mode)


def _hidden_sibling(path: Path, kind: str, token: str) -> Path:
    """``.NAME.KIND-TOKEN`` next to ``path``: a name no loader looks at."""
    return path.parent / f".{path.name}.{kind}-{token}"


class NotWritable(HeadprobeError, PermissionError):
    """A path cannot be written (a read-only or special folder, no permission, no space); the message names
    the user's path, not the temporary name that failed."""


def _cannot_write(path: Path, err: OSError) -> NotWritable:
    reason = (err.strerror or str(err)).lower()
    return NotWritable(f"cannot write {path} ({reason}); give a path in a folder you can write")


def make_parent(path: Path) -> None:
    """Create the folders above ``path``, or raise :class:`NotWritable` naming ``path``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _cannot_write(path, err) from None


def _create_temporary(path: Path, create: Callable[[Path], _T]) -> tuple[Path, str, _T]:
    """Create a new hidden ``.NAME.tmp-TOKEN`` sibling of ``path`` with ``create`` (which must raise
    :class:`FileExistsError` when the name is taken); returns its path, its random token and what ``create``
    returned. Raises :class:`NotWritable` naming ``path`` when its folder cannot be written."""
    for _ in range(_NAME_TRIES):
        token = secrets.token_hex(4)
        tmp = _hidden_sibling(path, "tmp", token)
        try:
            return tmp, token, create(tmp)
        except FileExistsError:
            continue
        except OSError as err:
            raise _cannot_write(path, err) from None
    raise FileExistsError(f"no free temporary name next to {path} after {_NAME_TRIES} tries")


_TEMPORARY = re.compile(r"\..+\.(tmp|old)-[0-9a-f]{8}")  # what _hidden_sibling names, and nothing else


def is_leftover(name: str) -> bool:
    """Whether a file or folder name is a writer's hidden temporary or a run's lock: nothing a user wrote."""
    return name == LOCK_FILE or _TEMPORARY.fullmatch(name) is not None


def sweep_temporaries(folder: str | Path) -> list[Path]:
    """Remove the hidden ``.NAME.tmp-TOKEN`` / ``.NAME.old-TOKEN`` entries below ``folder`` that a killed
    writer left (a process stopped by SIGKILL or a crash cannot clean up after itself); returns what was
    removed. Call it only while holding the folder (no other writer can be midway through a write):
    :func:`folder_lock` does, and a resumed training run does on its own folder."""
    gone = []
    for path in sorted(Path(folder).rglob(".*"), key=lambda p: len(p.parts)):
        if _TEMPORARY.fullmatch(path.name) and (path.exists() or path.is_symlink()):
            _remove(path)
            gone.append(path)
    return gone


def _remove(path: Path) -> None:
    """Delete the file, link or folder tree at ``path``, as far as permissions allow."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


@contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield the path of a new, empty temporary sibling file to write by name (e.g. with a library that
    takes a path); on success it is flushed to disk and renamed to ``path``.

    The file gets the mode of any new file (``0o666`` less the umask). If the block raises, ``path`` is
    untouched and the temporary file is removed.
    """
    path = Path(path)
    make_parent(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    tmp, _, fd = _create_temporary(path, lambda name: os.open(name, flags, FILE_MODE))
    os.close(fd)
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_file`)."""
    with atomic_file(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (see :func:`atomic_file`)."""
    atomic_write_bytes(path, text.encode("utf-8"))


@contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield a new temporary sibling folder to fill; on success it replaces ``path`` in one rename.

    The folder gets the mode of any new folder (``0o777`` less the umask), and each file directly in it at
    least the permissions of a new file (``0o666`` less the umask). If the block raises, ``path`` is
    untouched and the temporary folder is removed (a killed process leaves it as a hidden
    ``.NAME.tmp-*`` folder that no loader looks at). An existing ``path`` (a folder, or a file) is moved
    aside to a hidden ``.NAME.old-*`` name first, put back if the new folder cannot be renamed into place,
    and deleted once the new folder is in place.
    """
    path = Path(path)
    make_parent(path)
    tmp, token, _ = _create_temporary(path, lambda name: os.mkdir(name, DIR_MODE))
    old = _hidden_sibling(path, "old", token)
    moved_aside = False
    try:
        yield tmp
        file_mode = FILE_MODE & ~current_umask()
        for child in tmp.iterdir():
            if child.is_file() and not child.is_symlink():
                _readable_as_new(child, file_mode)
                _fsync_file(child)
        _fsync_dir(tmp)
        if os.path.lexists(path):
            os.replace(path, old)
            moved_aside = True
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if moved_aside and not os.path.lexists(path):
            os.replace(old, path)  # the previous content goes back where it was
        raise
    _fsync_dir(path.parent)
    if moved_aside:
        _remove(old)


LOCK_FILE = ".headprobe.lock"


def missing_folders(path: str | Path) -> list[Path]:
    """``path`` and each folder above it that does not exist yet, deepest first: what creating ``path``
    creates (so that :func:`remove_if_empty` can take back exactly that)."""
    path = Path(path).absolute()
    return [p for p in (path, *path.parents) if not os.path.lexists(p)]


def remove_if_empty(created: list[Path]) -> None:
    """Remove the folders of ``created`` (:func:`missing_folders`, deepest first) that are empty, up to the
    first that is not: a refused or failed run leaves no empty folder behind, nor the folders above it."""
    for folder in created:
        try:
            folder.rmdir()
        except OSError:  # not empty (or gone): what lies above it stays too
            if folder.exists():
                return


class FolderBusy(HeadprobeError, RuntimeError):
    """Another run holds the output folder (:func:`folder_lock`)."""


@contextmanager
def folder_lock(out: str | Path) -> Iterator[None]:
    """Hold the output folder ``out`` for one run: an exclusive ``flock`` on ``OUT/.headprobe.lock`` (the
    holder's pid written inside), released when the block ends or the process dies however it dies. A
    second run on the same folder is refused at once, naming the holder, instead of both writing it. A
    folder this run created and left empty is removed again, with the folders above it that it created (a
    refused or failed run writes nothing: :func:`remove_if_empty`), and the lock file goes with the lock
    (a run starting at that very moment could, in principle, lock the old file: runs are refused, never
    queued, so the window is that instant). Holding the folder, it
    removes what a killed run left midway through writing (:func:`sweep_temporaries`)."""
    out = Path(out)
    created = missing_folders(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as err:
        raise _cannot_write(out, err) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise FolderBusy(
            f"{out} is being written by another headprobe run (pid {holder}); wait for it to finish or give "
            "another `out`"
        ) from None

    def release() -> None:
        (out / LOCK_FILE).unlink(missing_ok=True)  # no hidden file stays behind in the results
        remove_if_empty(created)

    CLEANUPS[fd] = release
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        sweep_temporaries(out)  # what a killed run was midway through writing: the lock says it is over
        yield
    finally:
        if CLEANUPS.pop(fd, None) is not None:
            release()
        os.close(fd)
