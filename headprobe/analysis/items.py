"""The work of one model at one length: the pass metrics over haystack texts, and retrieval over needles."""

from __future__ import annotations

import numpy as np
import pandas as pd

from headprobe.analysis.settings import AnalyzeSettings
from headprobe.metrics import DecodeMetric, PassMetric
from headprobe.metrics.passes import run_pass
from headprobe.probe import ProbedModel
from headprobe.text.haystack import text_inputs
from headprobe.text.needles import NeedlePrompt, needle_prompt, needle_set


def _tag(frame: pd.DataFrame, **columns: object) -> pd.DataFrame:
    for name, value in columns.items():
        frame[name] = value
    return frame


def text_items(
    model: ProbedModel, length: int, s: AnalyzeSettings, metrics: list[PassMetric]
) -> dict[str, pd.DataFrame]:
    """Every pass metric at one length, from one forward pass per sample: per-sample tables (with a
    ``sample`` column) for the unpooled metrics, one table over all samples (``samples``) for the pooled."""
    inputs = text_inputs(model.tokenizer, length, s.samples, s.seed, s.haystack_files, start=model.prompt_start)
    rows = s.row_selection.indices(length)
    pooled = {m.name: m.collector(model.layers, s.topk) for m in metrics if m.pooled}
    frames: dict[str, list[pd.DataFrame]] = {m.name: [] for m in metrics if not m.pooled}
    for sample in range(s.samples):
        fresh = {m.name: m.collector(model.layers, s.topk) for m in metrics if not m.pooled}
        run_pass(model, inputs[sample : sample + 1], [*fresh.values(), *pooled.values()], rows)
        for name, collector in fresh.items():
            frames[name].append(_tag(collector.frame(), length=length, sample=sample))
    out = {name: pd.concat(parts, ignore_index=True) for name, parts in frames.items()}
    out |= {name: _tag(c.frame(), length=length, samples=s.samples) for name, c in pooled.items()}
    return out


def needle_prompts(model: ProbedModel, length: int, s: AnalyzeSettings) -> list[NeedlePrompt]:
    """``samples`` needle prompts of ``length`` tokens at evenly spaced depths, needles in turn."""
    depths = np.linspace(0, 100, s.samples).round().tolist() if s.samples > 1 else [50.0]
    needles = needle_set(s.needles)
    return [
        needle_prompt(
            model.tokenizer,
            needles[i % len(needles)],
            length,
            depth,
            seed=s.seed + i,
            files=s.haystack_files,
            start=model.prompt_start,
        )
        for i, depth in enumerate(depths)
    ]


def decode_items(model: ProbedModel, length: int, s: AnalyzeSettings, metric: DecodeMetric) -> dict[str, pd.DataFrame]:
    """Retrieval at one length: the head table and the sample table."""
    scores = metric.compute(model, needle_prompts(model, length, s), **{k: getattr(s, k) for k in metric.settings})
    heads, samples = metric.tables
    return {heads.table: _tag(scores.heads, length=length), samples.table: scores.samples}
