"""One model on one input, held for the explorer: captured queries and keys, per-head metrics, map tiles.

:class:`ModelView` runs the model once over the input and keeps every chosen layer's post-RoPE
queries ``[heads, L, qk_dim]`` and keys ``[kv_heads, L, qk_dim]`` (memory linear in ``L``; nothing
``L x L`` exists at any time). Everything the explorer shows is computed from them on demand:

* per-head metrics (:data:`HEAD_METRIC_LABELS`): means over a row selection of the exact streaming statistics
  (:func:`headprobe.stats.attention_stats`), the needle-span mass at the question rows, and the
  retrieval (copy) score of the generated answer in both forms (:func:`headprobe.metrics.retrieval.copy_scores`);
* map tiles (:mod:`headprobe.explore.pooling`), cached; the first tile of a row band computes the
  rows' log-sum-exp and pools the whole band in the same pass;
* one query row's top keys and entropy;
* the needle view's evidence: greedy decoding with each head's argmax key at every step.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from headprobe.core.errors import HeadprobeError
from headprobe.core.progress import Progress, Silent
from headprobe.explore.inputs import ExploreInput
from headprobe.explore.pooling import TILE, TileSpec, pooled_mass, tiles_across, top_level
from headprobe.hooked.base import HookedModel
from headprobe.jobs.memory import MemoryBudget, require_fits
from headprobe.jobs.provenance import tables_of
from headprobe.metrics.heads import HeadAccumulator
from headprobe.metrics.retrieval import answer_stops, copy_scores, decode_argmax
from headprobe.metrics.rows import Rows
from headprobe.model.config import LayerInfo
from headprobe.model.seam import AttentionCall
from headprobe.results import read_tables
from headprobe.stats import attention_stats

# per-head metrics: name -> (label, description); the metrics themselves: headprobe.metrics.METRICS
HEAD_METRIC_LABELS = {
    "entropy": ("entropy (nats)", "mean attention entropy over the analysed rows"),
    "norm_entropy": ("normalised entropy", "mean of entropy / log(visible keys)"),
    "max_prob": ("max probability", "mean largest attention probability"),
    "mean_distance": ("mean distance (tokens)", "mean expected distance i - j"),
    "needle_mass": ("needle span mass", "mean attention mass on the answer span at the question rows"),
    "retrieval": (
        "retrieval score (copies / span)",
        "Wu et al.'s code's copy score of the generated answer on this input: needle-token copies over the answer "
        "span's length, a repeated copy counted again (can pass 1)",
    ),
    "retrieval_set": (
        "retrieval score, set form (0-1)",
        "Wu et al.'s paper's copy score of the generated answer: needle tokens copied at least once over the span's "
        "length",
    ),
}
ROW_STATS = ("entropy", "norm_entropy", "max_prob", "mean_distance")  # per-row statistics averaged per head
AUTO_ROWS = 2048  # rows the per-head means use by default (every row of shorter inputs)
TILE_CACHE_BYTES = 256 << 20
PREFILL_CHUNK = 4096  # tokens per forward chunk while capturing


class ExploreError(HeadprobeError, ValueError):
    """A request the explorer cannot answer (unknown layer or head, a position outside the input...)."""


@dataclass
class Capture:
    """One layer's post-RoPE queries and keys for the whole input.

    Attributes:
        q: ``[heads, L, qk_dim]``.
        k: ``[kv_heads, L, qk_dim]``.
        window: keys visible per query including its own; ``None`` = full causal.
        scale: softmax scale.
    """

    q: Tensor
    k: Tensor
    window: int | None
    scale: float

    def head(self, h: int) -> tuple[Tensor, Tensor]:
        """Query head ``h``'s queries ``[L, qk_dim]`` and the keys it reads ``[L, qk_dim]``."""
        return self.q[h], self.k[h // (self.q.shape[0] // self.k.shape[0])]


def default_rows(length: int) -> Rows:
    """Every row of inputs up to :data:`AUTO_ROWS` tokens, else every n-th row (about that many)."""
    return Rows() if length <= AUTO_ROWS else Rows.parse(f"stride:{math.ceil(length / AUTO_ROWS)}")


class ModelView:
    """A model and one input, explored (see module docstring).

    Args:
        model: the model.
        inp: the input as this model tokenised it.
        name: the name the explorer shows (unique among the loaded models).
        rows: the query rows the per-head metric means use (default :func:`default_rows`).
        layers: the layers to capture (default all); others are listed but cannot be opened.
        results: an ``analyze`` results folder whose per-head tables for ``name`` are added as metrics.
        progress: progress display for the capture and metric passes.
    """

    def __init__(
        self,
        model: HookedModel,
        inp: ExploreInput,
        name: str,
        rows: Rows | None = None,
        layers: list[int] | None = None,
        results: Path | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.model, self.input, self.name = model, inp, name
        self.rows = rows or default_rows(inp.length)
        n = len(model.layers)
        self.layer_ids = sorted(set(range(n) if layers is None else layers))
        if any(not 0 <= i < n for i in self.layer_ids):
            raise ExploreError(f"--layers {layers}: {name} has layers 0..{n - 1}")
        self._lock = threading.RLock()
        self._tiles: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self._tile_bytes = 0
        self._lse: dict[tuple[int, int], tuple[Tensor, Tensor]] = {}  # (layer, head) -> (lse [L], known [L])
        progress = progress or Silent()
        # another checkpoint's results are refused before the passes
        from_results = {} if results is None else self._results_metrics(Path(results))
        self.check_memory()
        progress.start(3, f"{name}: forward pass over {inp.length:,} tokens")
        self.captures: dict[int, Capture] = {}
        state = self._capture()
        progress.advance()
        self.evidence: dict | None = None
        if state is not None:
            progress.describe(f"{name}: generating the answer")
            self.evidence = self._evidence(state)
            del state
        progress.advance()
        progress.describe(f"{name}: per-head metrics")
        self.metrics = self._head_metrics()
        if self.evidence is not None:
            self.metrics["retrieval"] = self.evidence["scores"]
            self.metrics["retrieval_set"] = self.evidence["set_scores"]
        progress.advance()
        self.metrics |= from_results

    # -- loading ---------------------------------------------------------------------------------
    @property
    def layers(self) -> list[LayerInfo]:
        return self.model.layers

    @property
    def max_heads(self) -> int:
        return max(info.n_heads for info in self.layers)

    def capture_bytes(self) -> int:
        """Bytes the captured queries and keys of the chosen layers take."""
        size = self.model.bytes_per_value
        return sum(
            self.input.length * (info.n_heads + info.n_kv_heads) * info.qk_dim * size
            for info in self.layers
            if info.index in self.layer_ids
        )

    def check_memory(self) -> None:
        """Refuse, before any work, an input whose forward pass and captures would not fit in memory."""
        length = self.input.length
        self.model.check_length(length)
        cached = length + self.input.max_new_tokens if self.input.decodes else 0
        estimate = self.model.memory(length, cached_tokens=cached)
        estimate = dataclasses.replace(estimate, statistics=estimate.statistics + self.capture_bytes())
        require_fits(
            f"exploring {self.name} at {length:,} tokens",
            estimate,
            MemoryBudget.of(self.model.device, None),
            "use a shorter --length or capture fewer --layers",
        )

    def _capture(self) -> Any:
        """Run the input through the model in chunks of :data:`PREFILL_CHUNK` tokens (activations stay
        bounded; the KV cache holds the keys), each call's queries and new keys copied into
        :attr:`captures` (:meth:`_keep`). For an input the needle view decodes, the last token is left
        out: the first decoding step fills its row (:meth:`_evidence`), so the prefill serves both.
        Returns the decoding state (``None`` when nothing is decoded)."""
        ids = torch.tensor([self.input.ids])
        state = self.model.prefill(ids[:, :-1] if self.input.decodes else ids, hook=self._keep, chunk=PREFILL_CHUNK)
        return state if self.input.decodes else None

    def _keep(self, call: AttentionCall) -> None:
        """Copy one attention call's queries and their own keys (the call's last ones) into the layer's
        buffers, made at the first call: ``[heads, L, qk_dim]`` and ``[kv_heads, L, qk_dim]``."""
        if call.layer not in self.layer_ids:
            return
        n, start = call.q.shape[2], call.query_start
        if call.layer not in self.captures:
            (_, h, _, d), hkv, length = call.q.shape, call.k.shape[1], self.input.length
            q, k = call.q.new_empty(h, length, d), call.k.new_empty(hkv, length, d)
            self.captures[call.layer] = Capture(q, k, call.window, call.scale)
        cap = self.captures[call.layer]
        cap.q[:, start : start + n] = call.q[0]
        cap.k[:, start : start + n] = call.k[0, :, -n:]

    def _head_metrics(self) -> dict[str, np.ndarray]:
        out = {m: np.full((len(self.layers), self.max_heads), np.nan) for m in ROW_STATS}
        rows = self.rows.indices(self.input.length)
        question = self.input.question
        if self.input.spans and question:
            out["needle_mass"] = np.full((len(self.layers), self.max_heads), np.nan)
        means = HeadAccumulator()  # the analysis' per-head means: rows without a value (NaN) skipped
        for layer, cap in self.captures.items():
            st = attention_stats(cap.q[None], cap.k[None], window=cap.window, scale=cap.scale, rows=rows, topk=0)
            h = cap.q.shape[0]
            for m in ROW_STATS:
                means.add(layer, m, getattr(st, m))
                out[m][layer, :h] = means.mean(layer, m)
            if "needle_mass" in out:
                q_rows = torch.arange(*question)
                st = attention_stats(
                    cap.q[None],
                    cap.k[None],
                    window=cap.window,
                    scale=cap.scale,
                    rows=q_rows,
                    spans=self.input.spans,
                    topk=0,
                )
                out["needle_mass"][layer, :h] = st.span_mass[0].double().sum(-1).mean(-1).cpu().numpy()
        return out

    def _evidence(self, state: Any) -> dict:
        """Decode the answer from the prefilled ``state``; the first step's calls also fill the captures'
        last row."""

        def last_row(step: int, token: int, call: AttentionCall) -> None:
            if step == 0:
                self._keep(call)

        tokens, argmax = decode_argmax(
            self.model,
            self.input.ids,
            self.input.max_new_tokens,
            answer_stops(self.model),
            state=state,
            hook=last_row,
        )
        scores, set_scores = copy_scores(argmax, tokens, self.input.ids, self.input.spans)
        for info in self.layers:
            scores[info.index, info.n_heads :] = set_scores[info.index, info.n_heads :] = np.nan
        return {
            "tokens": tokens,
            "texts": [self.model.tokenizer.decode([t]) for t in tokens],
            "answer": self.model.tokenizer.decode(tokens),
            "argmax": argmax,
            "scores": scores,
            "set_scores": set_scores,
        }

    def _results_metrics(self, folder: Path) -> dict[str, np.ndarray]:
        """Per-head tables of an ``analyze`` results folder for this model, as ``results:<table>``
        metrics (means over the lengths and samples there)."""
        if not folder.is_dir():
            raise ExploreError(f"--results {folder}: no such folder; give a `headprobe analyze` output folder")
        found = {t: [f for f in read_tables(folder, t) if len(f.frame)] for t in ("retrieval", "entropy", "reordering")}
        if not any(found.values()):
            raise ExploreError(
                f"--results {folder} holds no retrieval, entropy or reordering table; give a `headprobe analyze` "
                "output folder"
            )
        # this checkpoint's results, by identity (a GGUF file's results serve its converted folder and back)
        mine = {t: tables_of(fs, self.model.folder, self.name) for t, fs in found.items()}
        tables = {t: pd.concat([f.frame for f in fs], ignore_index=True) for t, (fs, _) in mine.items() if fs}
        if not tables:
            held = ", ".join(dict.fromkeys(why for _, why in mine.values() if why))
            raise ExploreError(
                f"--results {folder} holds results of {held}, not of {self.name} ({self.model.folder}); give the "
                f"folder that `headprobe analyze` of this model wrote (its --out)"
            )
        out = {}
        for table, frame in tables.items():
            chosen = frame["model"].iloc[0]
            if frame["layer"].max() >= len(self.layers) or frame["head"].max() >= self.max_heads:
                raise ExploreError(
                    f"--results {folder}: {chosen}'s {table} table has heads {self.name} lacks (layer "
                    f"{int(frame['layer'].max())}, head {int(frame['head'].max())}); give this model's analyze folder"
                )
            grid = np.full((len(self.layers), self.max_heads), np.nan)
            means = frame.groupby(["layer", "head"])["value"].mean()
            for (layer, head), value in means.items():
                if layer < grid.shape[0] and head < grid.shape[1]:
                    grid[int(layer), int(head)] = value
            out[f"results:{table}"] = grid
        return out

    # -- queries ---------------------------------------------------------------------------------
    def capture(self, layer: int, head: int) -> Capture:
        """The capture of ``layer``, checking that ``head`` exists there."""
        if not 0 <= layer < len(self.layers):
            raise ExploreError(f"layer {layer} is out of range: {self.name} has layers 0..{len(self.layers) - 1}")
        if layer not in self.captures:
            raise ExploreError(f"layer {layer} was not captured (--layers {','.join(map(str, self.layer_ids))})")
        heads = self.layers[layer].n_heads
        if not 0 <= head < heads:
            raise ExploreError(f"head {head} is out of range: layer {layer} of {self.name} has heads 0..{heads - 1}")
        return self.captures[layer]

    def tile(self, layer: int, head: int, spec: TileSpec) -> np.ndarray:
        """The pooled map tile ``spec`` of one head: ``[rows, cols]`` float32 (at most :data:`TILE` each;
        fewer at the input's end). All zeros where no query of the tile sees its keys."""
        cap = self.capture(layer, head)
        length = self.input.length
        if not 0 <= spec.level <= top_level(length):
            raise ExploreError(f"level {spec.level} is out of range: 0 (tokens) .. {top_level(length)} (whole map)")
        n = tiles_across(length, spec.level)
        if not (0 <= spec.row < n and 0 <= spec.col < n):
            raise ExploreError(
                f"tile ({spec.row}, {spec.col}) is outside the map: level {spec.level} has {n} x {n} tiles"
            )
        key = (layer, head, spec)
        with self._lock:
            if key in self._tiles:
                self._tiles.move_to_end(key)
                return self._tiles[key]
            (q0, q1), (k0, k1) = spec.queries(length), spec.keys(length)
            shape = (-(-(q1 - q0) // spec.block), -(-(k1 - k0) // spec.block))
            if spec.empty(length, cap.window):
                return np.zeros(shape, dtype=np.float32)
            q, k = cap.head(head)
            lse, known = self._lse.setdefault(
                (layer, head), (torch.zeros(length, dtype=torch.float64), torch.zeros(length, dtype=torch.bool))
            )
            if bool(known[q0:q1].all()):
                values, _ = pooled_mass(
                    q,
                    k,
                    window=cap.window,
                    scale=cap.scale,
                    rows=(q0, q1),
                    keys=(k0, k1),
                    block=spec.block,
                    lse=lse[q0:q1],
                )
                self._store(key, values)
                return self._tiles[key]
            # the row band: every tile of this row that holds visible keys, from one pass computing the lse
            first = 0 if cap.window is None else max(0, q0 - cap.window + 1) // spec.span
            band_k0 = first * spec.span
            values, row_lse = pooled_mass(
                q, k, window=cap.window, scale=cap.scale, rows=(q0, q1), keys=(band_k0, q1), block=spec.block
            )
            lse[q0:q1], known[q0:q1] = row_lse.double(), True
            for col in range(first, spec.row + 1):
                part = values[:, (col - first) * TILE : (col - first + 1) * TILE]
                self._store((layer, head, TileSpec(spec.level, spec.row, col)), part)
            return self._tiles[key]

    def _store(self, key: tuple, values: Tensor) -> None:
        arr = values.float().cpu().numpy().copy()
        self._tiles[key] = arr
        self._tile_bytes += arr.nbytes
        while self._tile_bytes > TILE_CACHE_BYTES and len(self._tiles) > 1:
            _, old = self._tiles.popitem(last=False)
            self._tile_bytes -= old.nbytes

    def row(self, layer: int, head: int, position: int, k: int = 10) -> dict:
        """Query ``position``'s top-``k`` keys of one head with their probabilities, and its entropy."""
        cap = self.capture(layer, head)
        if not 0 <= position < self.input.length:
            raise ExploreError(f"position {position} is outside the input (0..{self.input.length - 1})")
        if not 1 <= k <= 100:
            raise ExploreError(f"k={k}: ask for 1..100 top keys")
        q, kk = cap.head(head)
        st = attention_stats(
            q[None, None], kk[None, None], window=cap.window, scale=cap.scale, rows=torch.tensor([position]), topk=k
        )
        keep = st.topk_idx[0, 0, 0] >= 0
        return {
            "position": position,
            "keys": st.topk_idx[0, 0, 0][keep].tolist(),
            "probs": st.topk_prob[0, 0, 0][keep].double().tolist(),
            "entropy": float(st.entropy[0, 0, 0]),
            "norm_entropy": float(st.norm_entropy[0, 0, 0]),
            "visible": int(st.visible[0]),
        }

    def info(self) -> dict:
        """What the page needs to lay itself out."""
        inp = self.input
        return {
            "name": self.name,
            "length": inp.length,
            "kind": inp.kind,
            "label": inp.label,
            "spans": inp.spans,
            "question": inp.question,
            "answers": inp.answers,
            "top_level": top_level(inp.length),
            "layers": [
                {
                    "index": info.index,
                    "type": str(info.layer_type),
                    "heads": info.n_heads,
                    "kv_heads": info.n_kv_heads,
                    "qk_dim": info.qk_dim,
                    "v_dim": info.v_dim,
                    "window": info.window,
                    "captured": info.index in self.captures,
                }
                for info in self.layers
            ],
            "metrics": {
                m: list(HEAD_METRIC_LABELS.get(m, (m, f"{m.split(':', 1)[-1]} from the results folder")))
                for m in self.metrics
            },
            "rows": str(self.rows),
        }

    def metric(self, name: str) -> list[list[float | None]]:
        """One per-head metric as ``[layers][max_heads]`` (``None`` where missing)."""
        if name not in self.metrics:
            raise ExploreError(f"unknown metric {name!r}; this input has {', '.join(self.metrics)}")
        return [[None if not np.isfinite(v) else float(v) for v in row] for row in self.metrics[name]]

    def needle(self) -> dict:
        """The needle view: the generated answer, each step's argmax key per head, per-head copy scores
        and span masses."""
        if self.evidence is None:
            raise ExploreError("the needle view needs a needle or RULER input (--needle or --ruler)")
        ev = self.evidence
        return {
            "answer": ev["answer"],
            "expected": self.input.answers,
            "tokens": ev["tokens"],
            "texts": ev["texts"],
            "argmax": ev["argmax"].tolist(),
            "retrieval": self.metric("retrieval"),
            "needle_mass": self.metric("needle_mass") if "needle_mass" in self.metrics else None,
            "spans": self.input.spans,
            "question": self.input.question,
        }

    def tokens(self, start: int, end: int) -> list[str]:
        """The text of tokens ``start .. end - 1``."""
        if not 0 <= start <= end <= self.input.length or end - start > 65536:
            raise ExploreError(f"tokens {start}..{end}: ask for at most 65,536 tokens inside 0..{self.input.length}")
        return self.input.tokens[start:end]
