"""The built-in offline training corpus: generated English-like prose mixed with documents that
reward retrieval from context, so that retrieval can be learned at toy scale.

Document kinds (``MIXTURE`` gives their shares by document count):

``prose``
    Sentences from a small grammar over wonderwords' nouns, verbs and adjectives.
``kv_recall``
    Prose with 1-6 facts "The special code for the <adjective> <noun> is <7 digits>." at random depths,
    then questions about some of them, each followed by the answer: retrieval of a key's value.
``var_chain``
    Variable assignments ``VAR ABCDE = 12345`` followed by copies ``VAR FGHIJ = VAR ABCDE`` (2-4
    hops, plus a distractor chain) spread through prose, then a question whose answer needs every
    hop: multi-hop tracing.
``word_count``
    A numbered word list in which a few words repeat many times, then the most frequent words:
    counting over the context.

Documents are 200-3000 characters, so facts sit up to thousands of bytes before their question:
far outside the toys' 8-token sliding window, so only the full-attention layers can fetch them.
Everything is deterministic in ``(seed, document index)``.
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterator

from headprobe.text.wordlists import words

MIXTURE: dict[str, float] = {"prose": 0.45, "kv_recall": 0.25, "var_chain": 0.15, "word_count": 0.15}


def _third_person(verb: str) -> str:
    if verb.endswith(("s", "sh", "ch", "x", "z", "o")):
        return verb + "es"
    if verb.endswith("y") and len(verb) > 1 and verb[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


def _past(verb: str) -> str:
    if verb.endswith("e"):
        return verb + "d"
    if verb.endswith("y") and len(verb) > 1 and verb[-2] not in "aeiou":
        return verb[:-1] + "ied"
    return verb + "ed"


class Writer:
    """Sentence and phrase generators sharing one random stream."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.nouns, self.verbs, self.adjs = words("nouns"), words("verbs"), words("adjectives")

    def noun_phrase(self) -> str:
        r = self.rng
        if r.random() < 0.5:
            return f"the {r.choice(self.adjs)} {r.choice(self.nouns)}"
        return f"the {r.choice(self.nouns)}"

    def sentence(self) -> str:
        r = self.rng
        kind = r.randrange(5)
        subj, obj = self.noun_phrase(), self.noun_phrase()
        verb = r.choice(self.verbs)
        if kind == 0:
            s = f"{subj} {_third_person(verb)} {obj}"
        elif kind == 1:
            s = f"{subj} {_past(verb)} {obj} near {self.noun_phrase()}"
        elif kind == 2:
            s = f"when {subj} {_third_person(verb)}, {obj} {_third_person(r.choice(self.verbs))} too"
        elif kind == 3:
            s = f"{subj} is {r.choice(self.adjs)} and {r.choice(self.adjs)}"
        else:
            s = f"every {r.choice(self.nouns)} {_third_person(verb)} {obj} before {self.noun_phrase()} does"
        return s[0].upper() + s[1:] + "."

    def prose(self, n_chars: int) -> list[str]:
        out, size = [], 0
        while size < n_chars:
            s = self.sentence()
            out.append(s)
            size += len(s) + 1
        return out

    def key(self) -> str:
        return f"{self.rng.choice(self.adjs)} {self.rng.choice(self.nouns)}"

    def number(self) -> str:
        return str(self.rng.randrange(1_000_000, 10_000_000))

    def var_name(self) -> str:
        return "".join(self.rng.choice(string.ascii_uppercase) for _ in range(5))


def _insert_at_random_depths(rng: random.Random, sentences: list[str], items: list[str]) -> list[str]:
    out = list(sentences)
    for item in items:
        out.insert(rng.randrange(len(out) + 1), item)
    return out


def _interleave(rng: random.Random, a: list[str], b: list[str]) -> list[str]:
    """A random merge of ``a`` and ``b`` that keeps the order within each."""
    picks = [0] * len(a) + [1] * len(b)
    rng.shuffle(picks)
    sources = [iter(a), iter(b)]
    return [next(sources[p]) for p in picks]


