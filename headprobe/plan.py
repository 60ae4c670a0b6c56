"""The planner behind ``headprobe plan``: the cost of each way of splitting an attention budget.

One row per configuration, from :func:`headprobe.model.budget.budget`, plus each member's change against
the first member of its grid (the narrow-head baseline, e.g. ``0.6b-d128``).
"""

from __future__ import annotations

from typing import Any

from headprobe.model.attention import planned_backend
from headprobe.model.budget import budget
from headprobe.model.config import ModelConfig
from headprobe.model.presets import list_presets, preset


def plan_rows(configs: list[ModelConfig], seq_len: int) -> list[dict[str, Any]]:
    """Tidy rows (one per config) with every :class:`~headprobe.model.budget.Budget` field plus derived ones:
    ``full_qk_budget``/``full_v_budget`` (heads x width of the full layers), ``params_vs_baseline`` and
    ``flops_vs_baseline`` (ratios to the first config of the same scale); ``swa_gpu_backend`` /
    ``full_gpu_backend``: the attention backend ``auto`` runs for that layer type on a CUDA GPU."""
    rows = []
    baselines: dict[str, dict[str, Any]] = {}
    for cfg in configs:
        row = budget(cfg, seq_len).to_dict()
        row["full_qk_budget"] = cfg.full.n_heads * cfg.full.qk_head_dim
        row["full_v_budget"] = cfg.full.n_heads * cfg.full.v_head_dim
        row["full_kv_heads"] = cfg.full.kv_heads
        row["window"] = cfg.swa.window
        for kind, layer in (("swa", cfg.swa), ("full", cfg.full)):  # what `auto` runs on a CUDA GPU
            row[f"{kind}_gpu_backend"] = planned_backend(layer.qk_head_dim, layer.v_head_dim).value
        scale = (cfg.name or "custom").split("-")[0]
        base = baselines.setdefault(scale, row)
        row["params_vs_baseline"] = row["params"] / base["params"]
        row["flops_vs_baseline"] = row["flops_per_token"] / base["flops_per_token"]
        rows.append(row)
    return rows


def configs_for(scale: str | None) -> list[ModelConfig]:
    """Presets of one scale, or of every scale when ``scale`` is ``None``."""
    return [preset(name) for name in list_presets(scale)]
