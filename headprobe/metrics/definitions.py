"""The retrieval-head definitions behind one interface: each scores every head of one needle sample, and its
samples become one head table of its name (docs/metrics.md, "Retrieval-head definitions").

=================  ==============================================================================================
retrieval          Wu et al.'s copy score from greedy decoding (:mod:`headprobe.metrics.retrieval`)
retrieval_forced   Wu's rule at the teacher-forced answer steps (every model has numbers)
needle_mass        HeadKV's retrieval-reasoning score: top-k attention mass on the needle (:mod:`.headkv`)
query_focus        QRHead's query-focused score, calibrated by a null question (:mod:`.qrhead`)
echo, induction    RazorAttention's scores on four copies of a random sequence (:mod:`.razor`)
logit_contrib      LOCOS's logit contribution of the needle against the rest (:mod:`.locos`)
=================  ==============================================================================================

Each definition describes one sample's work as a :class:`~headprobe.metrics.probe.Probe`: the forward passes it
needs (token ids and a hook that sees every attention call) and how its scores come out of them.
:func:`~headprobe.metrics.probe.run_probes` runs the probes of every definition asked for one sample together,
**one forward pass per distinct input**: the forced definitions (``retrieval_forced``, ``needle_mass``,
``logit_contrib``, Wu's own forced columns) and ``query_focus``'s question rows read the same pass over the prompt
and its forced answer, ``echo`` and ``induction`` the same pass over their random copies; hooks of one pass share
what they compute alike (the probabilities of the answer rows, the rows' log-sum-exp).

Every definition but ``retrieval`` (which keeps its own tables) writes two tables:

* ``<name>_samples``: one row per sample x layer x head, its ``value`` in that sample, and ``missing``: why the
  sample has no number (its prompt lacks what the definition needs), ``""`` when it has one;
* ``<name>``: one row per layer x head, ``value`` the mean over the samples with a number, and for grouped-query
  models the head's key/value group (``kv_head``) with the group's ``group_max`` and ``group_mean``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple, Protocol

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from headprobe.hooked.base import HookedModel
from headprobe.metrics.attention import HEAD_COLUMNS
from headprobe.metrics.probe import PassHook, Probe, Shared, shared
from headprobe.metrics.probs import row_probs
from headprobe.metrics.retrieval import Span, answer_span, call_rows, copy_scores, forced_prompt
from headprobe.metrics.summaries import SummaryRow
from headprobe.model.config import LayerInfo
from headprobe.model.seam import AttentionCall
from headprobe.results import Column, Schema
from headprobe.text.needles import NeedlePrompt

MISSING = Column(
    "missing", "str", "why this sample has no number (its prompt lacks what the definition needs); '' if it has one"
)
GROUP_COLUMNS = (
    Column("kv_head", "int", "the head's key/value head (its group of query heads; the head itself without GQA)"),
    Column("group_max", "float", "the largest value over the query heads of the head's key/value group"),
    Column("group_mean", "float", "the mean value over the query heads of the head's key/value group"),
)


class Scored(NamedTuple):
    """One sample's scores of every head: ``values`` by column name, each ``[layers, max_heads]`` (NaN where a
    layer has fewer heads), or none and ``missing``, why the sample has no number."""

    values: dict[str, np.ndarray]
    missing: str = ""


class Options(Protocol):
    """What a definition reads of the analysis settings (:class:`headprobe.metrics.DecodeOptions` has it)."""

    span: str
    needle_reach: int
    seed: int


RowsSeen = Callable[[AttentionCall, np.ndarray, Tensor], None]  # (call, indices into the rows, probs [heads, rows, k])


def refused(missing: str) -> Probe:
    """The probe of a sample a definition cannot score: no pass, and ``missing`` says why."""
    return Probe((), lambda: Scored({}, missing))


def head_grid(model: HookedModel) -> np.ndarray:
    """``[layers, max_heads]`` of NaN, for one sample's scores of every head."""
    return np.full((len(model.layers), max(info.n_heads for info in model.layers)), math.nan)


def rows_hook(rows: Sequence[int], seen: RowsSeen) -> PassHook:
    """A hook that hands every attention call, with the exact probabilities of the query ``rows`` (absolute
    positions) over its keys (:func:`~.probs.row_probs`, ``[heads, rows, k_len]``, shared by the pass's hooks that
    ask for the same rows), to ``seen(call, found, probs)`` (``found``: which of ``rows`` the call holds, in order)."""
    wanted = torch.as_tensor(list(rows), dtype=torch.long)
    key = tuple(int(r) for r in rows)

    def record(call: AttentionCall, memo: Shared) -> None:
        found, at = call_rows(call, wanted)
        if len(found):
            seen(call, found, shared(memo, ("row_probs", call.layer, key), lambda: row_probs(call, at)))

    return record


def head_schema(name: str, value: str, extra: Sequence[Column] = ()) -> Schema:
    """The head table of definition ``name``: ``value`` (and ``extra`` columns) as means over the scored samples."""
    return Schema(
        name,
        (
            *HEAD_COLUMNS,
            Column("value", "float", f"mean over the samples with a number of {value} (NaN when none has one)"),
            *extra,
            Column("n_scored", "int", "samples with a number"),
            Column("n_samples", "int", "samples scored or refused"),
            *GROUP_COLUMNS,
        ),
    )


