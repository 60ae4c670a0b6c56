"""The five RULER task families as size-free drafts (:class:`~headprobe.evals.ruler.fitting.Draft`: a sample
as a function of its size ``n``, RULER's haystack units), each from its own seeded random source, as RULER's
scripts build them: ``niah`` (needles in an essay, noise lines or distractor needles), ``vt`` (variable
tracking, with RULER's in-context example), ``cwe`` (common words), ``fwe`` (frequent coded words), ``qa``
(documents around a question). Their haystacks: the essay's words (:class:`EssayCorpus`: generated prose or
the user's files), wonderwords' word lists and generated pseudo-words, SQuAD v2 / HotpotQA or the built-in QA
set (:mod:`headprobe.evals.ruler.qa`). How large a draft is made is :mod:`headprobe.evals.ruler.fitting`'s.
"""

from __future__ import annotations

import math
import random
import string
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

from headprobe.evals.ruler import templates as T
from headprobe.evals.ruler.fitting import Counter, Draft, TooShort, rulers_search
from headprobe.evals.ruler.qa import QASet, builtin_qa, load_hotpotqa, load_squad
from headprobe.evals.ruler.settings import CweRule, RulerError
from headprobe.evals.ruler.tasks import Task
from headprobe.text.corpus import Writer
from headprobe.text.files import TextFileError, read_text_file
from headprobe.text.haystack import split_sentences
from headprobe.text.prompt_format import Wrapper
from headprobe.text.wordlists import shipped


def _pseudo_word(i: int) -> str:
    """Distinct pronounceable filler words for when the wonderwords vocabulary runs out."""
    syll = ("ba", "ke", "lo", "mi", "nu", "pa", "re", "so", "ti", "vu", "za", "do", "fe", "gi", "ho", "ju")
    out = ""
    i += 16 * 16  # at least three syllables
    while i:
        out += syll[i % 16]
        i //= 16
    return out


class EssayCorpus:
    """The words of the essay haystack: generated prose by default, or the user's text files."""

    def __init__(self, files: list[Path] | None = None) -> None:
        self.files = files
        self.words: list[str] = []
        if files:
            for f in files:
                try:
                    self.words += read_text_file(f, "haystack file").split()
                except TextFileError as err:
                    raise RulerError(str(err)) from None
            if not self.words:
                raise RulerError("the haystack files hold no words")
            self._base = len(self.words)
        else:
            self._writer = Writer(random.Random("headprobe-ruler-essay"))
        self.name = "files:" + ",".join(str(f) for f in files) if files else "builtin:generated-prose"

    def first(self, n: int) -> list[str]:
        """The first ``n`` words (a file corpus repeats when needed, like RULER's)."""
        while len(self.words) < n:
            if self.files:
                self.words += self.words[: self._base]
            else:
                self.words += " ".join(self._writer.prose(20_000)).split()
        return self.words[:n]


def _grow(counts: Callable[[int], np.ndarray], budget: int, start: int = 64) -> np.ndarray:
    """Per-unit token counts for enough units to exceed ``budget`` tokens."""
    n = start
    while True:
        c = counts(n)
        if c.sum() > budget or len(c) < n:
            return c
        n *= 2


