"""Question-answering material for ``qa_1`` (single-hop) and ``qa_2`` (two-hop).

RULER uses SQuAD v2 dev and HotpotQA dev-distractor, which cannot be downloaded here. When the user
has them, :func:`load_squad` and :func:`load_hotpotqa` read the original JSON files. Otherwise a
built-in generated set is used: documents about invented towns and people, with questions answerable
from one document (``qa_1``) or by chaining two (``qa_2``). Results are labelled "RULER-style" and
every sample records its source.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from headprobe.core.errors import HeadprobeError
from headprobe.core.paths import read_utf8
from headprobe.text.wordlists import words


@dataclass(frozen=True)
class Question:
    """A question with its gold answers and the documents (indices into the pool) that hold them."""

    question: str
    answers: tuple[str, ...]
    gold: tuple[int, ...]
    related: tuple[int, ...] = ()  # preferred distractors (SQuAD: the same article's other paragraphs)


@dataclass
class QASet:
    """A pool of documents and the questions over them; ``source`` says where they came from."""

    documents: Callable[[int], str] | list[str]
    size: int
    questions: list[Question]
    source: str

    def document(self, i: int) -> str:
        if isinstance(self.documents, list):
            return self.documents[i]
        cache = self.__dict__.setdefault("_cache", {})
        if i not in cache:
            cache[i] = self.documents(i)
        return cache[i]


class QAFileError(HeadprobeError, ValueError):
    """A QA file is missing or not in the expected original format."""


def _read_json(path: Path):
    text = read_utf8(path, "QA file", QAFileError)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise QAFileError(f"{path} is not valid JSON: {err}") from None


def load_squad(path: str | Path) -> QASet:
    """SQuAD v2.0 (``dev-v2.0.json``), read as RULER's ``read_squad``: documents are the unique
    paragraph contexts (sorted); only answerable questions, in file order, with every gold answer text
    (duplicates kept); a question's related documents are the other paragraphs of its article."""
    path = Path(path)
    raw = _read_json(path)
    try:
        articles = raw["data"]
        contexts = sorted({p["context"] for a in articles for p in a["paragraphs"]})
        index = {c: i for i, c in enumerate(contexts)}
        questions = []
        for article in articles:
            own = tuple(index[p["context"]] for p in article["paragraphs"])
            for paragraph in article["paragraphs"]:
                gold = index[paragraph["context"]]
                for qa in paragraph["qas"]:
                    if qa.get("is_impossible", False):
                        continue
                    answers = tuple(a["text"] for a in qa["answers"])
                    related = tuple(i for i in own if i != gold)
                    questions.append(Question(qa["question"], answers, (gold,), related))
    except (KeyError, TypeError) as err:
        raise QAFileError(f"{path} is not in SQuAD v2 format (data/paragraphs/qas): missing {err}") from None
    if not questions:
        raise QAFileError(f"{path} holds no answerable SQuAD questions")
    return QASet(contexts, len(contexts), questions, f"squad:{path}")


def load_hotpotqa(path: str | Path) -> QASet:
    """HotpotQA dev-distractor (``hotpot_dev_distractor_v1.json``), read as RULER's ``read_hotpotqa``: a
    document is ``title + "\\n" + "".join(sentences)``, the unique ones sorted; each question keeps its
    own 10 context documents (all of them gold, in the file's order)."""
    path = Path(path)
    raw = _read_json(path)
    try:
        texts = sorted({title + "\n" + "".join(sentences) for item in raw for title, sentences in item["context"]})
        docs = {doc: i for i, doc in enumerate(texts)}
        questions = []
        for item in raw:
            own = tuple(docs[title + "\n" + "".join(sentences)] for title, sentences in item["context"])
            questions.append(Question(item["question"], (item["answer"],), own))
    except (KeyError, TypeError, ValueError) as err:
        raise QAFileError(f"{path} is not in HotpotQA format (a list of question/answer/context): {err}") from None
    if not questions:
        raise QAFileError(f"{path} holds no HotpotQA questions")
    return QASet(texts, len(texts), questions, f"hotpotqa:{path}")


