"""``headprobe explore --export page.html``: one self-contained page to share, no server needed.

The page is the explorer's own (``static/``), with its script and style inlined and the answers the
server would have sent embedded (:func:`headprobe.explore.app.api_answer`, keyed as the page asks for
them). What it embeds is planned first (:func:`plan_export`, from :class:`ExportSettings`):

* for every model: its info, every per-head metric (the whole overview), every token, the needle view;
* for the chosen heads only (``heads``: ``top:K`` by a metric, the default ``top:8``; ``all``; or
  ``LAYER.HEAD,...``): the map tiles at the ``levels`` coarsest zoom levels, and the top keys of the
  question rows (or of the last :data:`ROWS` rows).

The page says what it left out and how to include it (:meth:`ExportPlan.note`); the overview greys out
the heads it has no maps of. Deeper zooms draw the finest embedded level, magnified.

Tiles are stored compactly (:func:`encode_tile`): only the pixels some query sees (the page applies the
same rule, :func:`visible_columns`), each as a uint16 code of ``log10(value / tile max)`` over
:data:`DECADES` decades, in base64. A value comes back within half a code step of the server's float32
value, a relative error of at most ``(10 ** (DECADES / (CODES - 1)) - 1) / 2`` = 1.4e-4; values below
``10 ** -DECADES`` of the tile's largest come back as 0 (the log colour scale spans 4 decades).

A page's size follows from the input's length, the layers and the chosen heads, so it is estimated
(:func:`page_bytes`; the tiles, nearly all of a page, exactly) before any model runs
(:func:`precheck_export`: a lower bound while ``top:K`` has not ranked the heads yet), and again once the
heads are known; a page over ``export_max_mib`` is refused (:class:`PageTooLarge`) before anything is written.
"""

from __future__ import annotations

import base64
import functools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

from headprobe.core.atomic import atomic_write_text
from headprobe.core.errors import HeadprobeError
from headprobe.core.settings import check_ranges, setting
from headprobe.explore.app import api_answer, asset
from headprobe.explore.inputs import ExploreInput
from headprobe.explore.pooling import TileSpec, tiles_across, top_level
from headprobe.explore.session import HEAD_METRIC_LABELS, ROW_STATS, ModelView
from headprobe.hooked.ablation import AblationError, Head, format_heads, parse_heads
from headprobe.hooked.base import HookedModel
from headprobe.model.config import LayerInfo

TOKEN_CHUNK = 1024  # as the page asks for tokens (explore.js TOKEN_CHUNK)
URI_SAFE = "-_.!~*'()"  # what encodeURIComponent leaves as it is
ROWS = 16  # query rows with precomputed top keys when the input has no question
TOP_KEYS = 10  # keys per precomputed row (explore.js selectRow asks for 10)
DECADES = 8  # a tile's values are coded over this many decades below its largest; smaller ones are 0
CODES = 65535  # uint16 codes: 0 is 0, 1 .. CODES the log scale
RESULTS_METRICS = ("results:retrieval", "results:entropy", "results:reordering")
MIB = 2**20


class ExportError(HeadprobeError, ValueError):
    """An export the settings cannot make (unknown heads or metric); the message names the setting."""


class PageTooLarge(ExportError):
    """A page whose estimated size is over ``export_max_mib``; the message says how to make it smaller."""


