"""``headprobe ablate``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from headprobe.ablation.settings import AblateSettings
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


def ablate(
    ctx: typer.Context,
    checkpoints: Annotated[list[Path], typer.Argument(help=MODELS_HELP)],
    out: Annotated[Path, typer.Option(help="results folder")] = Path("results/ablate"),
    device: Annotated[str, typer.Option(help="cpu | cuda")] = "cpu",
    memory_limit: MemoryLimit = None,
    progress: bool = True,
    **options: Any,
) -> None:
    """Needle accuracy with heads ablated (the top retrieval heads, random heads, named heads) against the
    unablated model on the same prompts: Wu et al.'s causal test of retrieval heads. Tables ``ablation``
    (accuracy per condition x task x length x depth) and ``ablation_samples`` in OUT/<model>/."""
    from headprobe.ablation import ablate as run
    from headprobe.cli.progress import progress_bar
    from headprobe.cli.show import print_tables
    from headprobe.show import ShownTable, ablation_table, baseline_caveats

    check_run(ctx, out, device)
    settings = settings_from(AblateSettings, options)  # a malformed list: one line naming its flag (_Context)
    with resumable(out, ctx), progress_bar("ablate", ctx, enabled=progress) as bar:
        report = run(checkpoints, out, settings, device=device, memory_limit=gib(memory_limit), progress=bar)
    if not report.primary:  # another process of a torchrun launch: the first one reports
        return
    for name, table in report.results.items():
        typer.echo(f"{name}: {out / name}")
        print_tables([ShownTable("needle accuracy with heads ablated", ablation_table(table.assign(model=name)))])
        for caveat in baseline_caveats(table.assign(model=name)):
            typer.secho(f"warning: {caveat}", fg=typer.colors.YELLOW, err=True)
    for name, message in report.errors.items():
        say_error(f"{name}: {message}", ctx)
    if report.errors:
        raise typer.Exit(1)


with_settings(ablate, AblateSettings)  # its options: AblateSettings' fields (headprobe.core.settings)
