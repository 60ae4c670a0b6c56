"""Needles for Wu et al.'s retrieval score, and needle-in-a-haystack prompts built around them.

Needles are our own sentences, each with a question and the answer span whose copying the retrieval
score tracks. The haystack around them comes from :mod:`headprobe.text.haystack`. Two sets
(:data:`NEEDLE_SETS`):

=========  ============================================================================================
builtin    five free-text facts asked about in Wu et al.'s phrasing (for models that follow questions)
codes      "The code for the <key> is <4 digits>." with held-out keys, asked about as the toy models
           are trained to be (:mod:`headprobe.text.tasks`): the prompt ends with the restated fact
=========  ============================================================================================
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from headprobe.core.errors import HeadprobeError
from headprobe.text.haystack import haystack_sentences
from headprobe.text.prompt_format import PLAIN, Wrapper
from headprobe.text.tasks import Split, keys, needle_question

QUESTION = "\nBased on the content of the book, Question: {question}"  # Wu et al.'s, after the haystack
ANSWER_PREFIX = "\nAnswer:"


class NeedleError(HeadprobeError, ValueError):
    """A needle set or needle file that cannot be used, or a length too short for a needle."""


@dataclass(frozen=True)
class Needle:
    """A fact to hide: ``before + answer + after`` is the inserted sentence; ``answer`` is the span
    whose copying is scored; ``question`` asks for it.

    The prompt is the haystack, then ``prompt`` (``{question}`` where the question goes), then the answer
    prefix: ``answer_prefix`` in plain text (Wu et al.'s ``\\nAnswer:``), ``chat_prefix`` at the start of the
    assistant's turn in a chat template (empty for a question the model answers in its own words:
    SmolLM2-Instruct answered 17 of 18 needle prompts so, 6-7 of 18 after ``Answer:``)."""

    before: str
    answer: str
    after: str
    question: str
    prompt: str = QUESTION
    answer_prefix: str = ANSWER_PREFIX
    chat_prefix: str = ""

    @property
    def sentence(self) -> str:
        return self.before + self.answer + self.after

    def prefix(self, wrapper: Wrapper) -> str:
        """The answer prefix this needle's prompt ends with under ``wrapper``."""
        return self.chat_prefix if wrapper.is_chat else self.answer_prefix


NEEDLES: tuple[Needle, ...] = (
    Needle(
        "The best thing to do in the harbour town of Vell is to ",
        "eat saffron mussels at the lighthouse cafe",
        ".",
        "What is the best thing to do in the harbour town of Vell?",
    ),
    Needle(
        "The secret ingredient in Grandmother Orla's plum cake is ",
        "a spoonful of black pepper",
        ".",
        "What is the secret ingredient in Grandmother Orla's plum cake?",
    ),
    Needle(
        "The observatory on Mount Kesh was paid for by ",
        "a retired tram conductor named Ilse Marrow",
        ".",
        "Who paid for the observatory on Mount Kesh?",
    ),
    Needle(
        "The password to the archive in the old mill is ",
        "amber falcon seventeen",
        ".",
        "What is the password to the archive in the old mill?",
    ),
    Needle(
        "Every winter the fishermen of Lorne paint their boats ",
        "bright turquoise with white stripes",
        ".",
        "How do the fishermen of Lorne paint their boats every winter?",
    ),
)


def _code_needles(n: int = 8) -> tuple[Needle, ...]:
    rng = random.Random("headprobe-code-needles")
    out = []
    for key in rng.sample([f"{a} {k}" for a in ("blue", "quiet", "old", "bright") for k in keys(Split.HELDOUT)], n):
        restated, question = f"The code for the {key} is", f"What is the code for the {key}?"
        prompt = " " + needle_question(key).replace(question, "{question}")
        value = str(rng.randrange(1000, 10000))
        out.append(Needle(f"{restated} ", value, ".", question, prompt, f" {restated}", restated))
    return tuple(out)


CODE_NEEDLES = _code_needles()
NEEDLE_SETS: dict[str, tuple[Needle, ...]] = {"builtin": NEEDLES, "codes": CODE_NEEDLES}


def needle_set(name: str) -> tuple[Needle, ...]:
    """A needle set by name (:data:`NEEDLE_SETS`), or the needles of a JSON-lines file (:func:`read_needles`)."""
    if name in NEEDLE_SETS:
        return NEEDLE_SETS[name]
    if name.endswith((".jsonl", ".json")) or Path(name).is_file():
        return read_needles(name)
    raise NeedleError(f"unknown `needles` {name!r}; choose one of {', '.join(NEEDLE_SETS)} or a .jsonl file of needles")


NEEDLE_FIELDS = ("before", "answer", "after", "question")


def read_needles(path: str | Path) -> tuple[Needle, ...]:
    """Needles from a JSON-lines file, one object per line with ``before``, ``answer``, ``after`` and
    ``question`` (the sentence hidden is ``before + answer + after``), and optionally ``prompt``,
    ``answer_prefix``, ``chat_prefix`` (:class:`Needle`); raises naming the file, line and field."""
    import json

    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise NeedleError(f"`needles` {path}: cannot read it as UTF-8 text ({err})") from None
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as err:
            raise NeedleError(f"`needles` {path}:{number} is not JSON ({err.msg})") from None
        missing = [f for f in NEEDLE_FIELDS if not isinstance(raw, dict) or not isinstance(raw.get(f), str)]
        if missing or not raw["answer"].strip():
            what = ", ".join(missing) or "a non-empty answer"
            raise NeedleError(f"`needles` {path}:{number} lacks {what}; each line needs {', '.join(NEEDLE_FIELDS)}")
        extra = {k: raw[k] for k in ("prompt", "answer_prefix", "chat_prefix") if isinstance(raw.get(k), str)}
        out.append(Needle(*(raw[f] for f in NEEDLE_FIELDS), **extra))
    if not out:
        raise NeedleError(f"`needles` {path} holds no needle")
    return tuple(out)