# -- what the page holds ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ExportSettings:
    """What an exported page holds and how big it may get; named as ``headprobe explore``'s options.

    Attributes:
        export_heads: the heads whose maps the page embeds: ``top:K`` (the K highest by ``export_metric``
            in each model), ``all`` (every captured head) or ``LAYER.HEAD,LAYER.HEAD`` (both from 0).
        export_metric: the per-head metric ``top:K`` ranks by, highest first (an overview metric, e.g.
            ``retrieval`` or ``results:retrieval``); ``auto``: the retrieval score, ties by the needle
            span mass, for needle and RULER inputs, the mean distance (tokens) for text.
        export_levels: how many of the coarsest zoom levels to embed (level ``n``: ``2**n`` tokens a pixel).
        export_max_mib: the largest page to write, MiB (2**20 bytes); a bigger one is refused.
    """

    export_heads: str = setting("top:8")
    export_metric: str = setting("auto")
    export_levels: int = setting(2, minimum=1)
    export_max_mib: float = setting(20.0, above=0)

    def validate(self) -> None:
        """Refuse settings no input can satisfy (:class:`ExportError` naming the setting): numbers by the one
        range rule (:func:`headprobe.core.settings.check_ranges`), heads and metric by their forms."""
        check_ranges(self, ExportError)
        self.choice()
        known = ("auto", *HEAD_METRIC_LABELS, *RESULTS_METRICS)
        if self.export_metric not in known:
            raise ExportError(
                f"`export_metric` {self.export_metric!r} is not a per-head metric; choose {', '.join(known)}"
            )

    @property
    def max_bytes(self) -> float:
        return self.export_max_mib * MIB

    def choice(self) -> tuple[str, int | list[Head]]:
        """``("top", K)``, ``("all", 0)`` or ``("heads", [Head, ...])``."""
        heads = self.export_heads
        kind, colon, count = heads.partition(":")
        if colon:
            if kind != "top" or not count.isdigit() or int(count) < 1:
                raise ExportError(f"`export_heads` {heads!r}: write top:K with K >= 1, all, or LAYER.HEAD,...")
            return "top", int(count)
        if heads == "all":
            return "all", 0
        try:
            return "heads", parse_heads(heads)
        except AblationError as err:
            raise ExportError(f"`export_heads` {heads!r}: {err} (or top:K, or all)") from None

    def rank_metrics(self, metrics: Sequence[str], kind: str) -> list[str]:
        """The metrics ``top:K`` ranks by, in order (later ones break ties), among ``metrics`` (those the
        model has) for an input of ``kind``; :class:`ExportError` when the asked one is not there."""
        if self.export_metric == "auto":
            wanted = ["retrieval", "needle_mass"] if kind != "text" else ["mean_distance"]
            return [m for m in wanted if m in metrics] or ["entropy"]
        if self.export_metric not in metrics:
            raise ExportError(
                f"`export_metric` {self.export_metric}: this input has no such metric; it has {', '.join(metrics)}"
            )
        return [self.export_metric]


def input_metrics(inp: ExploreInput, results: bool = False) -> list[str]:
    """The overview metrics a model will have on ``inp`` (:meth:`ModelView._head_metrics`), with an
    ``analyze`` folder's when ``results`` (those its tables hold; all three assumed here)."""
    metrics = list(ROW_STATS)
    if inp.spans and inp.question:
        metrics.append("needle_mass")
    if inp.decodes:
        metrics.append("retrieval")
    return metrics + (list(RESULTS_METRICS) if results else [])


def metric_label(metric: str) -> str:
    """How the page and the command call ``metric`` (``retrieval`` -> ``retrieval score``)."""
    return HEAD_METRIC_LABELS.get(metric, (metric,))[0]


@dataclass(frozen=True)
class PageModel:
    """What one model's part of a page weighs; known once the input is tokenised, before the forward pass.

    Attributes:
        name: the model's name on the page.
        layers: every layer of the model.
        captured: the indices of the captured layers (those whose heads can have maps).
        tokens: the input's token texts.
        rows: query positions whose top keys each exported head embeds.
        metrics: the overview metrics.
        steps: steps of the needle view (0: none; before decoding, its most).
        kind: the input's kind (text, needle, ruler).
    """

    name: str
    layers: tuple[LayerInfo, ...]
    captured: tuple[int, ...]
    tokens: tuple[str, ...]
    rows: tuple[int, ...]
    metrics: tuple[str, ...]
    steps: int
    kind: str

    @classmethod
    def before_capture(
        cls, model: HookedModel, inp: ExploreInput, layers: Sequence[int] | None, results: bool = False
    ) -> PageModel:
        """``model`` on ``inp`` before any work, capturing ``layers`` (``None``: all)."""
        chosen = set(range(len(model.layers)) if layers is None else layers)
        captured = tuple(i for i in sorted(chosen) if 0 <= i < len(model.layers))  # ModelView refuses others
        return cls(
            model.name,
            tuple(model.layers),
            captured,
            tuple(inp.tokens),
            tuple(export_rows(inp)),
            tuple(input_metrics(inp, results)),
            inp.max_new_tokens if inp.decodes else 0,
            inp.kind,
        )

    @classmethod
    def of(cls, view: ModelView) -> PageModel:
        """A loaded view: its captured layers, metrics and decoded steps as they are."""
        inp = view.input
        steps = len(view.evidence["tokens"]) if view.evidence is not None else 0
        captured = tuple(sorted(view.captures))
        return cls(
            view.name, tuple(view.layers), captured, tuple(inp.tokens), tuple(export_rows(inp)),
            tuple(view.metrics), steps, inp.kind,
        )  # fmt: skip

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def max_heads(self) -> int:
        return max(info.n_heads for info in self.layers)

    def heads(self) -> list[Head]:
        """Every head of the captured layers, in layer order."""
        return [Head(layer, h) for layer in self.captured for h in range(self.layers[layer].n_heads)]

    def levels(self, levels: int) -> list[int]:
        """The zoom levels a page with the ``levels`` coarsest embeds (:func:`embedded_levels`)."""
        return embedded_levels(self.length, levels)


