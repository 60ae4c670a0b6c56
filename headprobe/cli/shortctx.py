"""``headprobe shortctx eval``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from headprobe.cli.common import check_run, resumable, say_error, settings_from, with_settings
from headprobe.core.settings import MODELS_HELP, Range
from headprobe.evals.shortctx.settings import ShortCtxSettings


def shortctx_eval(
    ctx: typer.Context,
    checkpoints: Annotated[list[Path], typer.Argument(help=MODELS_HELP)],
    out: Annotated[Path, typer.Option(help="results folder")] = Path("results/shortctx"),
    device: str = "cpu",
    batch_size: Annotated[int, typer.Option(help="sequences scored together (right-padded)"), Range(minimum=1)] = 16,
    progress: bool = True,
    **options: Any,
) -> None:
    """Multiple-choice accuracy by log-likelihood (acc and length-normalised acc_norm), as tables."""
    from headprobe.cli.progress import progress_bar
    from headprobe.evals.shortctx.job import evaluate_many

    check_run(ctx, out, device)
    settings = settings_from(ShortCtxSettings, options)
    with resumable(out, ctx), progress_bar("shortctx", ctx, enabled=progress) as bar:
        report = evaluate_many(checkpoints, out, settings, device=device, batch_size=batch_size, progress=bar)
    if not report.primary:  # another process of a torchrun launch: the first one reports
        return
    for name, scores in report.results.items():
        value = scores.set_index("metric")["value"]
        n = int(scores["n"].iloc[0])
        typer.echo(f"{name} {settings.task}: acc {value['acc']:.4f}  acc_norm {value['acc_norm']:.4f}  ({n} items)")
    for name, message in report.errors.items():
        say_error(f"{name}: {message}", ctx)
    if report.errors:
        raise typer.Exit(1)


with_settings(shortctx_eval, ShortCtxSettings)  # its options: ShortCtxSettings' fields (headprobe.core.settings)
