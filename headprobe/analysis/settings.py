"""What decides the numbers of ``headprobe analyze``: :class:`AnalyzeSettings`, checked before any work."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from headprobe.core.errors import HeadprobeError
from headprobe.metrics import METRICS, Metric, Rows, get_metrics
from headprobe.metrics.retrieval import Span
from headprobe.probe import parse_dtype
from headprobe.runs import repeated_lengths, resume_key
from headprobe.text.files import TextFileError, read_text_file
from headprobe.text.needles import needle_set
from headprobe.text.prompt_format import PromptFormat

MIN_LENGTH = 16


class AnalysisError(HeadprobeError, ValueError):
    """Bad analysis settings; the message names the setting (in backticks) and the fix."""


@dataclass
class AnalyzeSettings:
    """Everything that determines the numbers of an analysis (stored with every result).

    Attributes:
        metrics: names from :data:`headprobe.metrics.METRICS`.
        lengths: context lengths in tokens.
        samples: inputs per length: haystack texts for the pass metrics, needle prompts for retrieval.
        rows: the query rows the pass metrics analyse (``Rows`` or its text form ``all``/``last:N``/``stride:N``).
        topk: top-k keys per row for token reordering.
        seed: haystack and needle placement seed.
        max_new_tokens: retrieval's decoding budget per sample.
        haystack: text files to use instead of the built-in corpus.
        needles: the needle set for retrieval (:data:`headprobe.text.needles.NEEDLE_SETS`).
        retrieval_span: ``exact`` (the answer's tokens) or ``reference`` (Wu et al.'s search),
            :class:`headprobe.metrics.retrieval.Span`.
        prompt_format: how needle prompts are put to the model: ``auto`` (its chat template where it has
            one), ``chat`` or ``plain`` (:mod:`headprobe.text.prompt_format`).
        dtype: the model's dtype (:data:`headprobe.probe.DTYPES`); ``None`` = as saved.
        allow_beyond_trained: analyse lengths beyond what a model was trained on (else refused before
            loading it); recorded with the results, not part of the resume key.
    """

    metrics: list[str] = field(default_factory=lambda: list(METRICS))
    lengths: list[int] = field(default_factory=lambda: [4096])
    samples: int = 4
    rows: Rows | str = field(default_factory=Rows)
    topk: int = 16
    seed: int = 0
    max_new_tokens: int = 50
    haystack: list[str] | None = None
    needles: str = "builtin"
    retrieval_span: str = "exact"
    prompt_format: str = "auto"
    dtype: str | None = None
    allow_beyond_trained: bool = False

    def __post_init__(self) -> None:
        try:
            self.rows = Rows.parse(self.rows)
        except ValueError as err:
            raise AnalysisError(str(err)) from None

    @property
    def row_selection(self) -> Rows:
        assert isinstance(self.rows, Rows)
        return self.rows

    @property
    def haystack_files(self) -> list[Path] | None:
        return [Path(f) for f in self.haystack] if self.haystack else None

    def chosen(self) -> list[Metric]:
        return get_metrics(self.metrics)

    def validate(self) -> None:
        """Raise :class:`AnalysisError` naming the first bad setting."""
        try:
            parse_dtype(self.dtype)
            metrics = self.chosen()
        except ValueError as err:
            raise AnalysisError(str(err)) from None
        if not metrics:
            raise AnalysisError("no metric requested (`metrics`)")
        try:
            needle_set(self.needles)
            Span(self.retrieval_span)
            PromptFormat(self.prompt_format)
        except ValueError as err:
            raise AnalysisError(str(err)) from None
        if not self.lengths or min(self.lengths) < MIN_LENGTH:
            raise AnalysisError(f"`lengths` must be positive token counts of at least {MIN_LENGTH}")
        if repeated := repeated_lengths(self.lengths):
            raise AnalysisError(repeated)
        if self.samples < 1 or self.max_new_tokens < 1 or self.topk < 1:
            raise AnalysisError("`samples`, `max_new_tokens` and `topk` must be >= 1")
        for f in self.haystack_files or []:
            try:
                read_text_file(f, "`haystack`")
            except TextFileError as err:
                raise AnalysisError(str(err)) from None
        need = max((getattr(m, "min_topk", 0) for m in metrics), default=0)
        if self.topk < need:
            raise AnalysisError(f"token reordering needs `topk` >= {need}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready settings (``rows`` in its text form)."""
        return {**asdict(self), "rows": str(self.rows)}

    def key(self, metric: Metric, length: int, checkpoint: Path, prompt_start: list[int]) -> dict[str, Any]:
        """The resume key of one (metric, length) item: what every metric depends on, plus the metric's own
        settings (:attr:`headprobe.metrics.PassMetric.settings`)."""
        values = self.to_dict()
        return resume_key(
            metric=metric.name,
            revision=metric.revision,
            length=length,
            checkpoint=str(checkpoint.resolve()),
            prompt_start=prompt_start,
            samples=self.samples,
            seed=self.seed,
            haystack=self.haystack,
            dtype=self.dtype,
            **{name: values[name] for name in metric.settings},
        )