def embedded_levels(length: int, levels: int) -> list[int]:
    """The ``levels`` coarsest zoom levels of a ``length``-token map (as many as it has), coarsest first."""
    top = top_level(length)
    return list(range(top, max(-1, top - levels), -1))


def export_rows(inp: ExploreInput) -> range:
    """The query rows whose top keys a page embeds: the question rows, or the last :data:`ROWS`."""
    return range(*inp.question) if inp.question else range(max(0, inp.length - ROWS), inp.length)


@dataclass(frozen=True)
class ExportPlan:
    """What one page embeds: per model, the heads with maps (``heads[m]``, page order) and the settings;
    ``ranked_by`` the metrics ``top:K`` ranked by (empty otherwise); ``models`` what each model weighs."""

    models: tuple[PageModel, ...]
    heads: tuple[tuple[Head, ...], ...]
    settings: ExportSettings
    ranked_by: tuple[str, ...] = ()
    size: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", page_bytes(self.models, self.heads, self.settings.export_levels))

    def summary(self) -> str:
        """One line: what the page holds and its estimated size, e.g. ``maps of 8 of 270 heads (the top 8 by
        retrieval score) at zoom levels 1-0 (of 1-0): about 3.4 MiB (limit 20 MiB)``."""
        parts = []
        for model, heads in zip(self.models, self.heads, strict=True):
            levels, name = (
                model.levels(self.settings.export_levels),
                f" of {model.name}" if len(self.models) > 1 else "",
            )
            parts.append(
                f"maps of {len(heads)} of {len(model.heads())} heads{name} ({self._why()}) at zoom levels "
                f"{levels[0]}-{levels[-1]} (of {top_level(model.length)}-0)"
            )
        return f"{'; '.join(parts)}: about {self.size / MIB:.1f} MiB (limit {self.settings.export_max_mib:g} MiB)"

    def _why(self) -> str:
        kind, count = self.settings.choice()
        if kind == "top":
            return f"the top {count} by {', ties by '.join(metric_label(m) for m in self.ranked_by)}"
        return "every captured head" if kind == "all" else f"named: {self.settings.export_heads}"

    def note(self) -> str:
        """What the page says it holds and left out, and how to include more."""
        held, fewer_heads, fewer_levels = [], False, False
        for model, heads in zip(self.models, self.heads, strict=True):
            levels, total = model.levels(self.settings.export_levels), top_level(model.length) + 1
            zoom = (
                "every zoom level, down to one token a pixel"
                if len(levels) == total
                else f"the {len(levels)} coarsest of {total} zoom levels, down to {2 ** levels[-1]} tokens a pixel "
                "(deeper zooms magnify that level)"
            )
            held.append(f"{len(heads)} of {len(model.heads())} heads of {model.name} ({self._why()}) at {zoom}")
            fewer_heads |= len(heads) < len(model.heads())
            fewer_levels |= len(levels) < total
        more = (
            [] if not fewer_heads else ["--export-heads LAYER.HEAD,... (or top:K, or all) for the greyed heads"]
        ) + (["--export-levels N for deeper zoom"] if fewer_levels else [])
        how = (
            f" To include more, export again with {', '.join(more)}; or run headprobe explore without --export."
            if more
            else ""
        )
        return f"This page holds every head's metrics (the overview), and the maps of {'; '.join(held)}.{how}"

    def check(self, out: str | Path) -> None:
        """Raise :class:`PageTooLarge` when the page is over ``export_max_mib``."""
        check_page_size(self.models, self.heads, self.settings, out, at_least=False)


