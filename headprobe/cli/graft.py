"""``headprobe graft``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import typer

from headprobe.cli.common import MemoryLimit, check_run, gib, resumable, say_error, settings_from, with_settings
from headprobe.core.settings import MODELS_HELP
from headprobe.graft.settings import GraftSettings


def graft(
    ctx: typer.Context,
    base: Annotated[
        Path, typer.Argument(help="the model the parts are grafted into; " + MODELS_HELP.split(": ", 1)[1])
    ],
    donor: Annotated[Path, typer.Argument(help="the model they come from, of BASE's architecture")],
    out: Annotated[Path, typer.Option(help="results folder")] = Path("results/graft"),
    device: Annotated[str, typer.Option(help="cpu | cuda")] = "cpu",
    memory_limit: MemoryLimit = None,
    progress: bool = True,
    **options: Any,
) -> None:
    """BASE with DONOR's weights for each part set (embeddings, norms, attention or MLP of chosen layers, any
    parameter glob), measured beside BASE and DONOR on the same needle prompts and held-out rows: which parts
    carry DONOR's gain. Table ``graft`` in OUT/<base>/ (one row per part set x metric x length)."""
    from headprobe.cli.progress import progress_bar
    from headprobe.cli.show import print_tables
    from headprobe.graft import graft as run
    from headprobe.show import graft_table

    check_run(ctx, out, device)
    settings = settings_from(GraftSettings, options | {"donor": str(donor)})
    with resumable(out, ctx), progress_bar("graft", ctx, enabled=progress) as bar:
        report = run([base], out, settings, device=device, memory_limit=gib(memory_limit), progress=bar)
    if not report.primary:  # another process of a torchrun launch: the first one reports
        return
    for name, table in report.results.items():
        typer.echo(f"{name}: {out / name}")
        print_tables([graft_table(table)])
    for name, message in report.errors.items():
        say_error(f"{name}: {message}", ctx)
    if report.errors:
        raise typer.Exit(1)


# its options: GraftSettings' fields but the donor (an argument)
with_settings(graft, GraftSettings, [f.name for f in dataclasses.fields(GraftSettings) if f.name != "donor"])