# ---------------------------------------------------------------------------------------------
# The built-in generated set
# ---------------------------------------------------------------------------------------------
_SYLLABLES = ("ka", "ri", "mo", "tel", "an", "vor", "lis", "den", "ya", "bru", "sen", "ot", "mar", "fi", "gal", "hu")
_PROFESSIONS = (
    "clockmaker",
    "botanist",
    "ferry captain",
    "violin teacher",
    "glassblower",
    "cartographer",
    "beekeeper",
    "archivist",
    "stonemason",
    "astronomer",
)


def _name(rng: random.Random, parts: int) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(parts)).capitalize()


def _unique_name(seed: int, j: int, parts: int = 4) -> str:
    """A name that no other index ``< 16**parts`` gets: an odd multiplier is a bijection mod 2**(4*parts)."""
    value = (j * 0x9E3779B1 + seed * 0x2545F491) % 16**parts
    return "".join(_SYLLABLES[(value >> (4 * i)) & 15] for i in range(parts)).capitalize()


def _town(seed: int, j: int) -> dict[str, str]:
    rng = random.Random(f"headprobe-qa-town-{seed}-{j}")
    nouns, adjs = words("nouns"), words("adjectives")
    return {
        "town": _unique_name(seed, j),
        "river": _name(rng, 2),
        "mayor": f"{_name(rng, 2)} {_name(rng, 3)}",
        "year": str(rng.randrange(1100, 1900)),
        "food": f"{rng.choice(adjs)} {rng.choice(nouns)} pie",
        "festival": f"the {rng.choice(nouns).capitalize()} Festival",
    }


def _town_doc(t: dict[str, str]) -> str:
    return (
        f"{t['town']} is a small town on the river {t['river']}. It was founded in {t['year']}. "
        f"The current mayor of {t['town']} is {t['mayor']}. Every spring the town holds {t['festival']}, and "
        f"visitors come for its famous {t['food']}."
    )


def _person(seed: int, j: int) -> dict[str, str]:
    rng = random.Random(f"headprobe-qa-person-{seed}-{j}")
    return {"name": f"{_name(rng, 2)} {_unique_name(seed + 1, j)}", "job": rng.choice(_PROFESSIONS)}


def _person_doc(p: dict[str, str], town: str) -> str:
    return (
        f"{p['name']} is a {p['job']} who was born in {town}. {p['name']} spent many years travelling before "
        f"returning home to work."
    )


def builtin_qa(kind: str, n_questions: int = 1000, seed: int = 0) -> QASet:
    """Generated documents and questions: ``squad`` style (one document answers) for qa_1, ``hotpotqa``
    style (a person's document names their birthplace, the town's document holds the answer) for qa_2.

    The pool is unbounded (documents are generated on demand); question ``i`` uses town ``i``.
    """
    size = 1 << 30
    if kind == "squad":
        templates = [
            ("Who is the mayor of {town}?", "mayor"),
            ("On which river does {town} lie?", "river"),
            ("In which year was {town} founded?", "year"),
            ("What food is {town} famous for?", "food"),
            ("Which festival does {town} hold every spring?", "festival"),
        ]
        questions = []
        for i in range(n_questions):
            t = _town(seed, i)
            q, field = templates[i % len(templates)]
            questions.append(Question(q.format(town=t["town"]), (t[field],), (i,)))
        return QASet(lambda j: _town_doc(_town(seed, j)), size, questions, "builtin:generated single-hop (squad-style)")
    if kind == "hotpotqa":
        # even pool indices are people, odd ones their birth towns
        def doc(j: int) -> str:
            if j % 2 == 0:
                return _person_doc(_person(seed, j // 2), _town(seed, j // 2)["town"])
            return _town_doc(_town(seed, j // 2))

        templates = [
            ("What food is the birthplace of {name} famous for?", "food"),
            ("Who is the mayor of the town where {name} was born?", "mayor"),
            ("On which river lies the town where the {job} {name} was born?", "river"),
        ]
        questions = []
        for i in range(n_questions):
            p, t = _person(seed, i), _town(seed, i)
            q, field = templates[i % len(templates)]
            questions.append(Question(q.format(name=p["name"], job=p["job"]), (t[field],), (2 * i, 2 * i + 1)))
        return QASet(doc, size, questions, "builtin:generated two-hop (hotpotqa-style)")
    raise QAFileError(f"unknown QA kind {kind!r}; choose squad or hotpotqa")
