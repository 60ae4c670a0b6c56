"""``headprobe ablate``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from headprobe.cli.common import (
    MemoryLimit,
    check_run,
    fail,
    gib,
    ints,
    resumable,
    say_error,
    token_counts,
    words,
)
from headprobe.core.settings import DTYPE_HELP, MODELS_HELP, PROMPT_FORMAT_HELP

HEADS_HELP = (
    "a head set to ablate (repeat for several): top:K (the K best by retrieval score in --from), random:K (K "
    "random heads outside the top set, one set per --seeds), or LAYER.HEAD,LAYER.HEAD (e.g. 17.3,18.7)"
)


def ablate(
    ctx: typer.Context,
    checkpoints: Annotated[list[Path], typer.Argument(help=MODELS_HELP)],
    heads: Annotated[list[str] | None, typer.Option(help=HEADS_HELP)] = None,
    from_results: Annotated[
        Path | None,
        typer.Option("--from", help="a `headprobe analyze --metrics retrieval` output: ranks heads for top:K"),
    ] = None,
    modes: Annotated[str, typer.Option(help="comma list of zero (the head writes nothing) | mean (its mean)")] = "zero",
    seeds: Annotated[str, typer.Option(help="comma list of seeds, one random set each")] = "0,1,2",
    tasks: Annotated[str, typer.Option(help="comma list of needle (the analyze needles) and RULER niah_* tasks")] = (
        "needle"
    ),
    lengths: Annotated[str, typer.Option(help="comma list of prompt lengths in tokens (1536,2k)")] = "2048",
    depths: Annotated[str, typer.Option(help="needle depths in percent")] = "0,25,50,75,100",
    samples: Annotated[int, typer.Option(help="prompts per length and depth (needle) or per length (RULER)")] = 2,
    needles: Annotated[str, typer.Option(help="builtin | codes | a .jsonl file of needles")] = "builtin",
    prompt_format: Annotated[str, typer.Option(help=PROMPT_FORMAT_HELP)] = "auto",
    seed: Annotated[int, typer.Option(help="haystack and RULER sample seed")] = 0,
    max_new_tokens: Annotated[int, typer.Option(help="decoding budget of a needle answer")] = 32,
    out: Annotated[Path, typer.Option(help="results folder")] = Path("results/ablate"),
    device: Annotated[str, typer.Option(help="cpu | cuda")] = "cpu",
    dtype: Annotated[str | None, typer.Option(help=DTYPE_HELP)] = None,
    memory_limit: MemoryLimit = None,
    allow_beyond_trained: Annotated[
        bool, typer.Option(help="lengths beyond what a model was trained on (refused otherwise)")
    ] = False,
    progress: bool = True,
) -> None:
    """Needle accuracy with heads ablated (the top retrieval heads, random heads, named heads) against the
    unablated model on the same prompts: Wu et al.'s causal test of retrieval heads. Tables ``ablation``
    (accuracy per condition x task x length x depth) and ``ablation_samples`` in OUT/<model>/."""
    from headprobe.ablation import AblateSettings
    from headprobe.ablation import ablate as run
    from headprobe.cli.progress import progress_bar
    from headprobe.cli.show import print_tables
    from headprobe.show import ShownTable, ablation_table, baseline_caveats

    check_run(ctx, out, device)
    try:
        seed_list, length_list = ints(seeds), token_counts(lengths)
    except typer.BadParameter as err:  # a malformed list: one line, not click's usage panel
        raise fail(err, ctx) from None
    settings = AblateSettings(
        heads=heads or ["top:10", "random:10"],
        from_results=str(from_results) if from_results else None,
        modes=words(modes),
        seeds=seed_list,
        tasks=words(tasks),
        lengths=length_list,
        depths=[float(d) for d in words(depths)],
        samples=samples,
        needles=needles,
        prompt_format=prompt_format,
        seed=seed,
        max_new_tokens=max_new_tokens,
        dtype=dtype,
        allow_beyond_trained=allow_beyond_trained,
    )
    settings.validate()  # bad settings: refused before any work (shown with these flags: headprobe.cli._Context)
    with resumable(out, ctx), progress_bar("ablate", ctx, enabled=progress) as bar:
        report = run(checkpoints, out, settings, device=device, memory_limit=gib(memory_limit), progress=bar)
    for name, table in report.results.items():
        typer.echo(f"{name}: {out / name}")
        print_tables([ShownTable("needle accuracy with heads ablated", ablation_table(table.assign(model=name)))])
        for caveat in baseline_caveats(table.assign(model=name)):
            typer.secho(f"warning: {caveat}", fg=typer.colors.YELLOW, err=True)
    for name, message in report.errors.items():
        say_error(f"{name}: {message}", ctx)
    if report.errors:
        raise typer.Exit(1)