def plan_export(views: Sequence[ModelView], settings: ExportSettings | None = None) -> ExportPlan:
    """Choose the heads ``settings`` name in each view (:class:`ExportPlan`). ``top:K`` takes each model's
    K highest heads by the ranking metrics (ties by the next metric, then by layer and head; heads
    without a value last), and every model embeds the union, so opening a head in one model of a
    comparison opens it in the other."""
    settings = settings or ExportSettings()
    settings.validate()
    models = tuple(PageModel.of(v) for v in views)
    kind, count = settings.choice()
    ranked_by: tuple[str, ...] = ()
    if kind == "heads":
        check_named_heads(models, count)
        chosen = list(count)
    elif kind == "all":
        chosen = [h for model in models for h in model.heads()]
    else:
        chosen = []
        for view, model in zip(views, models, strict=True):
            ranked_by = tuple(settings.rank_metrics(list(view.metrics), model.kind))

            chosen += sorted(model.heads(), key=lambda h, v=view, by=ranked_by: _rank_key(v, by, h))[:count]
    chosen = list(dict.fromkeys(chosen))
    heads = tuple(tuple(h for h in chosen if h in has) for has in (set(model.heads()) for model in models))
    return ExportPlan(models, heads, settings, ranked_by)


def _rank_key(view: ModelView, metrics: Sequence[str], head: Head) -> tuple:
    """Sort key of ``head`` in ``view``: highest value of each of ``metrics`` first, heads without one last,
    then by layer and head."""
    values = [view.metrics[m][head.layer, head.head] for m in metrics]
    return (*(-v if np.isfinite(v) else math.inf for v in values), head.layer, head.head)


def check_named_heads(models: Sequence[PageModel], heads: Sequence[Head]) -> None:
    """Refuse named heads that no model has among its captured heads (:class:`ExportError`)."""
    have = {h for model in models for h in model.heads()}
    missing = [h for h in heads if h not in have]
    if missing:
        model = models[0]
        counts = "/".join(str(c) for c in sorted({info.n_heads for info in model.layers}))
        raise ExportError(
            f"`export_heads` {format_heads(missing)}: {model.name} has no such captured head (layers "
            f"{','.join(map(str, model.captured))} captured, {counts} heads each, both from 0)"
        )


# -- the page's size ---------------------------------------------------------------------------------
def head_bytes(model: PageModel, head: Head, levels: int) -> int:
    """Bytes one head adds to a page: its tiles at the ``levels`` coarsest levels (exact, but for the
    digits of each tile's largest value) and its precomputed rows (estimated)."""
    digits = (len(str(head.layer)), len(str(head.head)))
    return _head_bytes(model.length, model.layers[head.layer].window, levels, model.rows, digits)


@functools.lru_cache(maxsize=64)
def _head_bytes(length: int, window: int | None, levels: int, rows: tuple[int, ...], digits: tuple[int, int]) -> int:
    """:func:`head_bytes` of a head whose layer and head indices have ``digits`` digits."""
    layer, head = (10 ** (d - 1) for d in digits)
    total = 0
    for level in embedded_levels(length, levels):
        n = tiles_across(length, level)
        for row in range(n):
            for col in range(row + 1):
                spec = TileSpec(level, row, col)
                if spec.empty(length, window):
                    continue
                lo, hi = visible_columns(spec, length, window)
                params = {"model": 0, "layer": layer, "head": head, "level": level, "row": row, "col": col}
                meta = _tile_meta(spec, length, 0.12345678901234568, "")
                total += _entry_bytes("tile", params, meta) + _base64_len(2 * int((hi - lo).sum()))
    for pos in rows:
        visible = pos + 1 if window is None else min(pos + 1, window)
        top_keys = min(TOP_KEYS, visible)
        answer = {
            "position": pos,
            "keys": [pos] * top_keys,
            "probs": [0.12345678901234568] * top_keys,
            "entropy": 1.2345678901234567,
            "norm_entropy": 0.12345678901234568,
            "visible": visible,
        }
        params = {"model": 0, "layer": layer, "head": head, "pos": pos, "k": TOP_KEYS}
        total += _entry_bytes("row", params, answer)
    return total


