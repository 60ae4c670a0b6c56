"""What decides the numbers of ``headprobe analyze``: :class:`AnalyzeSettings`, checked before any work."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headprobe.core.errors import HeadprobeError
from headprobe.core.paths import CONTENT, content_keys
from headprobe.core.resume import repeated_lengths, resume_key
from headprobe.core.settings import DTYPE_HELP, MAX_TOKENS, PROMPT_FORMAT_HELP, check_ranges, setting
from headprobe.text.files import TextFileError, read_text_file
from headprobe.text.prompt_format import format_key, parse_prompt_format

if TYPE_CHECKING:
    from headprobe.metrics import Metric, Rows

# the metric registry's names (headprobe.metrics.METRICS; a test holds them equal), known without importing the
# metrics (and torch), so that the command line builds its options quickly; and those computed by default
METRIC_NAMES = (
    "retrieval",
    "needle_margin",
    "retrieval_forced",
    "needle_mass",
    "query_focus",
    "echo",
    "induction",
    "logit_contrib",
    "entropy",
    "reordering",
    "erank",
)
DEFAULT_METRICS = ("retrieval", "entropy", "reordering", "erank")

MIN_LENGTH = 16

# settings added after results existed, with the value every earlier result was made with: they enter a resume
# key only when they differ from it, so the keys of earlier results stay as they were and those results resume
LATER: dict[str, Any] = {"needle_reach": 0}


class AnalyzeError(HeadprobeError, ValueError):
    """Bad analysis settings; the message names the setting (in backticks) and the fix."""


@dataclass
class AnalyzeSettings:
    """Everything that determines the numbers of an analysis (stored with every result).

    Attributes:
        metrics: names from :data:`headprobe.metrics.METRICS`.
        lengths: context lengths in tokens.
        samples: inputs per length: haystack texts for the pass metrics, needle prompts for retrieval.
        rows: the query rows the pass metrics analyse, in the text form of ``Rows`` (``all``/``last:N``/``stride:N``;
            a ``Rows`` is taken too).
        topk: top-k keys per row for token reordering.
        seed: haystack and needle placement seed.
        max_new_tokens: retrieval's decoding budget per sample.
        haystack_files: text files to use instead of the built-in corpus (``--haystack-file``, as ``ruler``'s).
        needles: the needle set for retrieval (:data:`headprobe.text.needles.NEEDLE_SETS`).
        retrieval_span: ``exact`` (the answer's tokens) or ``reference`` (Wu et al.'s search),
            :class:`headprobe.metrics.retrieval.Span`.
        needle_reach: prompt tokens after the answer span that retrieval's teacher-forced mass counts as the
            needle too (0: the span alone): below a full-attention layer, sliding-window layers of window ``W``
            gather the needle into the ``W - 1`` positions after it, where a head can read it (the toy
            models: 7, docs/metrics.md).
        prompt_format: how needle prompts are put to the model: ``auto`` (its chat template where it has
            one), ``chat``, ``plain``, or a wrapper holding ``{task_template}`` (a string or a file)
            (:mod:`headprobe.text.prompt_format`).
        dtype: the model's dtype (:data:`headprobe.hooked.DTYPES`); ``None`` = as saved.
        allow_beyond_trained: analyse lengths beyond what a model was trained on (else refused before
            loading it); recorded with the results, not part of the resume key.
    """

    metrics: list[str] = setting(
        factory=lambda: list(DEFAULT_METRICS),
        help=f"comma list of {','.join(METRIC_NAMES)} (default: {','.join(DEFAULT_METRICS)})",
        form="names",
    )
    lengths: list[int] = setting(
        factory=lambda: [4096],
        help="comma list of context lengths in tokens (4096,16k,128K)",
        form="lengths",
        minimum=MIN_LENGTH,
        maximum=MAX_TOKENS,
    )
    samples: int = setting(4, help="inputs per length (needle prompts for retrieval)", minimum=1)
    rows: str = setting("all", help="query rows to analyse: all | last:N | stride:N")
    topk: int = setting(16, help="top-k keys per row for token reordering", minimum=1)
    seed: int = setting(0, help="haystack and needle placement seed")
    max_new_tokens: int = setting(50, help="retrieval: decoding budget per sample", minimum=1)
    haystack_files: list[str] | None = setting(
        None, help="text files to use as haystack", flag="--haystack-file", form="paths"
    )
    needles: str = setting(
        "builtin", help="the needle set (retrieval, needle_margin): builtin | codes (the toy models') | a .jsonl file"
    )
    retrieval_span: str = setting(
        "exact", help="retrieval, needle_margin: exact (the answer's tokens) | reference (Wu et al.'s find_needle_idx)"
    )
    needle_reach: int = setting(
        0,
        help="retrieval, needle_margin: tokens after the needle's answer span counted as the needle too (window - 1)",
        minimum=0,
    )
    prompt_format: str = setting("auto", help=PROMPT_FORMAT_HELP)
    dtype: str | None = setting(None, help=DTYPE_HELP)
    allow_beyond_trained: bool = setting(
        False, help="analyse lengths beyond what a model was trained on (refused otherwise)"
    )

    def __post_init__(self) -> None:
        from headprobe.metrics import Rows

        self.rows = str(Rows.parse(self.rows))  # its text form; a Rows is taken too (a bad one: SettingError)

    @property
    def row_selection(self) -> Rows:
        from headprobe.metrics import Rows

        return Rows.parse(self.rows)

    @property
    def haystack_paths(self) -> list[Path] | None:
        return [Path(f) for f in self.haystack_files] if self.haystack_files else None

    def chosen(self) -> list[Metric]:
        from headprobe.metrics import get_metrics

        return get_metrics(self.metrics)

    def validate(self) -> None:
        """Raise a :class:`~headprobe.core.errors.HeadprobeError` naming the first bad setting: an
        :class:`AnalyzeError`, or the error of the parser that refused it (``dtype``, ``metrics``: a
        ``SettingError``; ``needles``: a ``NeedleError``; ``retrieval_span``: a ``ChoiceError``;
        ``prompt_format``: a ``PromptFormatError``); all of them ``ValueError`` s."""
        from headprobe.hooked import parse_dtype
        from headprobe.metrics.retrieval import Span
        from headprobe.text.needles import needle_set

        check_ranges(self, AnalyzeError)
        parse_dtype(self.dtype)
        metrics = self.chosen()
        if not metrics:
            raise AnalyzeError("no metric requested (`metrics`)")
        needle_set(self.needles)
        Span(self.retrieval_span)
        parse_prompt_format(self.prompt_format)
        if not self.lengths:
            raise AnalyzeError(f"no `lengths`: give token counts of at least {MIN_LENGTH}")
        if repeated := repeated_lengths(self.lengths):
            raise AnalyzeError(repeated)
        for f in self.haystack_paths or []:
            try:
                read_text_file(f, "`haystack_files`")
            except TextFileError as err:
                raise AnalyzeError(str(err)) from None
        need = max((getattr(m, "min_topk", 0) for m in metrics), default=0)
        if self.topk < need:
            raise AnalyzeError(f"token reordering needs `topk` >= {need}")
        if need and self.topk > max(self.lengths):  # a row sees at most `length` keys
            raise AnalyzeError(
                f"`topk` {self.topk:,} is more than the longest of `lengths` ({max(self.lengths):,} tokens), and a row "
                f"sees at most that many keys; give `topk` from {need} to {max(self.lengths):,} (default 16)"
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready settings, with the content of each input file given (:meth:`files`)."""
        return asdict(self) | self.files()

    def files(self) -> dict[str, dict[str, str]]:
        """The input files given, by content (:func:`headprobe.core.paths.content_keys`): ``haystack_sha256``
        and, for a needles file, ``needles_sha256``; empty without files. (``haystack``: the setting's name
        before it became ``haystack_files``, kept in keys so that earlier results resume.)"""
        from headprobe.text.needles import NEEDLE_SETS

        return content_keys(haystack=self.haystack_files, needles=None if self.needles in NEEDLE_SETS else self.needles)

    def key(self, metric: Metric, length: int, checkpoint: Path, prompt_start: list[int]) -> dict[str, Any]:
        """The resume key of one (metric, length) item: what every metric depends on, plus the metric's own
        settings (:attr:`headprobe.metrics.PassMetric.settings`)."""
        values = self.to_dict() | {"prompt_format": format_key(self.prompt_format)}  # a file: its wrapper
        read = {"haystack", *metric.settings}  # input files (their content), of those the metric reads
        return resume_key(
            metric=metric.name,
            revision=metric.revision,
            length=length,
            checkpoint=str(checkpoint.resolve()),
            prompt_start=prompt_start,
            samples=self.samples,
            seed=self.seed,
            haystack=self.haystack_files,  # the key's name from before the rename: earlier results resume
            dtype=self.dtype,
            **{name: values[name] for name in metric.settings if values[name] != LATER.get(name, ...)},
            **{name: digests for name, digests in self.files().items() if name.removesuffix(CONTENT) in read},
        )