@dataclass(frozen=True)
class NeedlePrompt:
    """A needle-in-a-haystack prompt as token ids, with where the answer sits."""

    ids: list[int]
    answer_start: int
    answer_end: int
    needle: Needle
    depth: float
    haystack: str
    text: str = ""  # what ``ids`` encode (after the model's prompt start)
    prompt_format: str = PLAIN.format  # the wrapper's format: plain, chat or custom
    sentence: tuple[int, int] = (-1, -1)  # ``[start, end)`` tokens of the whole inserted needle sentence
    query_start: int = -1  # the first token of the question part (the needle's ``prompt``), which runs to the end
    question: tuple[int, int] = (-1, -1)  # ``[start, end)`` characters of the question in ``text`` (-1: not in it)

    @property
    def length(self) -> int:
        return len(self.ids)


def needle_prompt(
    tokenizer,
    needle: Needle,
    length: int,
    depth: float,
    seed: int = 0,
    files: list[Path] | None = None,
    start: Sequence[int] = (),
    wrapper: Wrapper = PLAIN,
) -> NeedlePrompt:
    """``start`` (the model's prompt start) then one text: haystack sentences with ``needle`` inserted
    at ``depth`` percent (at a sentence boundary; the built-in corpus's prose alone, as Wu et al. hide needles in
    essays: its task documents plant facts, variables and answered questions that a model may take for the
    answer), then the question, all in ``wrapper`` (a chat template's
    user turn, :mod:`headprobe.text.prompt_format`), then the answer prefix, of ``length`` tokens in all.
    ``start`` is left out when the wrapper's text already begins with it (a template that writes its BOS).

    The text is tokenised whole, as a model reads it (tokenising pieces apart would put a lone ``' '``
    token before a space-less answer with byte-level BPE), and the answer's token span is the tokens
    whose character offsets overlap the answer. The haystack's last sentence is cut at the character
    that makes the whole ``length`` tokens; where no cut gives exactly that (a character that merges
    into its neighbour's token), the prompt is one token shorter.
    """
    start = list(start)
    bos = [] if start and tokenizer.encode(wrapper.before)[: len(start)] == start else start
    suffix = needle.prompt.format(question=needle.question)
    prefix = needle.prefix(wrapper)
    fixed = len(bos) + len(tokenizer.encode(wrapper.wrap(" " + needle.sentence + suffix, prefix)))
    if length - fixed < 1:
        raise NeedleError(f"length {length} is too short for the needle and question ({fixed + 1} tokens)")
    sentences, used = [], 0
    for sentence in haystack_sentences(seed, files, prose_only=True):  # enough sentences, counted piece by piece
        sentences.append(" " + sentence)
        used += len(tokenizer.encode(sentence))
        if used > length - fixed:
            break
    cut = round(len(sentences) * depth / 100)

    def build(chars: int) -> tuple[str, int]:
        """The text with the last haystack sentence cut to ``chars`` characters, and where the needle
        sentence starts in it."""
        hay = [*sentences[:-1], sentences[-1][:chars]]
        head = "".join(hay[:cut])
        task = head + " " + needle.sentence + "".join(hay[cut:]) + suffix
        return wrapper.wrap(task, prefix), len(wrapper.before) + len(head) + 1

    def count(chars: int) -> int:
        return len(bos) + len(tokenizer.encode(build(chars)[0]))

    while len(sentences) > 1 and count(0) > length:  # the estimate was generous by a whole sentence
        sentences.pop()
        cut = min(cut, len(sentences))
    lo, hi = 0, len(sentences[-1])  # the longest cut that fits: counts grow with the characters kept
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if count(mid) <= length else (lo, mid - 1)
    text, at = build(lo)
    ids, offsets = tokenizer.encode_offsets(text)
    span = _tokens_over(offsets, at + len(needle.before), at + len(needle.before) + len(needle.answer))
    whole = _tokens_over(offsets, at, at + len(needle.sentence))
    asked = len(text) - len(prefix) - len(wrapper.after) - len(suffix)  # where the question part begins
    query = next((j for j, (_, e) in enumerate(offsets) if e > asked), len(ids))
    source = "builtin:prose" if not files else ",".join(str(f) for f in files)
    return NeedlePrompt(
        bos + ids, len(bos) + span[0], len(bos) + span[1], needle, depth, source, text, wrapper.format,
        (len(bos) + whole[0], len(bos) + whole[1]), len(bos) + query, question_chars(needle, asked),
    )  # fmt: skip


def _tokens_over(offsets: Sequence[tuple[int, int]], a: int, b: int) -> tuple[int, int]:
    """``[first, last + 1)`` of the tokens whose characters overlap ``[a, b)``."""
    over = [j for j, (s, e) in enumerate(offsets) if s < b and e > a]
    return over[0], over[-1] + 1


def question_chars(needle: Needle, asked: int) -> tuple[int, int]:
    """``[start, end)`` characters of ``needle``'s question in a prompt whose question part (``needle.prompt``
    formatted) begins at character ``asked``; ``(-1, -1)`` when the part holds no question (a needle file's
    ``prompt`` without ``{question}``, or an empty question)."""
    head, slot, _ = needle.prompt.partition("{question}")
    if not slot or not needle.question.strip():
        return -1, -1
    start = asked + len(head.format())
    return start, start + len(needle.question)
