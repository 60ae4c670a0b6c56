"""Safe interruption: the first Ctrl-C or SIGTERM asks the loop to save and stop after its step; a second
Ctrl-C aborts at once, as whoever handled Ctrl-C before would (``headprobe``'s command line: it ends the
command with exit code 130 and says what was kept)."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def interrupt_flag() -> Iterator[list[bool]]:
    """First Ctrl-C / SIGTERM sets the flag (the loop saves and stops); a second Ctrl-C aborts: it goes to the
    handler the block replaced (the command line's, which notes the interrupt and raises ``KeyboardInterrupt``),
    or raises ``KeyboardInterrupt`` itself when that was Python's default."""
    flag = [False]
    previous: dict[int, object] = {}

    def handler(signum, frame):
        if flag[0] and signum == signal.SIGINT:
            before = previous.get(signum)
            if callable(before):
                before(signum, frame)
            raise KeyboardInterrupt
        flag[0] = True
        print(
            "\ninterrupt received: finishing this step, saving, then stopping (Ctrl-C again to abort)",
            file=sys.stderr,
            flush=True,
        )

    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
    except ValueError:  # not in the main thread: no signal handling
        pass
    try:
        yield flag
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
