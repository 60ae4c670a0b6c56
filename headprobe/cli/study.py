"""``headprobe study`` and ``headprobe demo`` (the study's demo profile on the toy grid)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from headprobe.cli.common import fail, ints, resumable, stopped, wide_console, words
from headprobe.cli.progress import progress_bar
from headprobe.core.settings import Range


def run(
    ctx: typer.Context,
    recipe: str,
    profile: str | None,
    out: Path,
    seeds: str | None = None,
    members: str | None = None,
    device: str = "cpu",
    progress: bool = True,
    jobs: int = 1,
    runs: str | None = None,
) -> None:
    """Train the recipe's grid, measure every run, print the comparisons (shared by study and demo)."""
    from headprobe.cli.train import trainer_plugin
    from headprobe.study import StudySettings, run_study

    plugin = trainer_plugin()
    if plugin is None:
        raise fail("the study trains its grid with the bundled trainer, which is not installed", ctx)
    info = plugin.recipe(recipe, profile)  # a bad recipe: one line (its errors are user errors: headprobe.cli)
    settings = StudySettings.from_dict(info["study"])
    chosen = words(members) if members else None
    run_list = words(runs) if runs else None
    seed_list = ints(seeds) if seeds else None
    with resumable(out, ctx), progress_bar("study", ctx, enabled=progress, info=True) as bar:

        def log(message: str) -> None:
            bar.log(message)
            bar.describe(message.split(":")[0])

        def train_grid(runs: Path) -> dict:
            return plugin.grid(
                recipe, str(runs), chosen, run_list, seed_list, profile, None, log=log, on_step=bar.report, jobs=jobs
            )

        record = {"recipe": info["source"], "profile": profile, "seeds": seed_list or list(info["seeds"])}
        report = run_study(out, train_grid, settings, device=device, progress=bar, record=record)
    if report.interrupted:  # its training took the Ctrl-C or SIGTERM: the run saved a step and stopped
        raise stopped(ctx)
    console = wide_console()
    for title, frame in report.comparisons.items():
        console.print(frame_table(title, frame))
    if not report.verdicts.empty:  # last: what the study's findings come to at this scale
        from headprobe.study.verdicts import verdict_cells

        title = "Verdicts: the study's findings at this scale (docs/study.md)"
        console.print(frame_table(title, verdict_cells(report.verdicts)))
    for what, message in report.errors.items():
        typer.echo(f"failed: {what}: {message}", err=True)
    typer.echo(f"results: {out} (tables/, report.md)")
    draw_figures(out, out / "figures")


def draw_figures(results: Path, folder: Path) -> None:
    """Every figure and table the results allow, into ``folder``, and all of them on one page,
    ``results/report.html``; a figure that cannot be drawn is reported, never fatal (the study's results
    are already written)."""
    from figures import SPECS, draw
    from figures.report import write_report

    try:
        drawn = draw(results, folder, SPECS)
        page = write_report(results, results / "report.html", SPECS)
    except Exception as err:
        typer.echo(f"failed: figures: {err}", err=True)
        return
    skipped = "; ".join(f"{name} ({why})" for name, why in drawn.skipped.items())
    typer.echo(f"figures: {folder} ({len(drawn.drawn)} drawn" + (f"; skipped: {skipped})" if skipped else ")"))
    typer.echo(f"report: {results / 'report.html'} ({len(page.shown)} figures and tables on one page)")


def frame_table(title: str, frame) -> Table:
    table = Table(title=title, min_width=len(title) + 4)  # a title never wraps
    for col in frame.columns:
        table.add_column(str(col))
    for row in frame.itertuples(index=False):
        table.add_row(*("" if v is None or v != v else str(v) for v in row))
    return table


def study(
    ctx: typer.Context,
    recipe: Annotated[str, typer.Option(help="a built-in scale (toy) or a recipe JSON file")] = "toy",
    profile: Annotated[str | None, typer.Option(help="a profile of the recipe (e.g. demo)")] = None,
    seeds: Annotated[str | None, typer.Option(help="comma list, e.g. 0,1,2 (default: the recipe's)")] = None,
    members: Annotated[str | None, typer.Option(help="comma list, e.g. d16,k64v16 (default: all)")] = None,
    runs: Annotated[
        str | None, typer.Option(help="comma list of the recipe's runs to train and measure, e.g. pt (default: all)")
    ] = None,
    out: Annotated[Path, typer.Option(help="results folder")] = Path("results/study"),
    device: Annotated[str, typer.Option(help="cpu | cuda")] = "cpu",
    jobs: Annotated[
        int, typer.Option(help="member x seed chains trained at once, one process each (CPU)"), Range(minimum=1)
    ] = 1,
    progress: bool = True,
) -> None:
    """The study end to end: train the grid (pt -> cpt, cpt with attention frozen -> sft), probe retrieval,
    analyze, evaluate, and compare the members; rerun to resume."""
    run(ctx, recipe, profile, out, seeds, members, device, progress, jobs, runs)


def demo(
    ctx: typer.Context,
    out: Annotated[Path | None, typer.Option(help="results folder (default results/demo, results/real-demo)")] = None,
    jobs: Annotated[int, typer.Option(help="members trained at once, one process each"), Range(minimum=1)] = 2,
    real: Annotated[
        bool,
        typer.Option("--real", help="a real pretrained model instead (SmolLM2-135M-Instruct, docs/real-models.md)"),
    ] = False,
    model: Annotated[
        Path | None, typer.Option(help="--real: this model folder or .gguf file instead of SmolLM2")
    ] = None,
    progress: bool = True,
) -> None:
    """The toy study on CPU in minutes (the toy recipe's demo profile: five members, one seed), or with
    --real a real pretrained model's retrieval heads, layers, RULER-style scores and head ablation."""
    if real:
        run_real(ctx, out or Path("results/real-demo"), model, progress)
        return
    if model is not None:
        raise fail("--model goes with --real (the toy demo trains its own models)", ctx)
    run(ctx, "toy", "demo", out or Path("results/demo"), progress=progress, jobs=jobs)


def run_real(ctx: typer.Context, out: Path, model: Path | None, progress: bool) -> None:
    """``headprobe demo --real``: :func:`headprobe.study.real.real_demo`, its tables, figures and report."""
    from headprobe.cli.show import print_tables
    from headprobe.show import show_tables
    from headprobe.study.real import real_demo

    # a --model that is no model, an --out refused or a busy folder: refused before any step (real_demo checks first)
    with resumable(out, ctx), progress_bar("real-demo", ctx, enabled=progress) as bar:
        report = real_demo(out, model, progress=bar, say=typer.echo)
    if report.steps:  # no "results:" line for a folder no step wrote into
        print_tables(show_tables(out, ["retrieval", "erank", "ruler", "ablation"], top=10))
        draw_figures(out, out / "figures")
        typer.echo(f"results: {out}")
    if report.errors:
        raise typer.Exit(1)