class TaskBuilders:
    """The drafts of every task family for one tokenizer (their pieces counted by ``counter``).

    Args:
        counter: the token counts of the evaluated model's tokenizer (shared with the fitting).
        seed: the base seed (the cwe vocabulary's order, the built-in QA set, qa's document shuffle).
        haystack_files: text files replacing the generated prose of the ``essay`` haystack.
        qa_files: ``{"squad": path, "hotpotqa": path}`` original dataset files (else the built-in set).
        cwe_rule: ``ruler`` or ``fit`` (:class:`~headprobe.evals.ruler.settings.CweRule`).
        wrapper: RULER's model template; cwe's in-context example is rendered through it.
    """

    def __init__(
        self,
        counter: Counter,
        seed: int,
        haystack_files: list[Path] | None,
        qa_files: dict[str, Path] | None,
        cwe_rule: CweRule,
        wrapper: Wrapper,
    ) -> None:
        self.counter, self.seed, self.cwe_rule, self.wrapper = counter, seed, cwe_rule, wrapper
        self.essay = EssayCorpus(haystack_files)
        self.qa_files = qa_files or {}
        self._qa: dict[str, QASet] = {}
        vocab = sorted(set(shipped("nouns")) | set(shipped("adjectives")) | set(shipped("verbs")))
        random.Random(seed).shuffle(vocab)
        self.cwe_vocab = vocab

    def draft(self, task: Task, rng: random.Random, budget: int, length: int, index: int) -> tuple[Draft, str, str]:
        """Sample ``index`` of ``task`` at ``length`` drawn from ``rng``, as ``(draft, haystack, source)``: the
        task prompt alone (not yet in the wrapper), which text filled it, and where that text came from."""
        build = {"niah": self._niah, "vt": self._vt, "cwe": self._cwe, "fwe": self._fwe, "qa": self._qa_draft}
        return build[task.family](task, rng, budget, length, index)

    def _wrap(self, prompt: str) -> str:
        return self.wrapper.wrap(prompt)

    # -- needles -------------------------------------------------------------------------------
    @staticmethod
    def _item(kind: str, rng: random.Random) -> str:
        if kind == "numbers":
            return str(rng.randint(10**6, 10**7 - 1))
        if kind == "uuids":
            return str(uuid.UUID(int=rng.getrandbits(128), version=4))
        if kind == "words":
            return f"{rng.choice(shipped('adjectives'))}-{rng.choice(shipped('nouns'))}"
        raise RulerError(f"unknown needle type {kind!r}")

    def _niah(self, task: Task, rng: random.Random, budget: int, length: int, index: int):
        keys: list[str] = []
        while len(keys) < task.num_needle_k:
            if (key := self._item(task.type_needle_k, rng)) not in keys:
                keys.append(key)
        values = [[self._item(task.type_needle_v, rng) for _ in range(task.num_needle_v)] for _ in keys]
        needles = [
            T.NIAH_NEEDLE.format(type_needle_v=task.type_needle_v, key=k, value=v)
            for k, vs in zip(keys, values, strict=True)
            for v in vs
        ]
        random.Random(rng.random()).shuffle(needles)
        asked = rng.sample(range(len(keys)), task.num_needle_q)
        query_keys = [keys[i] for i in asked]
        outputs = [v for i in asked for v in values[i]]
        query = query_keys[0] if len(query_keys) == 1 else ", ".join(query_keys[:-1]) + ", and " + query_keys[-1]
        template, prefix, type_v = T.NIAH_TEMPLATE, T.NIAH_PREFIX, task.type_needle_v
        if task.num_needle_q * task.num_needle_v == 1:
            template, prefix, type_v = T.singular(template), T.singular(prefix), type_v[:-1]
        head, tail = template.format(type_needle_v=type_v, query=query, context="\x00").split("\x00")
        prefix = prefix.format(type_needle_v=type_v, query=query)
        fixed = self.counter.one(head + tail + prefix) + int(self.counter.many(needles).sum()) + len(needles)

        if task.haystack == "essay":
            depths = rng.sample([round(x) for x in np.linspace(0, 100, 40)], len(needles))
            word_counts = _grow(lambda n: self.counter.many([" " + w for w in self.essay.first(n)]), budget)
            prefix_sum = np.concatenate([[0], np.cumsum(word_counts)])

            def render(n: int):
                sentences = split_sentences(" ".join(self.essay.first(n)))
                for needle, depth in zip(needles, depths, strict=True):
                    sentences.insert(int(len(sentences) * depth / 100), needle)
                return head + " ".join(sentences) + tail, prefix, outputs

            return (
                Draft(render, lambda n: fixed + int(prefix_sum[n]), 0, len(word_counts)),
                self.essay.name,
                "RULER-style",
            )

        if task.haystack == "noise":
            unit = self.counter.one(T.NOISE_SENTENCE + "\n")
            lines_for = lambda n: [T.NOISE_SENTENCE] * n  # noqa: E731
            n_max = budget // max(1, unit) + 1
            predict = lambda n: fixed + unit * n  # noqa: E731
        else:  # distractor needles of the same types
            hay_rng = random.Random(rng.random())
            pool: list[str] = []

            def lines_for(n: int) -> list[str]:
                while len(pool) < n:
                    k, v = self._item(task.type_needle_k, hay_rng), self._item(task.type_needle_v, hay_rng)
                    if k not in keys:
                        pool.append(T.NIAH_NEEDLE.format(type_needle_v=task.type_needle_v, key=k, value=v))
                return pool[:n]

            counts = _grow(lambda n: self.counter.many([s + "\n" for s in lines_for(n)]), budget)
            prefix_sum = np.concatenate([[0], np.cumsum(counts)])
            n_max = len(counts)
            predict = lambda n: fixed + int(prefix_sum[n])  # noqa: E731
        slots = [rng.random() for _ in needles]

        def render_lines(n: int):
            lines = list(lines_for(n))
            for needle, at in sorted(zip(needles, slots, strict=True), key=lambda p: p[1]):
                lines.insert(int(at * (len(lines) + 1)), needle)
            return head + "\n".join(lines) + tail, prefix, outputs

        name = "noise" if task.haystack == "noise" else "needle"
        return Draft(render_lines, predict, 0, n_max), name, "RULER-style"

    # -- variable tracking -----------------------------------------------------------------------
    def _vt_parts(self, task: Task, rng: random.Random, name_len: int):
        names: list[str] = []
        while len(names) < 1 + task.num_hops:
            if (nm := "".join(rng.choice(string.ascii_uppercase) for _ in range(name_len))) not in names:
                names.append(nm)
        value = str(rng.randrange(10000, 99999))
        chain = [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(task.num_hops)]
        slots = sorted(rng.random() for _ in chain)
        return names, value, chain, slots

    def _vt_text(self, chain: list[str], slots: list[float], n: int) -> str:
        lines = [T.NOISE_SENTENCE] * n
        for offset, (line, at) in enumerate(zip(chain, slots, strict=True)):
            lines.insert(int(at * (n + 1)) + offset, line)
        return "\n".join(lines).replace(". \n", ".\n")

    def _vt_example_size(self, chain: list[str], slots: list[float], value: str, num_v: int) -> int:
        """Noise lines of vt's in-context example as RULER's ``variable_tracking.py`` sizes it: the largest
        count whose example (template and answer prefix) is at most 500 tokens, by its binary search from
        5 lines (upper bound 3x 500 over the tokens per line at 5 lines)."""

        def tokens(n: int) -> int:
            text = T.VT_TEMPLATE.format(context=self._vt_text(chain, slots, n), query=value)
            return self.counter.one(text + T.VT_PREFIX.format(num_v=num_v, query=value))

        step = 5
        return rulers_search(step, max(int(500 / (tokens(step) / step) * 3), 2 * step), lambda n: tokens(n) <= 500)

    def _vt(self, task: Task, rng: random.Random, budget: int, length: int, index: int):
        num_v = task.num_hops + 1
        # the in-context example, as RULER builds it: a small sample (about 500 tokens) with 3-letter
        # names, its answer after the prefix and one more space, a newline, then a blank line
        ex_names, ex_value, ex_chain, ex_slots = self._vt_parts(task, rng, 3)
        ex_n = self._vt_example_size(ex_chain, ex_slots, ex_value, num_v)
        example = (
            T.VT_TEMPLATE.format(context=self._vt_text(ex_chain, ex_slots, ex_n), query=ex_value)
            + T.VT_PREFIX.format(num_v=num_v, query=ex_value)
            + " "
            + " ".join(ex_names)
            + "\n\n"
        )
        names, value, chain, slots = self._vt_parts(task, rng, 5)
        head, tail = T.VT_TEMPLATE.format(context="\x00", query=value).split("\x00")
        prefix = T.VT_PREFIX.format(num_v=num_v, query=value)
        fixed = self.counter.one(example + head + tail + prefix) + int(
            self.counter.many([c + "\n" for c in chain]).sum()
        )
        unit = self.counter.one(T.NOISE_SENTENCE + "\n")

        def render(n: int):
            return example + head + self._vt_text(chain, slots, n) + tail, prefix, names

        return Draft(render, lambda n: fixed + unit * n, 0, budget // max(1, unit) + 1), "noise", "RULER-style"

    # -- common words ----------------------------------------------------------------------------
    def _cwe_words(self, rng: random.Random, n: int) -> list[str]:
        vocab = self.cwe_vocab
        if n > len(vocab):  # beyond wonderwords' 8,166 words: distinct generated words
            vocab = vocab + [_pseudo_word(i) for i in range(n - len(vocab))]
        order = random.Random(rng.random()).sample(range(len(vocab)), min(n, len(vocab)))
        return [vocab[i] for i in order]

    @staticmethod
    def _cwe_list(words: list[str], num_cw: int, freq_cw: int, freq_ucw: int, rng: random.Random) -> str:
        items = [w for w in words[:num_cw] for _ in range(freq_cw)] + [
            w for w in words[num_cw:] for _ in range(freq_ucw)
        ]
        rng.shuffle(items)
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(items))

    def _cwe(self, task: Task, rng: random.Random, budget: int, length: int, index: int):
        # RULER's settings below 4,096 tokens (example 20 words x3/x1, main x6/x1); the "fit" rule also
        # uses them at longer lengths whose standard prompt cannot fit (e.g. byte-level tokenizers)
        small, standard = (6, 1, 20, 3, 1), (task.freq_cw, task.freq_ucw, 40, 10, 3)
        options = [standard] if self.cwe_rule is CweRule.RULER else [standard, small]
        settings = [small] if length < 4096 else options
        state = rng.getstate()
        for freq_cw, freq_ucw, ex_words, ex_cw, ex_ucw in settings:
            rng.setstate(state)
            draft = self._cwe_draft(task, rng, budget, freq_cw, freq_ucw, ex_words, ex_cw, ex_ucw)
            if draft.predict(draft.n_min) <= budget:
                break
        else:
            if self.cwe_rule is CweRule.RULER and length >= 4096:
                raise TooShort(
                    f"cwe at length {length}: RULER's word counts at 4,096 tokens and up (common x{freq_cw}, "
                    f"others x{freq_ucw}, a 40-word example) need about {draft.predict(draft.n_min)} tokens, more "
                    f"than the {budget} available (a byte-level tokenizer?); use `--cwe-rule fit` (the small "
                    "counts where the standard ones do not fit) or a longer length",
                    draft.predict(draft.n_min),
                )
        return draft, "words", f"RULER-style (common x{freq_cw}, others x{freq_ucw})"

    def _cwe_draft(self, task, rng, budget, freq_cw, freq_ucw, ex_words, ex_cw, ex_ucw) -> Draft:
        example_words = self._cwe_words(rng, ex_words)
        listing = self._cwe_list(example_words, task.num_cw, ex_cw, ex_ucw, rng)
        answer = " ".join(f"{i + 1}. {w}" for i, w in enumerate(example_words[: task.num_cw]))
        # RULER renders the example through the whole template, wrapper included, before the prompt
        example = self._wrap(T.CWE_TEMPLATE.format(context=listing)) + T.CWE_PREFIX + " " + answer + "\n"
        pool_seed = rng.random()
        head, tail = T.CWE_TEMPLATE.split("{context}")
        fixed = self.counter.one(example + head + tail + T.CWE_PREFIX)

        def words_for(n: int) -> list[str]:
            return self._cwe_words(random.Random(pool_seed), n)

        def predict(n: int) -> int:
            reps = np.array([freq_cw] * min(n, task.num_cw) + [freq_ucw] * max(0, n - task.num_cw))
            numbers = self.counter.many([f" {i + 1}." for i in range(int(reps.sum()))]).sum()
            return fixed + int(numbers) + int((self.counter.many([" " + w for w in words_for(n)]) * reps).sum())

        def render(n: int):
            ws = words_for(n)
            text = self._cwe_list(ws, task.num_cw, freq_cw, freq_ucw, random.Random(pool_seed + n))
            return head + text + tail, T.CWE_PREFIX, ws[: task.num_cw]

        n_max = task.num_cw + 1
        while predict(n_max) <= budget:
            n_max *= 2
        return Draft(render, predict, task.num_cw, n_max, example=example)

    # -- frequent words --------------------------------------------------------------------------
    def _fwe(self, task: Task, rng: random.Random, budget: int, length: int, index: int):
        from scipy.special import zeta

        vocab_size = max(8, (length - task.tokens_to_generate) // 50)
        coded = sorted({"".join(rng.choice(string.ascii_lowercase) for _ in range(6)) for _ in range(vocab_size)})
        rng.shuffle(coded)
        coded[0] = "..."
        ranks = np.arange(1, len(coded) + 1, dtype=np.float64)
        shares = ranks ** (-task.alpha) / zeta(task.alpha)
        word_tokens = self.counter.many([" " + w for w in coded])
        head, tail = T.FWE_TEMPLATE.split("{context}")
        fixed = self.counter.one(head + tail + T.FWE_PREFIX)
        order_seed = rng.random()

        def counts(n: int) -> np.ndarray:
            return (n * shares).astype(np.int64)

        def render(n: int):
            tokens = [w for w, c in zip(coded, counts(n), strict=True) for _ in range(c)]
            random.Random(order_seed).shuffle(tokens)
            return head + " ".join(tokens) + tail, T.FWE_PREFIX, coded[1:4]

        n_min = math.ceil(4 / shares[3])  # the answer words must all occur
        n_max = n_min
        while fixed + int((counts(n_max) * word_tokens).sum()) <= budget:
            n_max *= 2
        return (
            Draft(render, lambda n: fixed + int((counts(n) * word_tokens).sum()), n_min, n_max),
            "coded-words",
            "RULER-style",
        )

    # -- question answering ----------------------------------------------------------------------
    def qa_set(self, dataset: str) -> QASet:
        if dataset not in self._qa:
            path = self.qa_files.get(dataset)
            if path is None:
                self._qa[dataset] = builtin_qa(dataset, seed=self.seed)
            else:
                self._qa[dataset] = load_squad(path) if dataset == "squad" else load_hotpotqa(path)
        return self._qa[dataset]

    def _qa_draft(self, task: Task, rng: random.Random, budget: int, length: int, index: int):
        qa = self.qa_set(task.dataset or "squad")
        question = qa.questions[index % len(qa.questions)]  # RULER: questions in file order
        gold, related = list(question.gold), [i for i in question.related if i not in question.gold]
        # RULER's choice of documents: while the related ones (the article's other paragraphs) suffice,
        # a random sample of them; beyond, all of them and a random sample of the rest
        taken = set(gold) | set(related)
        others: list[int] = []
        pick, pick_related = random.Random(rng.random()), rng.random()

        def docs_for(n: int) -> list[int]:
            if n - len(gold) <= len(related):
                return gold + random.Random(pick_related).sample(related, max(0, n - len(gold)))
            while len(gold) + len(related) + len(others) < n and len(taken) < qa.size:
                j = pick.randrange(qa.size)
                if j not in taken:
                    taken.add(j)
                    others.append(j)
            return gold + related + others[: n - len(gold) - len(related)]

        head, tail = T.QA_TEMPLATE.format(context="\x00", query=question.question).split("\x00")
        fixed = self.counter.one(head + tail + T.QA_PREFIX)

        def doc_counts(n: int) -> np.ndarray:
            ids = docs_for(n)
            return self.counter.many([qa.document(j) for j in ids])

        def predict(n: int) -> int:
            labels = self.counter.many([f"Document {i + 1}:\n" for i in range(n)]).sum() + 2 * max(0, n - 1)
            return fixed + int(doc_counts(n).sum()) + int(labels)

        def render(n: int):
            ids = docs_for(n)
            random.Random(self.seed).shuffle(ids)  # as RULER: one fixed-seed shuffle, the same for every sample
            context = "\n\n".join(f"Document {i + 1}:\n{qa.document(j)}" for i, j in enumerate(ids))  # as RULER
            return head + context + tail, T.QA_PREFIX, list(question.answers)

        n_min = len(gold)
        n_max = n_min + 1
        while n_max < qa.size and predict(n_max) <= budget:
            n_max = min(qa.size, n_max * 2)
        return Draft(render, predict, n_min, n_max), "documents", qa.source
