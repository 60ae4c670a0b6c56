"""``headprobe show``: a results folder as tables on the terminal."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from headprobe.cli.common import wide_console, words
from headprobe.core.settings import Range


def show(
    ctx: typer.Context,
    results: Annotated[
        Path, typer.Argument(help="a results folder (analyze, ruler eval, shortctx eval or study output)")
    ],
    metric: Annotated[
        str | None,
        typer.Option(
            help="comma list of retrieval, needle_margin, entropy, reordering, erank, ruler, shortctx, ablation, "
            "graft, definitions, head_agreement, verdicts (default: all)"
        ),
    ] = None,
    top: Annotated[
        int, typer.Option(help="heads listed per checkpoint (retrieval, needle_margin, definitions)"), Range(minimum=1)
    ] = 10,
) -> None:
    """Print what a results folder holds as small tables, checkpoints side by side: the top retrieval
    heads, retrieval-head counts and per-layer-type means, RULER-style scores, short-context accuracy. No
    pandas needed."""
    from headprobe.show import show_tables

    with results_warnings():
        tables = show_tables(results, words(metric) if metric else None, top)
    print_tables(tables)


@contextmanager
def results_warnings() -> Iterator[None]:
    """Each distinct :class:`headprobe.results.ResultsWarning` raised inside (e.g. results sharing a name read
    apart) printed once, as a ``warning:`` line on stderr, when the block ends."""
    from headprobe.results import ResultsWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResultsWarning)
        try:
            yield
        finally:
            for w in caught:  # any other warning as Python would have shown it
                if not issubclass(w.category, ResultsWarning):
                    warnings.showwarning(w.message, w.category, w.filename, w.lineno)
            said = dict.fromkeys(str(w.message) for w in caught if issubclass(w.category, ResultsWarning))
            for message in said:
                typer.secho(f"warning: {message}", fg=typer.colors.YELLOW, err=True)


def print_tables(tables: list) -> None:
    """:class:`headprobe.show.ShownTable` s on the terminal, as rich tables."""
    from rich.table import Table

    console = wide_console()
    for shown in tables:
        frame = shown.frame.reset_index()
        table = Table(title=shown.title, caption=shown.note or None, title_justify="left", min_width=len(shown.title))
        for column in frame.columns:
            table.add_column(str(column), justify="right" if frame[column].dtype.kind in "fi" else "left")
        for row in frame.itertuples(index=False):
            table.add_row(*("" if v is None or v != v else f"{v:.3f}" if isinstance(v, float) else str(v) for v in row))
        console.print(table)