def model_bytes(model: PageModel) -> int:
    """Bytes a page spends on one model besides its heads' maps: tokens (exact), overview, info and the
    needle view (estimated: about 20 characters a number)."""
    tokens = sum(
        _entry_bytes("tokens", {}, {"start": s, "tokens": list(model.tokens[s : s + TOKEN_CHUNK])})
        for s in range(0, model.length, TOKEN_CHUNK)
    )
    grid = len(model.layers) * (2 + 20 * model.max_heads)  # one [layers][heads] grid of numbers
    argmax = model.steps * len(model.layers) * (2 + (len(str(model.length)) + 1) * model.max_heads)
    needle = (argmax + 2 * grid + 40 * model.steps + 300) if model.steps else 0
    return tokens + len(model.metrics) * (grid + 80) + 200 * len(model.layers) + 300 + needle


def page_bytes(models: Sequence[PageModel], heads: Sequence[Sequence[Head]], levels: int) -> int:
    """The estimated size of a page embedding ``heads[m]`` of each model at the ``levels`` coarsest
    zoom levels (:func:`head_bytes`, :func:`model_bytes`, the page's script and style, and the note)."""
    shell = len(_page({})) + 1000
    return shell + sum(
        model_bytes(model) + sum(head_bytes(model, h, levels) for h in model_heads)
        for model, model_heads in zip(models, heads, strict=True)
    )


def precheck_export(
    pairs: Sequence[tuple[HookedModel, ExploreInput]],
    settings: ExportSettings,
    out: str | Path,
    layers: Sequence[int] | None = None,
    results: bool = False,
) -> None:
    """Before any forward pass: refuse named heads or a ranking metric the models cannot have, and a
    page that will be over ``export_max_mib`` whatever ``top:K`` picks (the K smallest heads of each
    model; with named heads or ``all`` the estimate itself). ``pairs``: each model with its input;
    ``layers``: those to capture (``None``: all); ``results``: an ``analyze`` folder is given."""
    settings.validate()
    models = [PageModel.before_capture(model, inp, layers, results) for model, inp in pairs]
    kind, count = settings.choice()
    if kind == "heads":
        check_named_heads(models, count)
        heads = [[h for h in count if h in set(m.heads())] for m in models]
    elif kind == "all":
        heads = [m.heads() for m in models]
    else:
        for model in models:
            settings.rank_metrics(model.metrics, model.kind)
        heads = [
            sorted(m.heads(), key=lambda h, m=m: head_bytes(m, h, settings.export_levels))[:count] for m in models
        ]  # fmt: skip
    check_page_size(models, heads, settings, out, at_least=kind == "top")


