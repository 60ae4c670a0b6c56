"""``headprobe figures`` (every figure and table a results folder allows: a study's, and per-model figures
of any model's ``analyze`` / ``ruler eval`` / ablation results) and ``headprobe report`` (all of them on one
self-contained HTML page)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from headprobe.cli.common import fail, kept_in, on_interrupt, wide_console, words


def figures(
    ctx: typer.Context,
    results: Annotated[
        Path, typer.Argument(help="a results folder (what `headprobe study`, `analyze` or `ruler eval` wrote)")
    ],
    out: Annotated[Path, typer.Option(help="folder for the figures and tables")] = Path("figures-out"),
    only: Annotated[str | None, typer.Option(help="comma list of figure names (default: all)")] = None,
    format: Annotated[str, typer.Option("--format", help="comma list of png, pdf, svg")] = "png",
) -> None:
    """Draw every figure (png/pdf/svg) and table (md/tex/csv) that the results allow: a study's, and per
    model the retrieval heads, entropy and effective rank by layer, RULER-style scores and ablations; the
    others are listed with what they lack."""
    from figures import SPECS, asked_not_drawn, draw, nothing_drawn
    from headprobe.cli.show import results_warnings

    console = wide_console()
    on_interrupt(ctx, lambda: kept_in(out), "rerun the same command to draw them all")  # each figure written whole
    with results_warnings():
        report = draw(results, out, SPECS, only=words(only) if only else None, formats=words(format))
    for name, paths in report.drawn.items():
        console.print(f"[green]drew[/] {name}: " + ", ".join(str(p) for p in paths))
    for name, why in report.skipped.items():
        console.print(f"[yellow]skipped[/] {name}: {why}")
    for name, why in report.absent.items():  # figures of another kind of folder: named only when asked for
        if only:
            console.print(f"[yellow]skipped[/] {name}: {why}")
    if not report.drawn and only:
        raise fail(asked_not_drawn(results, [s for s in SPECS if s.name in words(only)], report), ctx)
    if not report.drawn:
        raise fail(nothing_drawn(results, SPECS), ctx)
    console.print(f"{len(report.drawn)} drawn, {len(report.skipped)} skipped, in {report.out}")


def report(
    ctx: typer.Context,
    results: Annotated[
        Path, typer.Argument(help="a results folder (what `headprobe study`, `analyze` or `ruler eval` wrote)")
    ],
    out: Annotated[Path, typer.Option(help="the HTML file to write")] = Path("report.html"),
    overwrite: Annotated[
        bool, typer.Option(help="replace --out when it is a file headprobe did not write (its own page is redone)")
    ] = False,
) -> None:
    """One self-contained HTML page (figures embedded, no network) with every figure and table the results
    allow, the settings that produced them and their caveats."""
    from figures import SPECS, nothing_drawn
    from figures.report import report_page
    from headprobe.cli.show import results_warnings
    from headprobe.core.atomic import atomic_write_text
    from headprobe.core.outputs import PAGE, claim

    if out.is_dir():
        raise fail(f"--out {out} is a folder; give the HTML file to write, e.g. {out / 'report.html'}", ctx)
    claim(out, PAGE, inputs=[results], overwrite=overwrite)
    with results_warnings():
        page = report_page(results, SPECS)
    if not page.shown:
        raise fail(nothing_drawn(results, SPECS, "report"), ctx)
    atomic_write_text(out, page.html)
    skipped = f"; not drawn: {', '.join(page.skipped)}" if page.skipped else ""
    typer.echo(f"report: {out} ({len(page.shown)} figures and tables{skipped})")
