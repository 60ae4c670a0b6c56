"""The one progress display: a rich bar implementing :class:`headprobe.core.progress.Progress`."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from headprobe.cli.common import command_flags, flagify


class RichProgress:
    """Reports library progress on stderr: one bar with a description, log lines above it."""

    def __init__(self, bar: Progress, flags: dict[str, str]) -> None:
        self.bar, self.flags = bar, flags
        self.task = bar.add_task("", total=None, what="", info="")  # every field a column reads, before it draws
        self.total: int | None = None

    def start(self, total: int, description: str = "") -> None:
        """A new phase: the bar's count, elapsed time and rate (hence its ETA) start again."""
        self.total = total
        self.bar.reset(self.task, total=total, completed=0, what=description)

    def advance(self, n: int = 1) -> None:
        self.bar.advance(self.task, n)

    def describe(self, description: str) -> None:
        self.bar.update(self.task, what=description)

    def report(self, done: int, total: int, info: str) -> None:
        """A callback form for code that reports ``(done, total, status)`` (the trainer's loops); another
        total than the bar's begins a new phase (:meth:`start`)."""
        if total != self.total:
            self.total = total
            self.bar.reset(self.task, total=total, completed=done)
        self.bar.update(self.task, completed=done, total=total, info=info)

    def log(self, message: str) -> None:
        self.bar.console.print(flagify(message, self.flags), markup=False, highlight=False)


LINE_EVERY = 30.0  # seconds between progress lines when stderr is not a terminal (HEADPROBE_PROGRESS_EVERY)


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
    )


class LineProgress:
    """Progress for logs (stderr not a terminal, e.g. a cluster job's ``> log 2>&1``): one plain line at most
    every :data:`LINE_EVERY` seconds and at the end, with the count, the share done, the elapsed time, an
    ETA and the latest description and status (a training step's loss and tokens/s).

    The ETA is the current phase's: each :meth:`start` begins a phase, as does a :meth:`report` of another
    total (its first unit taken to have begun at the previous event, so a resumed loop's earlier work does
    not count), and its rate counts only the time and work since then (a study's probes are not timed by
    its training's rate)."""

    def __init__(self, title: str, flags: dict[str, str], every: float | None = None) -> None:
        self.title, self.flags = title, flags
        self.every = float(os.environ.get("HEADPROBE_PROGRESS_EVERY", LINE_EVERY)) if every is None else every
        self.total: int | None = None
        self.done, self.what, self.info = 0, "", ""
        self.t0 = self.last = time.monotonic()
        self.phase_t0, self.phase_done0 = self.t0, 0
        self.event = self.t0  # the time of the last start, advance or report
        self.printed = -1

    def _phase(self, done: int, since: float | None = None) -> None:
        """A new phase began at ``since`` (default: now), ``done`` of its units already done then."""
        self.phase_t0, self.phase_done0 = time.monotonic() if since is None else since, done

    def _line(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < self.every:
            return
        if force and self.printed == self.done:
            return
        self.last, self.printed = now, self.done
        elapsed = now - self.t0
        parts = [f"[{self.title}]"]
        if self.total:
            parts.append(f"{self.done:,}/{self.total:,} ({100 * self.done / self.total:.0f}%)")
            rate_done, rate_time = self.done - self.phase_done0, now - self.phase_t0
            eta = rate_time / rate_done * (self.total - self.done) if rate_done > 0 else None
            parts.append(f"{_clock(elapsed)} elapsed" + (f", ETA {_clock(eta)}" if eta is not None else ""))
        else:
            parts.append(f"{self.done:,} done, {_clock(elapsed)} elapsed")
        parts += [x for x in (self.what, self.info) if x]
        print(" ".join(parts), file=sys.stderr, flush=True)

    def start(self, total: int, description: str = "") -> None:
        self.total, self.done, self.what = total, 0, description
        self._phase(0)
        self.event = self.phase_t0

    def advance(self, n: int = 1) -> None:
        if not n:  # nothing done (e.g. no other process's share): no line repeating the last count
            return
        self.done += n
        self.event = time.monotonic()
        self._line()

    def describe(self, description: str) -> None:
        self.what = description

    def report(self, done: int, total: int, info: str) -> None:
        if total != self.total or done < self.done:
            # another loop's count: a new phase, whose first unit (reported now) began at the last event
            self._phase(max(done - 1, 0), since=self.event)
        self.event = time.monotonic()
        self.done, self.total, self.info = done, total, info
        self._line(force=done == total)

    def log(self, message: str) -> None:
        print(flagify(message, self.flags), file=sys.stderr, flush=True)

    def finish(self) -> None:
        if self.done:
            self._line(force=True)


@contextmanager
def progress_bar(
    title: str, ctx: typer.Context | None = None, enabled: bool = True, info: bool = False
) -> Iterator[RichProgress]:
    """A :class:`RichProgress` for the duration of the block (``enabled=False``: log lines only); log lines
    name settings as the flags of ``ctx``'s command. When stderr is not a terminal (a log file), a
    :class:`LineProgress` instead: a progress line every :data:`LINE_EVERY` seconds, and a last one when the
    block ends, only if it ends without an error (a failed run's last line would claim a finished count)."""
    if enabled and not sys.stderr.isatty():
        lines = LineProgress(title, command_flags(ctx))
        yield lines  # type: ignore[misc]
        lines.finish()  # not reached when the block raised
        return
    columns = [
        TextColumn(f"[bold]{title}" + " {task.fields[what]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    ]
    if info:
        columns.append(TextColumn("{task.fields[info]}"))
    with Progress(*columns, console=Console(stderr=True), disable=not enabled, transient=False) as bar:
        yield RichProgress(bar, command_flags(ctx))
