"""The planner behind ``headprobe plan``: the cost of each way of splitting an attention budget.

One row per configuration, from :func:`headprobe.model.budget.budget`, plus each member's change against
the first member of its grid (the narrow-head baseline, e.g. ``0.6b-d128``).
"""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from headprobe.model.budget import budget
from headprobe.model.config import ModelConfig
from headprobe.model.presets import list_presets, preset


def plan_rows(configs: list[ModelConfig], seq_len: int) -> list[dict[str, Any]]:
    """Tidy rows (one per config) with every :class:`~headprobe.model.budget.Budget` field plus derived ones:
    ``full_qk_budget``/``full_v_budget`` (heads x width of the full layers), ``params_vs_baseline`` and
    ``flops_vs_baseline`` (ratios to the first config of the same scale)."""
    rows = []
    baselines: dict[str, dict[str, Any]] = {}
    for cfg in configs:
        row = budget(cfg, seq_len).to_dict()
        row["full_qk_budget"] = cfg.full.n_heads * cfg.full.qk_head_dim
        row["full_v_budget"] = cfg.full.n_heads * cfg.full.v_head_dim
        row["full_kv_heads"] = cfg.full.kv_heads
        row["window"] = cfg.swa.window
        scale = (cfg.name or "custom").split("-")[0]
        base = baselines.setdefault(scale, row)
        row["params_vs_baseline"] = row["params"] / base["params"]
        row["flops_vs_baseline"] = row["flops_per_token"] / base["flops_per_token"]
        rows.append(row)
    return rows


def configs_for(scale: str | None) -> list[ModelConfig]:
    """Presets of one scale, or of every scale when ``scale`` is ``None``."""
    return [preset(name) for name in list_presets(scale)]


def wide_console() -> Console:
    """A console that does not squeeze wide tables into 80 columns when output is piped or logged."""
    return Console() if sys.stdout.isatty() else Console(width=200)


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
        )
    return table
