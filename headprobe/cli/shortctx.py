"""``headprobe shortctx eval``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from headprobe.cli.common import check_run, resumable, say_error
from headprobe.core.settings import DTYPE_HELP, MODELS_HELP, Range


def shortctx_eval(
    ctx: typer.Context,
    checkpoints: Annotated[list[Path], typer.Argument(help=MODELS_HELP)],
    task: Annotated[
        str, typer.Option(help="builtin, jsonl, arc, hellaswag, winogrande, race, piqa, openbookqa, commonsenseqa")
    ] = "builtin",
    file: Annotated[Path | None, typer.Option(help="the task's local file (original format)")] = None,
    limit: Annotated[int | None, typer.Option(help="evaluate only the first N items")] = None,
    out: Annotated[Path, typer.Option(help="results folder")] = Path("results/shortctx"),
    device: str = "cpu",
    dtype: Annotated[str | None, typer.Option(help=DTYPE_HELP)] = None,
    batch_size: Annotated[int, typer.Option(help="sequences scored together (right-padded)"), Range(minimum=1)] = 16,
    progress: bool = True,
) -> None:
    """Multiple-choice accuracy by log-likelihood (acc and length-normalised acc_norm), as tables."""
    from headprobe.cli.progress import progress_bar
    from headprobe.evals.shortctx.evaluate import ShortCtxSettings, evaluate_many

    check_run(ctx, out, device)
    settings = ShortCtxSettings(task=task, file=str(file) if file else None, limit=limit, dtype=dtype)
    settings.validate()  # before the progress bar: a bad setting is the only thing printed
    with resumable(out, ctx), progress_bar("shortctx", ctx, enabled=progress) as bar:
        report = evaluate_many(checkpoints, out, settings, device=device, batch_size=batch_size, progress=bar)
    for name, scores in report.results.items():
        value = scores.set_index("metric")["value"]
        n = int(scores["n"].iloc[0])
        typer.echo(f"{name} {task}: acc {value['acc']:.4f}  acc_norm {value['acc_norm']:.4f}  ({n} items)")
    for name, message in report.errors.items():
        say_error(f"{name}: {message}", ctx)
    if report.errors:
        raise typer.Exit(1)
