"""The one progress display: a rich bar implementing :class:`headprobe.runs.Progress`."""

from __future__ import annotations

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
        self.task = bar.add_task("", total=None, what="")

    def start(self, total: int, description: str = "") -> None:
        self.bar.update(self.task, total=total, completed=0, what=description)

    def advance(self, n: int = 1) -> None:
        self.bar.advance(self.task, n)

    def describe(self, description: str) -> None:
        self.bar.update(self.task, what=description)

    def report(self, done: int, total: int, info: str) -> None:
        """A callback form for code that reports ``(done, total, status)`` (the trainer's loops)."""
        self.bar.update(self.task, completed=done, total=total, info=info)

    def log(self, message: str) -> None:
        self.bar.console.print(flagify(message, self.flags), markup=False, highlight=False)


@contextmanager
def progress_bar(
    title: str, ctx: typer.Context | None = None, enabled: bool = True, info: bool = False
) -> Iterator[RichProgress]:
    """A :class:`RichProgress` for the duration of the block (``enabled=False``: log lines only); log lines
    name settings as the flags of ``ctx``'s command."""
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
        progress = RichProgress(bar, command_flags(ctx))
        if info:
            bar.update(progress.task, info="")
        yield progress