def samples_schema(name: str, value: str, extra: Sequence[Column] = ()) -> Schema:
    """The per-sample table of definition ``name``."""
    return Schema(
        f"{name}_samples",
        (
            *HEAD_COLUMNS,
            Column("kv_head", "int", "the head's key/value head"),
            Column("sample", "int", "index of the needle sample"),
            Column("value", "float", f"{value} in this sample (NaN when it has none)"),
            *extra,
            MISSING,
        ),
    )


def sample_frame(layers: Sequence[LayerInfo], scored: Scored, columns: Sequence[str], sample: int) -> pd.DataFrame:
    """One sample's rows (every head) of a per-sample table: ``columns`` from ``scored.values`` (NaN when missing)."""
    return pd.DataFrame.from_records(
        {"layer": info.index, "head": h, "layer_type": str(info.layer_type),
         "kv_head": h // (info.n_heads // info.n_kv_heads), "sample": sample,
         **{c: float(scored.values[c][info.index, h]) if not scored.missing else math.nan for c in columns},
         "missing": scored.missing}
        for info in layers
        for h in range(info.n_heads)
    )  # fmt: skip


def head_table(samples: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """The head table from every sample's rows: each of ``columns`` averaged over the samples with a number (in
    sample order), ``n_scored`` and ``n_samples``, and the ``value``'s maximum and mean over each key/value group."""
    keys = ["layer", "head", "layer_type", "kv_head"]
    scored = samples[samples["missing"] == ""]
    heads = samples[samples["sample"] == samples["sample"].min()][keys].reset_index(drop=True)
    means = scored.sort_values("sample").groupby(["layer", "head"], sort=True)[list(columns)].mean().reset_index()
    out = heads.merge(means, on=["layer", "head"], how="left")
    out["n_scored"] = scored["sample"].nunique()
    out["n_samples"] = samples["sample"].nunique()
    group = out.groupby(["layer", "kv_head"])["value"]
    out["group_max"] = group.transform("max")
    out["group_mean"] = group.transform("mean")
    return out[[*keys[:3], *columns, "n_scored", "n_samples", *keys[3:], "group_max", "group_mean"]]


def definition_rows(frame: pd.DataFrame) -> Iterator[SummaryRow]:
    """Per length and layer type (and ``all``): the mean and the largest ``value``; and (``all``) the samples
    scored and the head with the largest value (``top_layer``, ``top_head``; NaN when no sample was scored)."""
    for length, part in frame.groupby("length"):
        n = int(length)
        for kind, group in [("all", part), *part.groupby("layer_type")]:
            finite = group["value"].dropna()
            yield n, str(kind), None, "mean", float(finite.mean()) if len(finite) else math.nan
            yield n, str(kind), None, "max", float(finite.max()) if len(finite) else math.nan
        yield n, "all", None, "n_scored", float(part["n_scored"].iloc[0])
        yield n, "all", None, "n_samples", float(part["n_samples"].iloc[0])
        best = part["value"].dropna()
        top = part.loc[best.idxmax()] if len(best) else None
        yield n, "all", None, "top_layer", math.nan if top is None else float(top["layer"])
        yield n, "all", None, "top_head", math.nan if top is None else float(top["head"])


def definition_headline(part: pd.DataFrame) -> str:
    """``part``: one definition's summary rows at one length."""
    v = part[part.layer_type == "all"].set_index("statistic")["value"]
    scored = f"{int(v['n_scored'])}/{int(v['n_samples'])} samples scored"
    if math.isnan(v["top_layer"]):
        return f"{scored}: no number"
    top = f"layer {int(v['top_layer'])} head {int(v['top_head'])}"
    return f"{scored}; top head {top} ({v['max']:.3g}), mean {v['mean']:.3g}"


NO_SPAN = "no answer span found in the prompt (retrieval_span=reference found no window)"


def forced_copy(model: HookedModel, prompt: NeedlePrompt, options: Options) -> Probe:
    """``retrieval_forced``: Wu's rule at the teacher-forced answer steps (:func:`~.retrieval.copy_scores`: a head
    copies at a step when its largest probability falls on the span token being forced), its count form ``value``
    and set form ``set_value``; no number when the answer span is not in the prompt (Wu's span search,
    ``retrieval_span=reference``, can find none)."""
    if answer_span(model, prompt, options.span)[0] < 0:
        return refused(NO_SPAN)
    forced = forced_prompt(model, prompt, Span(options.span), options.needle_reach)
    argmax = np.full((len(forced.rows), *head_grid(model).shape), -1, dtype=np.int64)

    def seen(call: AttentionCall, found: np.ndarray, probs: Tensor) -> None:
        argmax[found, call.layer, : probs.shape[0]] = (probs.argmax(-1) + call.key_start).T.cpu().numpy()

    def score() -> Scored:
        copies = copy_scores(argmax, forced.targets, prompt.ids, [forced.span])
        return Scored({"value": copies.value, "set_value": copies.set_value})

    return Probe(((tuple(forced.ids), rows_hook(forced.rows, seen)),), score)
