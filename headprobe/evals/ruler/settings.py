"""What decides a RULER-style evaluation's numbers: :class:`RulerSettings`, checked before any work (and
importable without torch: the command line builds ``headprobe ruler eval``'s options from it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from headprobe.core.choice import Choice
from headprobe.core.errors import HeadprobeError
from headprobe.core.paths import content_keys
from headprobe.core.resume import repeated_lengths, resume_key
from headprobe.core.settings import DTYPE_HELP, MAX_TOKENS, PROMPT_FORMAT_HELP, check_ranges, setting
from headprobe.evals.ruler.tasks import TASKS_HELP, Task, resolve_tasks
from headprobe.text.files import TextFileError, read_text_file
from headprobe.text.prompt_format import PromptFormatError, parse_prompt_format

LENGTHS_HELP = "comma list of target lengths in tokens, k = 1,024 (4096,16k,128K)"
FIT_HELP = "ruler (RULER's size search: samples below the target) | tight (each sample fills its budget)"
CWE_HELP = "ruler (RULER's word counts by length) | fit (the small counts wherever the standard ones do not fit)"


class RulerError(HeadprobeError, ValueError):
    """A task cannot be generated as asked (unknown task, length too short, missing file)."""


class Fit(Choice, what="fit"):
    """How a sample's size is chosen (:mod:`headprobe.evals.ruler.fitting`)."""

    RULER = "ruler"  # one size per task and length from a trial sample, shrunk by whole steps
    TIGHT = "tight"  # each sample's largest size that fits


class CweRule(Choice, what="cwe rule"):
    """Which word counts cwe uses at a length."""

    RULER = "ruler"  # RULER's: below 4,096 tokens x6/x1 (example 20 words x3/x1), else the task's (x30/x3)
    FIT = "fit"  # ours: the task's counts when they fit the budget, else the small ones (byte tokenizers)


@dataclass
class RulerSettings:
    """What decides a RULER-style evaluation's numbers.

    Attributes:
        tasks: task and group names (``["all"]``, the default: all 13; with ``data``, all the tasks it holds).
        lengths: target lengths in tokens; ``None``: the lengths ``data`` holds, else [4096].
        samples: samples per task and length.
        seed: generation seed.
        haystack_files: text files replacing the generated prose of the essay haystack.
        qa_files: SQuAD v2 and/or HotpotQA dev files (else the built-in generated set).
        data: read samples from this JSON-lines file instead of generating them.
        prompt_format: how prompts are put to the model: ``auto`` (its chat template where it has one, else
            plain), ``chat``, ``plain`` (RULER's ``base``), or a custom wrapper (a string or file holding
            ``{task_template}``): :mod:`headprobe.text.prompt_format`. Samples read from ``data`` keep the
            wrapper they were generated with.
        fit: ``ruler`` (RULER's size search, samples below the target) or ``tight`` (each sample fills its
            budget), :class:`Fit`.
        cwe_rule: ``ruler`` or ``fit``, :class:`CweRule`.
        dtype: the model's dtype (:data:`headprobe.hooked.DTYPES`); ``None`` = as saved.
        allow_beyond_trained: evaluate lengths beyond what a model was trained on (else refused before it
            loads); recorded with the results, not part of the resume key.
    """

    tasks: list[str] = setting(
        factory=lambda: ["all"], help=TASKS_HELP + " (with `data`: all = the tasks it holds)", form="names"
    )
    lengths: list[int] | None = setting(
        None,
        help=f"{LENGTHS_HELP}; a task too long for a length is skipped there (default: 4096; with `data`, the "
        "lengths it holds)",
        form="lengths",
        minimum=1,
        maximum=MAX_TOKENS,
    )
    samples: int = setting(25, help="samples per task and length", minimum=1)
    seed: int = setting(42, help="generation seed")
    haystack_files: list[str] | None = setting(
        None, help="text files for the essay haystack", flag="--haystack-file", form="paths"
    )
    qa_files: list[str] | None = setting(
        None, help="SQuAD v2 and/or HotpotQA dev JSON files", flag="--qa-file", form="paths"
    )
    data: str | None = setting(None, help="read samples from this JSONL instead of generating")
    prompt_format: str = setting("auto", help=PROMPT_FORMAT_HELP)
    fit: str = setting("ruler", help=FIT_HELP)
    cwe_rule: str = setting("ruler", help=CWE_HELP)
    dtype: str | None = setting(None, help=DTYPE_HELP)
    allow_beyond_trained: bool = setting(
        False, help="evaluate lengths beyond what a model was trained on (refused otherwise)"
    )

    def validate(self) -> list[Task]:
        """The chosen tasks; raises naming the first bad setting."""
        from headprobe.hooked import parse_dtype

        check_ranges(self, RulerError)
        parse_dtype(self.dtype)
        if self.lengths is not None and not self.lengths:
            raise RulerError("no `lengths`: give positive token counts, or leave it out")
        if self.lengths is not None and (repeated := repeated_lengths(self.lengths)):
            raise RulerError(repeated)
        try:
            parse_prompt_format(self.prompt_format)
        except PromptFormatError as err:
            raise RulerError(str(err)) from None
        for f in self.haystack_files or []:  # before any model loads
            try:
                read_text_file(f, "`haystack_files`")
            except TextFileError as err:
                raise RulerError(str(err)) from None
        Fit(self.fit)  # an unknown one: a ChoiceError naming the choices
        CweRule(self.cwe_rule)
        return resolve_tasks(self.tasks)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with the content of each input file given (:meth:`files`)."""
        return asdict(self) | self.files()

    def files(self) -> dict[str, dict[str, str]]:
        """The input files given, by content (:func:`headprobe.core.paths.content_keys`): ``data_sha256``,
        ``haystack_files_sha256``, ``qa_files_sha256``; empty without files."""
        return content_keys(data=self.data, haystack_files=self.haystack_files, qa_files=self.qa_files)

    def key(self, checkpoint: str | Path, prompt_start: list[int], wrapper: str) -> dict[str, Any]:
        """The resume key of a model's predictions: everything that decides a prompt and its answer
        except the task, length and index (which each prediction line holds), and what the tables are
        made of (the tasks, lengths and samples: a rerun with other ones is refused rather than rewriting
        the tables with fewer rows, or mixing scores over other tasks); ``wrapper`` is the wrapper the
        prompt format resolved to for this model (its template text)."""
        return resume_key(
            tasks=self.tasks,
            lengths=self.lengths,
            samples=self.samples,
            checkpoint=str(Path(checkpoint).resolve()),
            seed=self.seed,
            wrapper=wrapper,
            fit=self.fit,
            cwe_rule=self.cwe_rule,
            dtype=self.dtype,
            data=self.data,
            haystack_files=self.haystack_files,
            qa_files=self.qa_files,
            prompt_start=prompt_start,
            **self.files(),  # each file by its content too: one edited or made anew is other samples
        )
