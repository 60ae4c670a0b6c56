"""``headprobe demo``."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from headprobe.cli.common import fail, wide_console


def demo(
    ctx: typer.Context,
    seq_len: Annotated[int, typer.Option("--seq-len")] = 1024,
    new_tokens: Annotated[int, typer.Option("--new-tokens")] = 24,
    seed: int = 0,
) -> None:
    """The built-in CPU default: plan the paper grids, build and run every toy preset."""
    from headprobe.cli.plan import plan_table
    from headprobe.demo import run_demo
    from headprobe.plan import configs_for, plan_rows

    console = wide_console()
    for scale in ("0.6b", "3b"):
        console.print(plan_table(plan_rows(configs_for(scale), 4096), 4096))
    try:
        results = run_demo(seq_len=seq_len, new_tokens=new_tokens, seed=seed)
    except RuntimeError as err:
        raise fail(err, ctx, code=1) from None
    console.print(toy_table(results, seq_len, new_tokens))


def toy_table(results: list[dict], seq_len: int, new_tokens: int) -> Table:
    table = Table(title=f"Toy presets (random init): forward on {seq_len} bytes, greedy decode of {new_tokens}")
    for col in (
        "preset",
        "params",
        "full heads x qk/v",
        "loss (ln 264 = 5.58)",
        "fwd tok/s",
        "decode tok/s",
        "cached decode = full recompute",
        "norm. entropy full / sliding",
    ):
        table.add_column(col)
    for r in results:
        table.add_row(
            r["preset"],
            f"{r['params']:,}",
            r["full"],
            f"{r['loss']:.3f}",
            f"{r['fwd_tokens_per_s']:,.0f}",
            f"{r['decode_tokens_per_s']:,.0f}",
            "yes" if r["cache_matches"] else "NO",
            f"{r['norm_entropy_full']:.3f} / {r['norm_entropy_sliding']:.3f}",
        )
    return table
