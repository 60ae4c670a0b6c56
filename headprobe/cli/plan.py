"""``headprobe plan``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from headprobe.cli.common import wide_console
from headprobe.core.settings import Range


def plan(
    ctx: typer.Context,
    scale: Annotated[str | None, typer.Option(help="toy | 0.6b | 3b (default: all grids)")] = None,
    seq_len: Annotated[
        int, typer.Option("--seq-len", help="sequence length for FLOPs and KV cache"), Range(minimum=1)
    ] = 4096,
    config: Annotated[
        list[Path] | None,
        typer.Option("--config", help="price our config.json (repeatable) instead of presets; not a .gguf"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON list instead of a table")] = False,
) -> None:
    """Parameters, attention parameters, training FLOPs/token and KV-cache bytes of each grid member."""
    from headprobe.model.config import ConfigError, ModelConfig
    from headprobe.model.presets import list_scales
    from headprobe.plan import configs_for, plan_rows

    if config:
        configs = [ModelConfig.load(p) for p in config]
    else:
        if scale is not None and scale not in list_scales():
            raise ConfigError(f"unknown scale {scale!r}; choose --scale from {', '.join(list_scales())}")
        configs = configs_for(scale)
    rows = plan_rows(configs, seq_len)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
    else:
        wide_console().print(plan_table(rows, seq_len))


def _si(x: float, unit: str = "") -> str:
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= factor:
            return f"{x / factor:.2f}{prefix}{unit}"
    return f"{x:.0f}{unit}"


def _bytes(x: float) -> str:
    for factor, prefix in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(x) >= factor:
            return f"{x / factor:.2f} {prefix}"
    return f"{x:.0f} B"


def plan_table(rows: list[dict[str, Any]], seq_len: int) -> Table:
    table = Table(title=f"Attention-budget plan at sequence length {seq_len:,} (KV cache in bf16)")
    for col, justify in [
        ("preset", "left"),
        ("full heads x qk/v", "left"),
        ("qk / v budget", "right"),
        ("params", "right"),
        ("vs base", "right"),
        ("attn params swa / full", "right"),
        ("train FLOP/token", "right"),
        ("attn share", "right"),
        ("KV bytes/token", "right"),
        ("KV per new token", "right"),
        ("KV cache @L", "right"),
        ("GPU kernel swa / full", "left"),
    ]:
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        table.add_row(
            r["name"],
            f"{r['full_heads']} x {r['full_qk_dim']}/{r['full_v_dim']}",
            f"{r['full_qk_budget']} / {r['full_v_budget']}",
            _si(r["params"]),
            f"{(r['params_vs_baseline'] - 1) * 100:+.2f}%",
            f"{_si(r['attn_params_swa'])} / {_si(r['attn_params_full'])}",
            _si(r["flops_per_token"]),
            f"{r['attn_flops_per_token'] / r['flops_per_token'] * 100:.1f}%",
            _bytes(r["kv_bytes_per_token"]),
            _bytes(r["kv_bytes_per_new_token"]),
            _bytes(r["kv_cache_bytes"]),
            f"{r['swa_gpu_backend']} / {r['full_gpu_backend']}",
        )
    return table
