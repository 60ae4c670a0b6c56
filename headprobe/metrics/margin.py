"""Needle margin and dilution: how clearly each head's query picks the needle's keys out of the haystack at
the answer steps, as the haystack grows (docs/mechanisms.md).

The needle's answer is teacher-forced after its prompt (:func:`headprobe.metrics.retrieval.forced_prompt`), so
every model gets numbers, whether it answers or not. At each answer step (query row ``r``), for each head,
with ``s_j = scale * q_r . k_j`` the pre-softmax logit of each key ``j`` the row sees, ``N`` the needle's keys
(the answer span and the needle reach after it, as the forced mass counts them) and ``H`` every other key the
row sees (the haystack, the question and the forced answer so far):

* ``margin = max_{j in N} s_j - max_{j in H} s_j`` (nats): above 0, the needle's best key beats every other;
* ``mass = sum_{j in N} softmax(s)_j`` (0-1): the forced mass of :mod:`headprobe.metrics.retrieval`;
* ``rank = 1 + #{j in H: s_j > max_N s} + #{j in H: s_j = max_N s} / 2``: the needle's best key's place
  among the keys (1 = first; ties count half, the expected place under a random order of equals).

A row whose window holds no needle key (a sliding-window head far from the needle) has ``mass`` 0 and no
margin or rank. Per head and sample, ``margin`` and ``rank`` are means over the answer steps that see a needle
key (NaN when none does; ``seen`` is their share), ``mass`` the mean over every answer step. The logits of
the answer rows alone are built, one head at a time: ``[rows, keys]``, linear in the length, never ``L x L``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from headprobe.hooked.base import HookedModel
from headprobe.margin_table import head_means
from headprobe.metrics.attention import HEAD_COLUMNS
from headprobe.metrics.probe import PassHook, Probe, Shared, score_sample
from headprobe.metrics.retrieval import Span, call_rows, forced_prompt
from headprobe.model.masks import CausalMask
from headprobe.model.seam import AttentionCall
from headprobe.results import Column, Schema
from headprobe.text.needles import NeedlePrompt

NEEDLE_MARGIN = Schema(
    "needle_margin",
    (
        *HEAD_COLUMNS,
        Column("sample", "int", "index of the needle sample"),
        Column("depth", "float", "needle depth (percent of the haystack)"),
        Column("answer_steps", "int", "answer tokens teacher-forced and scored"),
        Column("seen", "float", "share of the answer steps whose window holds a needle key (0-1)"),
        Column(
            "margin",
            "float",
            "mean over the answer steps that see the needle of the needle's best key logit minus the best other "
            "key's (nats; NaN when no step sees it)",
        ),
        Column("mass", "float", "mean over the answer steps of the attention mass on the needle's keys (0-1)"),
        Column(
            "rank",
            "float",
            "mean over the answer steps that see the needle of its best key's place among the keys (1 = first, "
            "ties half; NaN when no step sees it)",
        ),
    ),
)


def needle_logit_stats(
    q: Tensor, k: Tensor, q_pos: Tensor, key_start: int, window: int | None, scale: float, needle: tuple[int, int]
) -> tuple[Tensor, Tensor, Tensor]:
    """Margin, mass and rank (the module docstring) of every head at some query rows, in float64.

    Args:
        q: the rows' queries ``[heads, rows, qk_dim]``.
        k: every key of the call ``[kv_heads, k_len, qk_dim]`` (query head ``h`` reads kv head
            ``h // (heads // kv_heads)``).
        q_pos: the rows' absolute positions ``[rows]``.
        key_start: the absolute position of ``k[:, 0]``.
        window: keys visible per query including its own (``None``: full causal).
        scale: the softmax scale of ``q . k``.
        needle: ``[start, end)``, the needle's keys in absolute positions.

    Returns:
        ``(margin, mass, rank)``, each ``[heads, rows]``; ``margin`` and ``rank`` NaN (``mass`` 0) at a row
        that sees no needle key.
    """
    heads, groups = q.shape[0], q.shape[0] // k.shape[0]
    k_pos = key_start + torch.arange(k.shape[1], device=k.device)
    seen = CausalMask(window).visible(q_pos.to(k.device)[:, None], k_pos[None, :])  # [rows, k_len]
    inside = (k_pos >= needle[0]) & (k_pos < needle[1])
    out = torch.empty(3, heads, q.shape[1], dtype=torch.float64)
    for h in range(heads):
        s = (q[h].double() @ k[h // groups].double().T) * scale  # [rows, k_len]
        s = s.masked_fill(~seen, -math.inf)
        on_needle, off_needle = s.masked_fill(~inside, -math.inf), s.masked_fill(inside, -math.inf)
        best = on_needle.amax(-1, keepdim=True)  # [rows, 1]
        mass = torch.exp(torch.logsumexp(on_needle, -1) - torch.logsumexp(s, -1))
        above = (off_needle > best).sum(-1) + 0.5 * (off_needle == best).sum(-1)
        none = torch.isinf(best[:, 0])
        out[0, h] = (best[:, 0] - off_needle.amax(-1)).masked_fill(none, math.nan).cpu()
        out[1, h] = mass.nan_to_num(0.0).cpu()
        out[2, h] = (1 + above.double()).masked_fill(none, math.nan).cpu()
    return out[0], out[1], out[2]


def margin_rows(
    model: HookedModel, ids: list[int], rows: list[int], needle: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One forward pass over ``ids`` whose hook (:func:`margin_hook`) computes, at the query ``rows`` only (absolute
    positions), :func:`needle_logit_stats` of every head. Returns ``margin``, ``mass`` and ``rank``, each ``[rows,
    layers, max_heads]`` (NaN where a layer has fewer heads)."""
    out, hook = margin_hook(model, rows, needle)
    score_sample(model, Probe(((tuple(ids), hook),), lambda: None))
    return out[0], out[1], out[2]


def margin_hook(model: HookedModel, rows: list[int], needle: tuple[int, int]) -> tuple[np.ndarray, PassHook]:
    """``[3, rows, layers, max_heads]`` of NaN (margin, mass, rank), and the hook that fills it during a pass."""
    width = max(info.n_heads for info in model.layers)
    out = np.full((3, len(rows), len(model.layers), width), math.nan)
    wanted = torch.as_tensor(rows, dtype=torch.long)

    def record(call: AttentionCall, memo: Shared) -> None:
        found, at = call_rows(call, wanted)
        if not len(found):
            return
        q = call.q[0][:, at.to(call.q.device)]  # [heads, rows, qk_dim]
        stats = needle_logit_stats(q, call.k[0], wanted[found], call.key_start, call.window, call.scale, needle)
        for i, value in enumerate(stats):
            out[i][found, call.layer, : call.q.shape[1]] = value.T.numpy()

    return out, record


def _mean_where_seen(values: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """Mean over the answer steps (axis 0) where ``seen``; NaN where no step is."""
    count = seen.sum(0)
    total = np.where(seen, values, 0.0).sum(0)
    return np.divide(total, count, out=np.full(total.shape, math.nan), where=count > 0)


def margin_sample(
    model: HookedModel, prompt: NeedlePrompt, sample: int, span: Span | str = Span.EXACT, reach: int = 0
) -> pd.DataFrame:
    """One needle prompt's :data:`NEEDLE_MARGIN` rows (every head): its answer teacher-forced
    (:func:`~headprobe.metrics.retrieval.forced_prompt`, with the needle ``reach``), one forward pass."""
    return score_sample(model, margin_probe(model, prompt, sample, span, reach))


def margin_probe(
    model: HookedModel, prompt: NeedlePrompt, sample: int, span: Span | str = Span.EXACT, reach: int = 0
) -> Probe:
    """:func:`margin_sample` as a :class:`~headprobe.metrics.probe.Probe` (its pass shared with the other forced
    definitions of the sample); its result is the sample's rows."""
    forced = forced_prompt(model, prompt, span, reach)
    out, hook = margin_hook(model, forced.rows, forced.read)
    return Probe(((tuple(forced.ids), hook),), lambda: margin_frame(model, prompt, sample, forced.rows, out))


def margin_frame(
    model: HookedModel, prompt: NeedlePrompt, sample: int, rows: list[int], out: np.ndarray
) -> pd.DataFrame:
    """The sample's :data:`NEEDLE_MARGIN` rows from :func:`margin_hook`'s arrays."""
    margin, mass, rank = out
    seen = ~np.isnan(margin)
    by_step = {"seen": seen.mean(0), "margin": _mean_where_seen(margin, seen), "mass": np.nan_to_num(mass).mean(0),
               "rank": _mean_where_seen(rank, seen)}  # fmt: skip
    return pd.DataFrame.from_records(
        {"layer": info.index, "head": h, "layer_type": str(info.layer_type), "sample": sample, "depth": prompt.depth,
         "answer_steps": len(rows), **{name: float(v[info.index, h]) for name, v in by_step.items()}}
        for info in model.layers
        for h in range(info.n_heads)
    )  # fmt: skip


def margin_summary(frame: pd.DataFrame) -> Iterator[tuple[int, str, int | None, str, float]]:
    """Per length and layer type (and ``all``): the mean mass and margin over the heads and the largest mass;
    and (``all`` only) the head with the largest mass (``top_layer``, ``top_head``) and its margin and rank
    (``top_margin``, ``top_rank``)."""
    for length, part in head_means(frame).groupby("length"):
        n = int(length)
        for kind, group in [("all", part), *part.groupby("layer_type")]:
            yield n, kind, None, "mean_mass", float(group["mass"].mean())
            yield n, kind, None, "max_mass", float(group["mass"].max())
            yield (
                n,
                kind,
                None,
                "mean_margin",
                float(group["margin"].mean()) if group["margin"].notna().any() else math.nan,
            )
        top = part.loc[part["mass"].idxmax()]
        yield n, "all", None, "top_layer", float(top.layer)
        yield n, "all", None, "top_head", float(top["head"])
        yield n, "all", None, "top_margin", float(top.margin)
        yield n, "all", None, "top_rank", float(top["rank"])


def margin_headline(part: pd.DataFrame) -> str:
    """``part``: the needle margin's summary rows at one length."""
    v = part[part.layer_type == "all"].set_index("statistic")["value"]
    return (
        f"mean mass on the needle {v['mean_mass']:.3f}; the top head, layer {int(v['top_layer'])} head "
        f"{int(v['top_head'])}: mass {v['max_mass']:.3f}, margin {v['top_margin']:+.2f} nats, rank {v['top_rank']:.1f}"
    )
