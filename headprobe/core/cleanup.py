"""What an interrupted process must undo even when it is ended outright (no imports, so a signal
handler can use it at any moment, even in the middle of importing torch).

A job registers a cleanup for as long as it holds something (a results folder's lock); the command's
interrupt watchdog (:mod:`headprobe.cli`) runs whatever is registered before ending a process that did
not unwind in time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

CLEANUPS: dict[object, Callable[[], None]] = {}


def run_cleanups() -> None:
    """Run (once) every registered cleanup, ignoring their errors."""
    for key in list(CLEANUPS):
        fn = CLEANUPS.pop(key, None)
        if fn is not None:
            with contextlib.suppress(Exception):
                fn()
