"""``headprobe analyze``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from headprobe.cli.common import (
    DTYPE_HELP,
    PROMPT_FORMAT_HELP,
    check_counts,
    check_run,
    fail,
    gib,
    resumable,
    say_error,
    token_counts,
    words,
)
from headprobe.core.errors import HeadprobeError


def analyze(
    ctx: typer.Context,
    checkpoints: Annotated[list[Path], typer.Argument(help="checkpoint folders (ours or local Hugging Face models)")],
    metrics: Annotated[str, typer.Option(help="comma list of retrieval,entropy,reordering,erank")] = (
        "retrieval,entropy,reordering,erank"
    ),
    lengths: Annotated[str, typer.Option(help="comma list of context lengths in tokens (4096,16k,128K)")] = "4096",
    samples: Annotated[int, typer.Option(help="inputs per length (needle prompts for retrieval)")] = 4,
    rows: Annotated[str, typer.Option(help="query rows to analyse: all | last:N | stride:N")] = "all",
    topk: Annotated[int, typer.Option(help="top-k keys per row for token reordering")] = 16,
    out: Annotated[Path, typer.Option(help="results folder")] = Path("results/analyze"),
    seed: int = 0,
    max_new_tokens: Annotated[int, typer.Option(help="retrieval: decoding budget per sample")] = 50,
    haystack: Annotated[
        list[Path] | None, typer.Option("--haystack-file", help="text files to use as haystack")
    ] = None,
    needles: Annotated[str, typer.Option(help="retrieval's needle set: builtin | codes (the toy models')")] = "builtin",
    retrieval_span: Annotated[
        str, typer.Option(help="retrieval: exact (the answer's tokens) | reference (Wu et al.'s find_needle_idx)")
    ] = "exact",
    prompt_format: Annotated[str, typer.Option(help=PROMPT_FORMAT_HELP)] = "auto",
    device: Annotated[str, typer.Option(help="cpu | cuda")] = "cpu",
    dtype: Annotated[str | None, typer.Option(help=DTYPE_HELP)] = None,
    memory_limit: Annotated[float | None, typer.Option(help="GiB the run may use (default: what is free)")] = None,
    allow_beyond_trained: Annotated[
        bool, typer.Option(help="analyse lengths beyond what a model was trained on (refused otherwise)")
    ] = False,
    progress: bool = True,
) -> None:
    """Per-head retrieval scores, attention entropy, token reordering and per-layer effective rank,
    exact and without any L x L matrix; tidy Parquet tables per checkpoint."""
    from headprobe.analysis import AnalyzeSettings
    from headprobe.analysis import analyze as run
    from headprobe.cli.progress import progress_bar
    from headprobe.core.atomic import FolderBusy
    from headprobe.metrics import METRICS, Rows
    from headprobe.probe import BeyondTrainedError

    check_run(ctx, out, device)
    check_counts(ctx, ("--samples", samples, 1), ("--topk", topk, 1), ("--max-new-tokens", max_new_tokens, 1))
    try:
        settings = AnalyzeSettings(
            metrics=words(metrics),
            lengths=token_counts(lengths),
            samples=samples,
            rows=Rows.parse(rows),
            topk=topk,
            seed=seed,
            max_new_tokens=max_new_tokens,
            haystack=[str(f) for f in haystack] if haystack else None,
            needles=needles,
            retrieval_span=retrieval_span,
            prompt_format=prompt_format,
            dtype=dtype,
            allow_beyond_trained=allow_beyond_trained,
        )
        settings.validate()
    except (HeadprobeError, typer.BadParameter) as err:  # bad options or settings
        raise fail(err, ctx) from None
    with resumable(out), progress_bar("analyze", ctx, enabled=progress) as bar:
        try:
            report = run(checkpoints, out, settings, device=device, memory_limit=gib(memory_limit), progress=bar)
        except (FolderBusy, BeyondTrainedError) as err:  # refused before any model loads
            raise fail(err, ctx) from None
    if not report.primary:  # another process of a torchrun launch: the first one reports
        return
    for name, summary in report.results.items():
        folder = out / name
        typer.echo(f"{name}: {folder}")
        for (metric, length), part in summary.groupby(["metric", "length"], sort=False):
            typer.echo(f"  {metric:10s} L={length:>7}: {METRICS[metric].headline(part)}")
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
