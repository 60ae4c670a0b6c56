"""``headprobe analyze``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from headprobe.analysis.settings import AnalyzeSettings
from headprobe.cli.common import (
    MemoryLimit,
    check_run,
    gib,
    resumable,
    say_error,
    settings_from,
    with_settings,
)
from headprobe.core.settings import MODELS_HELP
from headprobe.core.steps import STEPS_HELP, select_steps


def analyze(
    ctx: typer.Context,
    checkpoints: Annotated[list[Path], typer.Argument(help=MODELS_HELP)],
    out: Annotated[Path, typer.Option(help="results folder")] = Path("results/analyze"),
    device: Annotated[str, typer.Option(help="cpu | cuda")] = "cpu",
    memory_limit: MemoryLimit = None,
    steps: Annotated[
        str | None,
        typer.Option(
            help=f"each model is a training run folder: analyse its step checkpoints, {STEPS_HELP}; every table "
            "gains step and tokens columns"
        ),
    ] = None,
    progress: bool = True,
    **options: Any,
) -> None:
    """Per-head retrieval scores, attention entropy, token reordering and per-layer effective rank,
    exact and without any L x L matrix; tidy Parquet tables per checkpoint."""
    from headprobe.analysis import analyze as run
    from headprobe.cli.progress import progress_bar
    from headprobe.metrics import METRICS

    if steps is not None:  # each run's chosen step folders, refused before any work when it holds none of them
        checkpoints = [folder for run_folder in checkpoints for folder in select_steps(run_folder, steps)]
    check_run(ctx, out, device)
    settings = settings_from(AnalyzeSettings, options)  # a malformed list: one line naming its flag (_Context)
    with resumable(out, ctx), progress_bar("analyze", ctx, enabled=progress) as bar:
        report = run(checkpoints, out, settings, device=device, memory_limit=gib(memory_limit), progress=bar)
    if not report.primary:  # another process of a torchrun launch: the first one reports
        return
    for name, summary in report.results.items():
        folder = out / name
        typer.echo(f"{name}: {folder}")
        width = max(10, *(len(m) for m in summary["metric"]))
        for (metric, length), part in summary.groupby(["metric", "length"], sort=False):
            typer.echo(f"  {metric:{width}s} L={length:>7}: {METRICS[metric].headline(part)}")
        for line in retrieval_diagnoses(folder, settings.needles):
            typer.echo(f"  {line}")
    for name, message in report.errors.items():
        say_error(f"{name}: {message}", ctx)
    if report.errors:
        raise typer.Exit(1)


def retrieval_diagnoses(folder: Path, needles: str) -> list[str]:
    """One line per length at which fewer than half of the needle samples were kept: why, and what to try
    (:func:`headprobe.metrics.retrieval.diagnose`)."""
    from headprobe.metrics.retrieval import RETRIEVAL_SAMPLES, diagnose
    from headprobe.results import read_table, table_path

    path = table_path(folder, RETRIEVAL_SAMPLES.table)
    if not path.is_file():
        return []
    table = read_table(path)
    chat = bool(table.meta.model_facts.get("chat_template"))
    lines = []
    for length, part in table.frame.groupby("length"):
        if part["kept"].sum() * 2 < len(part):
            lines.append(
                f"retrieval L={length}: {int(part['kept'].sum())} of {len(part)} kept: {diagnose(part, needles, chat)}"
            )
    return lines


with_settings(analyze, AnalyzeSettings)  # its options: AnalyzeSettings' fields (headprobe.core.settings)
