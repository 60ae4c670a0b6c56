"""The work of one model at one length: forward passes over haystack texts for the pass metrics, and
needle prompts decoded one sample at a time for the decode metrics."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from torch import Tensor

from headprobe.analysis.settings import AnalyzeSettings
from headprobe.hooked import HookedModel
from headprobe.metrics import DecodeMetric, DecodeOptions, PassMetric
from headprobe.metrics.passes import run_pass
from headprobe.metrics.probe import run_probes
from headprobe.text.haystack import text_inputs
from headprobe.text.needles import NeedlePrompt, needle_prompt, needle_set

Frames = dict[str, pd.DataFrame]  # table name -> rows


def _tag(frame: pd.DataFrame, **columns: object) -> pd.DataFrame:
    for name, value in columns.items():
        frame[name] = value
    return frame


def haystack_inputs(model: HookedModel, length: int, s: AnalyzeSettings) -> Tensor:
    """``[samples, length]`` token ids: the haystack texts every pass metric reads at ``length``."""
    return text_inputs(model.tokenizer, length, s.samples, s.seed, s.haystack_paths, start=model.prompt_start)


def text_items(
    model: HookedModel,
    length: int,
    s: AnalyzeSettings,
    inputs: Tensor,
    per_sample: Mapping[int, Sequence[PassMetric]],
    pooled: Sequence[PassMetric],
    on_sample: Callable[[int, Frames], None],
) -> Frames:
    """Forward passes over the haystack samples ``inputs [samples, length]``, in sample order.

    Sample ``i``'s pass feeds fresh collectors of the metrics ``per_sample[i]`` (their tables, with
    ``length`` and ``sample`` columns, go to ``on_sample(i, frames)`` as soon as the pass is done) and the
    collectors of the ``pooled`` metrics, which, when there are any, see every sample ``0 .. samples-1``
    in order. Returns the pooled metrics' tables (``length`` and ``samples`` columns)."""
    rows = s.row_selection.indices(length)
    pooled_collectors = {m.tables[0].table: m.collector(model.layers, s.topk) for m in pooled}
    for sample in range(s.samples):
        mine = per_sample.get(sample, ())
        if not mine and not pooled:
            continue
        fresh = {m.tables[0].table: m.collector(model.layers, s.topk) for m in mine}
        run_pass(model, inputs[sample : sample + 1], [*fresh.values(), *pooled_collectors.values()], rows)
        on_sample(sample, {t: _tag(c.frame(), length=length, sample=sample) for t, c in fresh.items()})
    return {t: _tag(c.frame(), length=length, samples=s.samples) for t, c in pooled_collectors.items()}


def needle_prompts(model: HookedModel, length: int, s: AnalyzeSettings) -> list[NeedlePrompt]:
    """``samples`` needle prompts of ``length`` tokens at evenly spaced depths, needles in turn."""
    depths = np.linspace(0, 100, s.samples).round().tolist() if s.samples > 1 else [50.0]
    needles = needle_set(s.needles)
    wrapper = model.prompt_wrapper(s.prompt_format)
    return [
        needle_prompt(
            model.tokenizer,
            needles[i % len(needles)],
            length,
            depth,
            seed=s.seed + i,
            files=s.haystack_paths,
            start=model.prompt_start,
            wrapper=wrapper,
        )
        for i, depth in enumerate(depths)
    ]


def decode_items(
    model: HookedModel,
    length: int,
    s: AnalyzeSettings,
    metrics: Sequence[DecodeMetric],
    prompt: NeedlePrompt,
    sample: int,
) -> dict[DecodeMetric, Frames]:
    """One needle prompt as sample number ``sample``: each decode metric's per-sample tables. The retrieval-head
    definitions among ``metrics`` run together, one forward pass per distinct input
    (:func:`~headprobe.metrics.definitions.run_probes`); the others decode on their own."""
    options = DecodeOptions(s.max_new_tokens, s.retrieval_span, s.needle_reach, s.seed)
    probed = [m for m in metrics if m.probe is not None and m.frames is not None]
    scored = run_probes(model, [m.probe(model, prompt, sample, options) for m in probed])  # type: ignore[misc]
    out = {m: m.frames(model, score, sample) for m, score in zip(probed, scored, strict=True)}  # type: ignore[misc]
    out |= {m: m.decode(model, prompt, sample, options) for m in metrics if m not in out}
    return {m: {table: _tag(frame, length=length) for table, frame in out[m].items()} for m in metrics}


def missing(frames: Frames) -> list[str]:
    """Why a sample has no number, from its per-sample tables' ``missing`` column (none when it has one)."""
    return sorted({why for frame in frames.values() if "missing" in frame for why in frame["missing"] if why})


def combine(metric: DecodeMetric, length: int, frames: Frames) -> Frames:
    """The metric's tables at one length from its per-sample tables of every sample (``frames``)."""
    return frames | {table: _tag(frame, length=length) for table, frame in metric.combine(frames).items()}
