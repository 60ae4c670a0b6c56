"""What the explorer looks at: one input as one model reads it (plain text, a needle prompt, a RULER sample).

Each model tokenises the input itself (two checkpoints may have different tokenizers), so an
:class:`ExploreInput` belongs to one model. Needle and RULER inputs also carry where the answer sits
(``spans``) and which rows ask for it (``question``): the needle view's evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from headprobe.core.errors import HeadprobeError
from headprobe.evals.ruler.generate import RulerGenerator
from headprobe.evals.ruler.tasks import TASKS
from headprobe.hooked.base import HookedModel
from headprobe.text.files import TextFileError, read_text_file
from headprobe.text.needles import NeedleError, needle_prompt, needle_set
from headprobe.text.prompt_format import PromptFormatError, Wrapper


class InputError(HeadprobeError, ValueError):
    """An explorer input cannot be built as asked (missing or binary file, too short, unknown task)."""


@dataclass(frozen=True)
class ExploreInput:
    """One input, tokenised by one model.

    Attributes:
        kind: ``text``, ``needle`` or ``ruler``.
        ids: token ids, the model's prompt start included.
        tokens: each token's text (its characters in the input; prompt-start tokens decoded).
        spans: half-open token ranges of the answer in the context (empty for plain text).
        question: half-open token range of the rows that ask for the answer (``None`` for plain text).
        answers: the expected answer strings (empty for plain text).
        max_new_tokens: tokens the needle view generates (0 for plain text).
        label: one line saying what the input is.
    """

    kind: str
    ids: list[int]
    tokens: list[str]
    spans: list[tuple[int, int]] = field(default_factory=list)
    question: tuple[int, int] | None = None
    answers: list[str] = field(default_factory=list)
    max_new_tokens: int = 0
    label: str = ""

    @property
    def length(self) -> int:
        return len(self.ids)

    @property
    def decodes(self) -> bool:
        """Whether the needle view decodes an answer for this input."""
        return bool(self.spans and self.max_new_tokens)


def _tokens_of(model: HookedModel, text: str) -> tuple[list[int], list[str], list[tuple[int, int]]]:
    """Ids (behind the prompt start), each token's text, and the character range of each token
    (``(-1, -1)`` for prompt-start tokens)."""
    start = list(model.prompt_start)
    ids, offsets = model.tokenizer.encode_offsets(text)
    if ids[: len(start)] == start and start:  # a tokenizer that writes its own start
        ids, offsets = ids[len(start) :], offsets[len(start) :]
    texts = [model.tokenizer.decode([i]) for i in start] + [text[a:b] for a, b in offsets]
    return start + list(ids), texts, [(-1, -1)] * len(start) + list(offsets)


def _rows_from(offsets: list[tuple[int, int]], char: int) -> tuple[int, int]:
    """The token range from the first token that ends after character ``char`` to the end."""
    first = next((i for i, (_, b) in enumerate(offsets) if b > char), len(offsets) - 1)
    return first, len(offsets)


def text_input(model: HookedModel, path: str | Path, length: int | None = None) -> ExploreInput:
    """The text of ``path`` (UTF-8), cut to ``length`` tokens when given."""
    path = Path(path)
    try:
        text = read_text_file(path, "--text")
    except TextFileError as err:
        raise InputError(str(err)) from None
    ids, tokens, _ = _tokens_of(model, text)
    if not ids:
        raise InputError(f"--text {path}: the file holds no text")
    if length is not None:
        if length > len(ids):
            raise InputError(f"--length {length:,}: {path} holds only {len(ids):,} tokens for {model.name}")
        ids, tokens = ids[:length], tokens[:length]
    return ExploreInput("text", ids, tokens, label=f"{path.name}: {len(ids):,} tokens")


def _wrapper(model: HookedModel, prompt_format: str) -> Wrapper:
    try:
        return model.prompt_wrapper(prompt_format)
    except PromptFormatError as err:
        raise InputError(f"--prompt-format {prompt_format}: {err}") from None


def needle_input(
    model: HookedModel, length: int, depth: float, seed: int = 0, needles: str = "builtin", prompt_format: str = "auto"
) -> ExploreInput:
    """A needle-in-a-haystack prompt of ``length`` tokens with the needle at ``depth`` percent, in the model's
    ``prompt_format`` (:func:`headprobe.text.needles.needle_prompt`); the question rows are the question,
    the end of the user turn and the answer cue."""
    if not 0 <= depth <= 100:
        raise InputError(f"--depth {depth}: give a percentage between 0 and 100")
    options = needle_set(needles)
    needle = options[seed % len(options)]
    wrapper = _wrapper(model, prompt_format)
    try:
        prompt = needle_prompt(
            model.tokenizer, needle, length, depth, seed=seed, start=model.prompt_start, wrapper=wrapper
        )
    except NeedleError as err:  # too short for the needle and its question; a bug keeps its traceback
        raise InputError(f"--length {length}: {err}") from None
    _, tokens, offsets = _tokens_of(model, prompt.text)
    question = _rows_from(offsets, prompt.text.rfind(needle.prompt.format(question=needle.question)))
    answer_tokens = len(model.tokenizer.encode(" " + needle.sentence))  # an instruct model restates the fact
    return ExploreInput(
        "needle",
        list(prompt.ids),
        tokens,
        spans=[(prompt.answer_start, prompt.answer_end)],
        question=question,
        answers=[needle.answer],
        max_new_tokens=answer_tokens + 8,
        label=f"needle {needle.answer!r} at {depth:g}% of {prompt.length:,} tokens ({wrapper.format} prompt)",
    )


def ruler_input(model: HookedModel, task: str, length: int, seed: int = 0, prompt_format: str = "auto") -> ExploreInput:
    """Sample 0 of the RULER-style ``task`` at ``length`` tokens in the model's ``prompt_format``
    (:mod:`headprobe.evals.ruler`, as ``ruler eval`` makes it); the answer spans are every occurrence of
    each expected output in the context, the question rows the prompt's last line and the answer prefix."""
    wrapper = _wrapper(model, prompt_format)
    gen = RulerGenerator(model.tokenizer, seed=seed, reserve=len(model.prompt_start), wrapper=wrapper)
    try:
        sample = gen.sample(task, length, 0)
    except (KeyError, ValueError) as err:
        raise InputError(f"--ruler {task} --length {length}: {err}") from None
    text = sample["input"] + sample["answer_prefix"]
    ids, tokens, offsets = _tokens_of(model, text)
    spans = []
    for answer in sample["outputs"]:
        at = sample["input"].find(answer)
        while at >= 0:
            first = next(i for i, (_, b) in enumerate(offsets) if b > at)
            last = next(i for i, (a, _) in enumerate(offsets) if a >= at + len(answer) or i == len(offsets) - 1)
            spans.append((first, max(last, first + 1)))
            at = sample["input"].find(answer, at + len(answer))
    body = sample["input"].rstrip()
    question = _rows_from(offsets, body.rfind("\n") + 1)
    return ExploreInput(
        "ruler",
        ids,
        tokens,
        spans=sorted(set(spans)),
        question=question,
        answers=list(sample["outputs"]),
        max_new_tokens=TASKS[sample["task"]].tokens_to_generate,  # ruler eval's budget for the task
        label=f"RULER-style {task}, {len(ids):,} tokens (seed {seed}, {wrapper.format} prompt)",
    )
