"""The ``headprobe`` command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from trainer.cli import data_app, train_app

app = typer.Typer(
    help="headprobe: how attention-head shape decides long-context retrieval.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(train_app, name="train")
app.add_typer(data_app, name="data")


@app.command()
def plan(
    scale: Annotated[str | None, typer.Option(help="toy | 0.6b | 3b (default: all grids)")] = None,
    seq_len: Annotated[int, typer.Option("--seq-len", help="sequence length for FLOPs and KV cache")] = 4096,
    config: Annotated[
        list[Path] | None,
        typer.Option("--config", help="price a config.json (repeatable) instead of presets"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON list instead of a table")] = False,
) -> None:
    """Parameters, attention parameters, training FLOPs/token and KV-cache bytes of each grid member."""
    from headprobe.plan import configs_for, plan_rows, plan_table, wide_console
    from trainer.config import ConfigError, ModelConfig, list_scales

    if seq_len < 1:
        raise typer.BadParameter("--seq-len must be >= 1")
    try:
        if config:
            configs = [ModelConfig.load(p) for p in config]
        else:
            if scale is not None and scale not in list_scales():
                raise typer.BadParameter(f"unknown scale {scale!r}; choose one of {list_scales()}")
            configs = configs_for(scale)
    except (ConfigError, FileNotFoundError) as err:
        raise typer.BadParameter(str(err)) from None
    rows = plan_rows(configs, seq_len)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
    else:
        wide_console().print(plan_table(rows, seq_len))


@app.command()
def demo(
    seq_len: Annotated[int, typer.Option("--seq-len")] = 1024,
    new_tokens: Annotated[int, typer.Option("--new-tokens")] = 24,
    seed: int = 0,
) -> None:
    """The built-in CPU default: plan the paper grids, build and run every toy preset."""
    from headprobe.demo import run_demo

    run_demo(seq_len=seq_len, new_tokens=new_tokens, seed=seed)


if __name__ == "__main__":
    app()
