"""The metrics as typed objects: name, the settings its numbers depend on, its tables, how to compute.

Two kinds:

* :class:`PassMetric`: computed from forward passes over haystack text. Every pass metric of a run
  shares one pass per input (:func:`headprobe.metrics.passes.run_pass`): each contributes a collector.
* :class:`DecodeMetric`: computed from needle prompts one at a time: greedily decoded (the retrieval score)
  or with their answer teacher-forced (the needle margin).

The analysis job (:mod:`headprobe.analysis`) walks :data:`METRICS`; adding a metric is adding an entry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from headprobe.core.errors import SettingError
from headprobe.hooked.base import HookedModel
from headprobe.metrics.attention import ENTROPY, REORDERING, EntropyCollector, ReorderingCollector
from headprobe.metrics.definitions import (
    Scored,
    definition_headline,
    definition_rows,
    forced_copy,
    head_schema,
    head_table,
    sample_frame,
    samples_schema,
)
from headprobe.metrics.erank import ERANK, ErankCollector
from headprobe.metrics.headkv import needle_mass
from headprobe.metrics.locos import logit_contrib
from headprobe.metrics.margin import NEEDLE_MARGIN, margin_headline, margin_probe, margin_sample, margin_summary
from headprobe.metrics.passes import Collector
from headprobe.metrics.probe import Probe, score_sample
from headprobe.metrics.qrhead import query_focus
from headprobe.metrics.razor import razor
from headprobe.metrics.retrieval import (
    RETRIEVAL,
    RETRIEVAL_COPIES,
    RETRIEVAL_SAMPLES,
    combine_samples,
    sample_probe,
    sample_tables,
)
from headprobe.metrics.summaries import (
    SummaryRow,
    erank_headline,
    erank_rows,
    mean_headline,
    mean_rows,
    retrieval_headline,
    retrieval_rows,
)
from headprobe.model.config import LayerInfo
from headprobe.results import Column, Schema
from headprobe.text.needles import NeedlePrompt


@dataclass(frozen=True)
class PassMetric:
    """A metric of forward passes over text.

    Attributes:
        name: the metric's name (``--metrics``).
        tables: the tables it writes (one).
        settings: the analysis settings its numbers depend on, besides length, samples, seed,
            haystack and dtype (which every metric depends on); part of each item's resume key.
        pooled: one table per length pooled over the samples (else one per sample, with a ``sample`` column).
        collector: ``(layers, topk) -> Collector`` for one sample (or one length when pooled).
        summary: the summary rows of its (first) table (:mod:`headprobe.metrics.summaries`).
        headline: one line from its summary rows at one length.
        min_topk: the smallest ``topk`` setting it accepts.
        description: one line for help texts.
        revision: the definition's revision, part of the resume key: raised when the numbers a
            metric gives change, so results made before are computed again, not reused.
    """

    name: str
    tables: tuple[Schema, ...]
    settings: tuple[str, ...]
    pooled: bool
    collector: Callable[[list[LayerInfo], int], Collector]
    summary: Callable[[pd.DataFrame], Iterable[SummaryRow]]
    headline: Callable[[pd.DataFrame], str]
    min_topk: int = 0
    description: str = ""
    revision: int = 1


@dataclass(frozen=True)
class DecodeOptions:
    """How a decode metric decodes one prompt (the analysis' settings, chosen by name there).

    Attributes:
        max_new_tokens: the decoding budget per prompt.
        span: which answer span a copy must land in (:class:`headprobe.metrics.retrieval.Span`).
        needle_reach: prompt tokens after the span that the teacher-forced mass counts too.
        seed: the analysis' seed (the random sequences of ``echo`` and ``induction``).
    """

    max_new_tokens: int = 50
    span: str = "exact"
    needle_reach: int = 0
    seed: int = 0


@dataclass(frozen=True)
class DecodeMetric:
    """A metric of greedy decoding of needle prompts, one prompt (sample) at a time.

    Attributes:
        name, summary, headline, description, revision: as for :class:`PassMetric`.
        tables: every table it writes; the first is the one summarised.
        per_sample: those of ``tables`` made one sample at a time (the rest come from ``combine``).
        settings: the analysis settings its numbers depend on (part of each item's resume key): those that
            make the prompts (``needles``, ``prompt_format``) and those that decode them.
        decode: ``(model, prompt, sample, options) -> {table: frame}``: the ``per_sample`` tables of one
            needle prompt decoded as sample number ``sample``, as :class:`DecodeOptions` say.
        combine: ``{table: frame}`` of every sample at one length (in sample order) ``-> {table: frame}``:
            the other tables at that length (e.g. the head scores, a mean over the kept samples).
        generates: whether it decodes greedily (its prompts need ``max_new_tokens`` of room in the model's
            positions) or only teacher-forces the answer (room for the answer alone).
        probe: for a retrieval-head definition, ``(model, prompt, sample, options) -> Probe``: its work on one sample
            as forward passes (:class:`headprobe.metrics.definitions.Probe`), so that the definitions of one
            sample share their passes (:func:`~headprobe.metrics.definitions.run_probes`); ``decode`` runs it alone.
        frames: with ``probe``, ``(model, result, sample) -> {table: frame}``: its per-sample tables from the probe's
            result.
    """

    name: str
    tables: tuple[Schema, ...]
    per_sample: tuple[Schema, ...]
    settings: tuple[str, ...]
    decode: Callable[[HookedModel, NeedlePrompt, int, DecodeOptions], dict[str, pd.DataFrame]]
    combine: Callable[[dict[str, pd.DataFrame]], dict[str, pd.DataFrame]]
    summary: Callable[[pd.DataFrame], Iterable[SummaryRow]]
    headline: Callable[[pd.DataFrame], str]
    description: str = ""
    revision: int = 1
    generates: bool = True
    probe: Callable[[HookedModel, NeedlePrompt, int, DecodeOptions], Probe] | None = None
    frames: Callable[[HookedModel, Any, int], dict[str, pd.DataFrame]] | None = None


Metric = PassMetric | DecodeMetric

ProbeOf = Callable[[HookedModel, NeedlePrompt, int, DecodeOptions], Probe]  # (model, prompt, sample, options)
NEEDLE_SETTINGS = ("needles", "retrieval_span", "prompt_format", "needle_reach")  # what makes and reads a needle


def definition(
    name: str, value: str, settings: tuple[str, ...], probe: ProbeOf, description: str, extra: tuple[Column, ...] = ()
) -> DecodeMetric:
    """A retrieval-head definition (:mod:`headprobe.metrics.definitions`) as a metric: ``probe`` gives one sample's
    work, whose scores are every head's numbers (``value``, described by ``value``, and the ``extra`` columns); its
    tables are ``<name>_samples`` and ``<name>``."""
    columns = ["value", *(c.name for c in extra)]
    samples, heads = samples_schema(name, value, extra), head_schema(name, value, extra)

    def frames(model: HookedModel, scored: Scored, sample: int) -> dict[str, pd.DataFrame]:
        return {samples.table: sample_frame(model.layers, scored, columns, sample)}

    return DecodeMetric(
        name,
        (heads, samples),
        (samples,),
        settings,
        lambda model, prompt, sample, options: frames(
            model, score_sample(model, probe(model, prompt, sample, options)), sample
        ),
        lambda frames: {heads.table: head_table(frames[samples.table], columns)},
        definition_rows,
        definition_headline,
        description,
        generates=False,
        probe=probe,
        frames=frames,
    )


DEFINITIONS: tuple[DecodeMetric, ...] = (
    definition(
        "retrieval_forced",
        "Wu's copy score at the teacher-forced answer steps (copies / answer-span length)",
        NEEDLE_SETTINGS,
        lambda model, prompt, sample, options: forced_copy(model, prompt, options),
        "Wu et al.'s rule at the teacher-forced answer steps: every model has a number",
        (Column("set_value", "float", "its set form: span tokens copied at least once / span length (0-1)"),),
    ),
    definition(
        "needle_mass",
        "HeadKV's score: top-|N| attention mass on the needle N summed over the forced answer steps, over |N|",
        NEEDLE_SETTINGS,
        lambda model, prompt, sample, options: needle_mass(model, prompt, options),
        "HeadKV's retrieval-reasoning score: top-k attention mass on the needle at the forced answer steps",
    ),
    definition(
        "query_focus",
        "QRHead's score: the question's attention to the needle sentence minus a null question's, outliers cut",
        ("needles", "prompt_format", "needle_reach"),
        lambda model, prompt, sample, options: query_focus(model, prompt, options),
        "QRHead's query-focused score: the question's attention to the needle, calibrated by a null question",
    ),
    definition(
        "echo",
        "RazorAttention's echo score: attention to earlier copies of the row's token (0-1)",
        (),
        lambda model, prompt, sample, options: razor(model, prompt, options, sample, 0),
        "RazorAttention's echo score on four copies of a random sequence",
    ),
    definition(
        "induction",
        "RazorAttention's induction score: attention to the token after earlier copies of the row's token (0-1)",
        (),
        lambda model, prompt, sample, options: razor(model, prompt, options, sample, 1),
        "RazorAttention's induction score on four copies of a random sequence",
    ),
    definition(
        "logit_contrib",
        "LOCOS's score: the answer logit the head sends from the needle minus from the rest, scaled to the needle's "
        "size, mean over the forced answer steps (logits)",
        NEEDLE_SETTINGS,
        lambda model, prompt, sample, options: logit_contrib(model, prompt, options),
        "LOCOS's logit contribution of the needle against the rest at the forced answer steps",
    ),
)

METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        DecodeMetric(
            "retrieval",
            (RETRIEVAL, RETRIEVAL_SAMPLES, RETRIEVAL_COPIES),
            (RETRIEVAL_SAMPLES, RETRIEVAL_COPIES),
            ("max_new_tokens", "needles", "retrieval_span", "prompt_format", "needle_reach"),
            lambda model, prompt, sample, options: sample_tables(
                model, prompt, sample, options.max_new_tokens, options.span, options.needle_reach
            ),
            combine_samples,
            retrieval_rows,
            retrieval_headline,
            "Wu et al.'s retrieval score per head, from needle prompts, and its teacher-forced form and forced mass",
            revision=6,  # 2: prompts tokenised whole, ROUGE with stemming; 3: samples record the span;
            # 4: answers end at the model's declared end tokens too, samples record the prompt format and stop,
            # needles hide in the corpus's prose alone (no planted facts or questions); 5: the paper's set
            # form (set_value) beside the code's count; 6: the teacher-forced score and forced mass of every
            # sample (forced_value, forced_set_value, forced_mass), samples record their answer steps
            probe=lambda model, prompt, sample, options: sample_probe(
                model, prompt, sample, options.max_new_tokens, options.span, options.needle_reach
            ),
            frames=lambda model, tables, sample: tables,
        ),
        DecodeMetric(
            "needle_margin",
            (NEEDLE_MARGIN,),
            (NEEDLE_MARGIN,),
            ("needles", "retrieval_span", "prompt_format", "needle_reach"),
            lambda model, prompt, sample, options: {
                NEEDLE_MARGIN.table: margin_sample(model, prompt, sample, options.span, options.needle_reach)
            },
            lambda frames: {},
            margin_summary,
            margin_headline,
            "needle margin and dilution per head: the needle's best logit over the haystack's, its mass and rank, "
            "at the teacher-forced answer steps",
            generates=False,
            probe=lambda model, prompt, sample, options: margin_probe(
                model, prompt, sample, options.span, options.needle_reach
            ),
            frames=lambda model, rows, sample: {NEEDLE_MARGIN.table: rows},
        ),
        *DEFINITIONS,
        PassMetric(
            "entropy",
            (ENTROPY,),
            ("rows",),
            pooled=False,
            collector=lambda layers, topk: EntropyCollector(layers),
            summary=mean_rows,
            headline=mean_headline,
            description="attention entropy per head (nats), normalised entropy, max probability, mean distance",
        ),
        PassMetric(
            "reordering",
            (REORDERING,),
            ("rows", "topk"),
            pooled=False,
            collector=lambda layers, topk: ReorderingCollector(layers, topk),
            summary=mean_rows,
            headline=mean_headline,
            min_topk=2,
            description="token reordering per head: weighted Kendall distance of top-k attention order vs recency",
            revision=2,  # 2: pairs weighted by their probabilities, ties half
        ),
        PassMetric(
            "erank",
            (ERANK,),
            ("rows",),
            pooled=True,
            collector=lambda layers, topk: ErankCollector(layers),
            summary=erank_rows,
            headline=erank_headline,
            description="effective rank of the residual stream per layer",
            revision=2,  # 2: value is Roy & Vetterli's (uncentred), the centred one a column
        ),
    )
}


def get_metrics(names: Sequence[str]) -> list[Metric]:
    """The metrics called ``names`` (in the given order); raises naming the unknown ones and the choices."""
    unknown = [n for n in names if n not in METRICS]
    if unknown:
        raise SettingError(f"unknown metric(s) {unknown}; choose from {', '.join(METRICS)}")
    return [METRICS[n] for n in names]
