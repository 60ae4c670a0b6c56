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
def analyze(
    checkpoints: Annotated[list[Path], typer.Argument(help="checkpoint folders (ours or local Hugging Face models)")],
    metrics: Annotated[str, typer.Option(help="comma list of retrieval,entropy,reordering,erank")] = (
        "retrieval,entropy,reordering,erank"
    ),
    lengths: Annotated[str, typer.Option(help="comma list of context lengths in tokens")] = "4096",
    samples: Annotated[int, typer.Option(help="inputs per length (needle prompts for retrieval)")] = 4,
    rows: Annotated[str, typer.Option(help="query rows to analyse: all | last:N | stride:N")] = "all",
    topk: Annotated[int, typer.Option(help="top-k keys per row for token reordering")] = 16,
    out: Annotated[Path, typer.Option(help="results folder")] = Path("results/analyze"),
    seed: int = 0,
    max_new_tokens: Annotated[int, typer.Option(help="retrieval: decoding budget per sample")] = 50,
    haystack_file: Annotated[list[Path] | None, typer.Option(help="text files to use as haystack")] = None,
    device: Annotated[str, typer.Option(help="cpu | cuda")] = "cpu",
    memory_limit: Annotated[float | None, typer.Option(help="GiB the run may use (default: what is free)")] = None,
    progress: bool = True,
) -> None:
    """Per-head retrieval scores, attention entropy, token reordering and per-layer effective rank,
    exact and without any L x L matrix; results as Parquet plus summary.json."""
    from headprobe.analyze import AnalysisError, AnalyzeSettings
    from headprobe.analyze import analyze as run

    try:
        settings = AnalyzeSettings(
            metrics=[m.strip() for m in metrics.split(",") if m.strip()],
            lengths=[int(x) for x in lengths.split(",") if x.strip()],
            samples=samples,
            rows=rows,
            topk=topk,
            seed=seed,
            max_new_tokens=max_new_tokens,
            haystack=[str(f) for f in haystack_file] if haystack_file else None,
        )
        settings.validate()
    except (AnalysisError, ValueError) as err:
        typer.secho(f"error: {err}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    limit = int(memory_limit * 2**30) if memory_limit else None
    result = run(checkpoints, out, settings, device=device, memory_limit=limit, progress=progress)
    for name, summary in result["checkpoints"].items():
        typer.echo(f"{name}: {out / name}")
        for metric, per_length in summary["metrics"].items():
            for length, entry in per_length.items():
                typer.echo(f"  {metric:10s} L={length:>7}: {_one_line(metric, entry)}")
    if result["errors"]:
        raise typer.Exit(1)


def _one_line(metric: str, entry: dict) -> str:
    if metric == "retrieval":
        heads = entry["retrieval_heads"].get("all", {})
        return (
            f"{entry['n_kept']}/{entry['n_samples']} samples kept, {heads.get('count', 0)} retrieval heads "
            f"({heads.get('fraction', 0):.1%})"
        )
    if metric == "erank":
        values = list(entry["per_layer"].values())
        return f"effective rank {values[0]:.1f} (embedding) -> {values[-1]:.1f} (last block)"
    by_type = ", ".join(f"{t} {v:.3f}" for t, v in entry["by_layer_type"].items())
    return f"mean {entry['mean']:.3f} ({by_type})"


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
