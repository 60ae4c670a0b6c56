"""How long work reports itself: the :class:`Progress` protocol, and :class:`Silent`, which reports nothing.

The library reports, the command line draws (rich bars in :mod:`headprobe.cli.progress`); the library
itself draws nothing.
"""

from __future__ import annotations

from typing import Protocol


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