def check_page_size(
    models: Sequence[PageModel],
    heads: Sequence[Sequence[Head]],
    settings: ExportSettings,
    out: str | Path,
    at_least: bool,
) -> None:
    """Raise :class:`PageTooLarge`, naming the estimate and how to make the page smaller, when a page
    embedding ``heads[m]`` of each model is over ``export_max_mib`` (``at_least``: the estimate is a
    lower bound)."""
    size = page_bytes(models, heads, settings.export_levels)
    if size <= settings.max_bytes:
        return
    count = sum(len(h) for h in heads)
    per_head = max(
        1, sum(head_bytes(m, h, settings.export_levels) for m, hs in zip(models, heads, strict=True) for h in hs)
    )
    per_head /= max(1, count)
    rest = size - per_head * count
    fit = max(0, int((settings.max_bytes - rest) // per_head))
    what = ", ".join(f"{m.name} at {m.length:,} tokens" for m in models)
    raise PageTooLarge(
        f"`export` {out} would be {'at least ' if at_least else 'about '}{size / MIB:.1f} MiB, over the limit "
        f"of {settings.export_max_mib:g} MiB (`export_max_mib`): {count} heads x {settings.export_levels} zoom "
        f"levels of {what}, about {per_head / MIB:.2f} MiB a head. Embed fewer heads (`export_heads` "
        f"top:{max(1, fit)}: {fit} fit, or LAYER.HEAD,...), fewer zoom levels (`export_levels`), a shorter "
        "`length`, or raise `export_max_mib`"
    )


def _entry_bytes(route: str, params: dict[str, Any], answer: Any) -> int:
    """Bytes one answer takes in the page's data: ``"key":answer,``."""
    return len(json.dumps(api_key(route, params))) + len(_json(answer)) + 2


def _base64_len(n: int) -> int:
    return 4 * -(-n // 3)


def _json(data: Any) -> str:
    return json.dumps(data, separators=(",", ":")).replace("</", "<\\/")


# -- compact tiles -----------------------------------------------------------------------------------
def tile_shape(spec: TileSpec, length: int) -> tuple[int, int]:
    """Pixel rows and columns of a tile of a ``length``-token map (fewer than :data:`TILE` at its end)."""
    (q0, q1), (k0, k1) = spec.queries(length), spec.keys(length)
    return -(-(q1 - q0) // spec.block), -(-(k1 - k0) // spec.block)


def visible_columns(spec: TileSpec, length: int, window: int | None) -> tuple[np.ndarray, np.ndarray]:
    """For each pixel row ``i`` of a tile, the pixel columns ``lo[i] <= j < hi[i]`` some query of the
    row's block sees (``int64 [rows]`` each; ``lo == hi``: none). Outside them a pixel is exactly 0: its
    keys are after every query of the block, or before the sliding window of its first query. The page
    applies the same rule (explore.js ``visibleColumns``)."""
    (q0, _), (k0, _) = spec.queries(length), spec.keys(length)
    b, (rows, cols) = spec.block, tile_shape(spec, length)
    qa = q0 + b * np.arange(rows, dtype=np.int64)  # each pixel row's first query; its last is qa + b - 1
    hi = np.clip((qa + b - 1 - k0) // b + 1, 0, cols)  # first key of the column <= last query
    lo = np.zeros(rows, dtype=np.int64)
    if window is not None:  # last key of the column >= the first query's first visible key
        lo = np.clip(-((k0 + b - 1 - (qa - window + 1)) // b), 0, cols)
    return lo, np.maximum(lo, hi)


def encode_tile(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> bytes:
    """A tile's pixels ``values [rows, cols]`` (float32, >= 0) in row-major order, only columns
    ``lo[i] <= j < hi[i]`` of row ``i``, each as a uint16 little-endian code: 0 for values at most
    ``10**-DECADES`` of the tile's largest ``m``, else ``1 + round((log10(v / m) + DECADES) / DECADES *
    (CODES - 1))`` (:func:`decode_tile` inverts it)."""
    cols = np.arange(values.shape[1])
    seen = (cols >= lo[:, None]) & (cols < hi[:, None])
    v = values[seen].astype(np.float64)
    peak = float(values.max()) if values.size else 0.0
    codes = np.zeros(v.shape, dtype="<u2")
    keep = v > peak * 10.0**-DECADES
    if keep.any():
        scaled = (np.log10(v[keep] / peak) + DECADES) / DECADES * (CODES - 1)
        codes[keep] = np.clip(np.rint(scaled), 0, CODES - 1).astype(np.int64) + 1
    return codes.tobytes()


def decode_tile(data: bytes, peak: float, lo: np.ndarray, hi: np.ndarray, cols: int) -> np.ndarray:
    """The pixels ``[rows, cols]`` (float64) of :func:`encode_tile`'s ``data`` for a tile whose largest
    value is ``peak``, zeros outside the coded columns. explore.js ``tileValues`` is the same code."""
    codes = np.frombuffer(data, dtype="<u2").astype(np.float64)
    values = np.where(codes > 0, peak * 10.0 ** ((codes - 1) / (CODES - 1) * DECADES - DECADES), 0.0)
    out = np.zeros((lo.size, cols))
    j = np.arange(cols)
    out[(j >= lo[:, None]) & (j < hi[:, None])] = values
    return out


def _tile_meta(spec: TileSpec, length: int, peak: float, data: str) -> dict[str, Any]:
    """A tile answer as app.py's ``_tile`` makes it (``data`` as given)."""
    (q0, k0), (rows, cols) = (spec.queries(length)[0], spec.keys(length)[0]), tile_shape(spec, length)
    return dict(
        level=spec.level, row=spec.row, col=spec.col, block=spec.block, q0=q0, k0=k0, rows=rows, cols=cols,
        max=peak, data=data,
    )  # fmt: skip


def compact_tile(answer: dict[str, Any], length: int, window: int | None) -> dict[str, Any]:
    """The server's tile ``answer`` (float32 base64 ``data``) with its ``data`` coded by :func:`encode_tile`."""
    spec = TileSpec(answer["level"], answer["row"], answer["col"])
    values = np.frombuffer(base64.b64decode(answer["data"]), dtype="<f4").reshape(answer["rows"], answer["cols"])
    lo, hi = visible_columns(spec, length, window)
    return answer | {"data": base64.b64encode(encode_tile(values, lo, hi)).decode()}


# -- the page ----------------------------------------------------------------------------------------
def api_key(route: str, params: dict[str, Any]) -> str:
    """The key the page looks an answer up by (explore.js ``apiKey``): sorted, URI-encoded parameters."""
    query = "&".join(f"{k}={quote(str(params[k]), safe=URI_SAFE)}" for k in sorted(params))
    return route + ("?" + query if query else "")


def export_requests(views: Sequence[ModelView], plan: ExportPlan) -> list[tuple[str, dict[str, Any]]]:
    """Every request the exported page can answer: everything but maps and rows for every model, those
    for the heads of ``plan``."""
    todo: list[tuple[str, dict[str, Any]]] = [("info", {})]
    for m, (view, model, heads) in enumerate(zip(views, plan.models, plan.heads, strict=True)):
        length = view.input.length
        todo += [("overview", {"model": m, "metric": metric}) for metric in view.metrics]
        todo += [
            ("tokens", {"model": m, "start": s, "end": min(length, s + TOKEN_CHUNK)})
            for s in range(0, length, TOKEN_CHUNK)
        ]
        if view.evidence is not None:
            todo.append(("needle", {"model": m}))
        for h in heads:
            window = view.layers[h.layer].window  # the page's (explore.js tileEmpty)
            for level in model.levels(plan.settings.export_levels):
                n = tiles_across(length, level)
                todo += [
                    ("tile", {"model": m, "layer": h.layer, "head": h.head, "level": level, "row": r, "col": c})
                    for r in range(n)
                    for c in range(r + 1)
                    if not TileSpec(level, r, c).empty(length, window)
                ]
            todo += [
                ("row", {"model": m, "layer": h.layer, "head": h.head, "pos": p, "k": TOP_KEYS}) for p in model.rows
            ]
    return todo


def export_page(
    views: Sequence[ModelView],
    out: str | Path,
    plan: ExportPlan | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Write the self-contained page of ``plan`` (default: :func:`plan_export` with the default settings)
    to ``out``, atomically, after checking its size (:class:`PageTooLarge`: nothing written);
    ``progress(done, total)`` after each answer."""
    plan = plan or plan_export(views)
    plan.check(out)
    todo = export_requests(views, plan)
    answers = {}
    for n, (route, params) in enumerate(todo):
        answer = api_answer(views, route, {k: str(v) for k, v in params.items()})
        if route == "tile":
            view = views[params["model"]]
            answer = compact_tile(answer, view.input.length, view.layers[params["layer"]].window)
        answers[api_key(route, params)] = answer
        if progress:
            progress(n + 1, len(todo))
    data = {
        "answers": answers,
        "colormap": json.loads(asset("colormap.json")),
        "tiles": {"encoding": "log-uint16", "decades": DECADES, "codes": CODES},
        "export": {
            "heads": [[[h.layer, h.head] for h in heads] for heads in plan.heads],
            "levels": [model.levels(plan.settings.export_levels) for model in plan.models],
            "note": plan.note(),
        },
    }
    out = Path(out)
    atomic_write_text(out, _page(data))
    return out


def page_data(page: str) -> dict[str, Any]:
    """The data a page written by :func:`export_page` embeds (its text ``page``): ``answers`` (API key ->
    answer), ``colormap``, ``tiles`` (how tile values are coded) and ``export`` (the heads and levels it
    holds, per model, and its note)."""
    payload = page.split("window.HEADPROBE_STATIC = ", 1)[1].split(";</script>", 1)[0]
    return json.loads(payload.replace("<\\/", "</"))


def _page(data: dict[str, Any]) -> str:
    """The page with ``data`` as ``window.HEADPROBE_STATIC`` and its script and style inlined."""
    page = asset("index.html").decode()
    page = page.replace('<link rel="stylesheet" href="static/explore.css">', "")
    page = page.replace('<script src="static/explore.js"></script>', "")
    page = page.replace("<!--HEADPROBE_INLINE_CSS-->", f"<style>\n{asset('explore.css').decode()}</style>")
    page = page.replace("<!--HEADPROBE_INLINE_DATA-->", f"<script>window.HEADPROBE_STATIC = {_json(data)};</script>")
    js = asset("explore.js").decode().replace("</", "<\\/")
    return page.replace("<!--HEADPROBE_INLINE_JS-->", f"<script>\n{js}</script>")