def prose_doc(w: Writer) -> str:
    return " ".join(w.prose(w.rng.randrange(200, 2500)))


def kv_recall_doc(w: Writer) -> str:
    r = w.rng
    n = r.randrange(1, 7)
    keys: list[str] = []
    while len(keys) < n:
        k = w.key()
        if k not in keys:
            keys.append(k)
    values = [w.number() for _ in keys]
    facts = [f"The special code for the {k} is {v}." for k, v in zip(keys, values, strict=True)]
    body = _insert_at_random_depths(r, w.prose(r.randrange(150, 2500)), facts)
    asked = r.sample(range(n), k=r.randrange(1, n + 1))
    qa = [f"Question: What is the special code for the {keys[i]}? Answer: {values[i]}." for i in asked]
    return " ".join(body + qa)


def var_chain_doc(w: Writer) -> str:
    r = w.rng
    names: set[str] = set()

    def fresh() -> str:
        while (name := w.var_name()) in names:
            pass
        names.add(name)
        return name

    def chain(hops: int) -> tuple[str, list[str], list[str]]:
        value, chain_names = w.number(), [fresh()]
        lines = [f"VAR {chain_names[0]} = {value}."]
        for _ in range(hops):
            chain_names.append(fresh())
            lines.append(f"VAR {chain_names[-1]} = VAR {chain_names[-2]}.")
        return value, chain_names, lines

    value, chain_names, lines = chain(r.randrange(2, 5))
    _, _, distractor = chain(r.randrange(1, 4))
    statements = _interleave(r, lines, distractor)  # each chain keeps its order
    body = w.prose(r.randrange(150, 2000))
    slots = sorted(r.randrange(len(body) + 1) for _ in statements)
    merged = list(body)
    for offset, (slot, statement) in enumerate(zip(slots, statements, strict=True)):
        merged.insert(slot + offset, statement)
    if r.random() < 0.5:
        question = f"Question: Find all variables that are assigned the value {value}. Answer: {' '.join(chain_names)}."
    else:
        question = f"Question: What is the value of {chain_names[-1]}? Answer: {value}."
    return " ".join([*merged, question])


def word_count_doc(w: Writer) -> str:
    r = w.rng
    common = r.sample(w.nouns, 3)
    rare_pool = r.sample(w.nouns, 60)
    counts = sorted((r.randrange(4, 12) for _ in common), reverse=True)
    if len(set(counts)) < 3:
        counts = [counts[0] + 2, counts[0] + 1, counts[0]]
    items = [word for word, c in zip(common, counts, strict=True) for _ in range(c)]
    items += [x for x in rare_pool if x not in common][: r.randrange(15, 50)]
    r.shuffle(items)
    listing = " ".join(f"{i + 1}. {word}" for i, word in enumerate(items))
    return (
        f"Below is a numbered list of words. {listing} Question: What are the 3 most common words "
        f"in the list above? Answer: The top 3 words are: {', '.join(common)}."
    )


GENERATORS = {
    "prose": prose_doc,
    "kv_recall": kv_recall_doc,
    "var_chain": var_chain_doc,
    "word_count": word_count_doc,
}


def document(seed: int, index: int, mixture: dict[str, float] | None = None) -> tuple[str, str]:
    """Document ``index`` of the corpus with ``seed``: ``(kind, text)``."""
    mixture = mixture or MIXTURE
    rng = random.Random(f"headprobe-corpus-{seed}-{index}")
    kind = rng.choices(list(mixture), weights=list(mixture.values()))[0]
    return kind, GENERATORS[kind](Writer(rng))


def documents(seed: int = 0, start: int = 0, mixture: dict[str, float] | None = None) -> Iterator[tuple[str, str]]:
    """Endless ``(kind, text)`` stream from document ``start`` on."""
    index = start
    while True:
        yield document(seed, index, mixture)
        index += 1
