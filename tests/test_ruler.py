"""RULER-style generation and scoring against the specification (shared/reference/ruler.md)."""

from __future__ import annotations

import json
import random
import re
from collections import Counter

import pytest
import torch
from typer.testing import CliRunner

import headprobe.evals.ruler.job as evaluate_mod
from headprobe.cli import app
from headprobe.evals.ruler import TASKS, RulerError, RulerGenerator, resolve_tasks, string_match_all, string_match_part
from headprobe.evals.ruler import templates as T
from headprobe.evals.ruler.job import evaluate
from headprobe.evals.ruler.qa import load_hotpotqa, load_squad
from headprobe.evals.ruler.resolve import resolve_run
from headprobe.evals.ruler.settings import RulerSettings
from headprobe.evals.ruler.tables import overall, per_length, per_task
from headprobe.hooked import HeadprobeModel, HookedModel
from headprobe.jobs.memory import DoesNotFit
from headprobe.model.presets import preset
from headprobe.model.tokenizer import ByteTokenizer, load_tokenizer
from headprobe.model.transformer import Transformer
from headprobe.results import collect, read_table
from headprobe.testing import build_toy_bpe
from headprobe.text.prompt_format import Wrapper

# the strings of ruler.md §2, typed here independently of headprobe/ruler/templates.py
SPEC = {
    "niah": "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I "
    "will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} "
    "for {query} mentioned in the provided text?",
    "niah_prefix": " The special magic {type_needle_v} for {query} mentioned in the provided text are",
    "vt": "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\nQuestion:"
    " Find all variables that are assigned the value {query} in the text above.",
    "vt_prefix": " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
    "assigned the value {query}, they are: ",
    "cwe": "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
    "that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?",
    "cwe_prefix": " Answer: The top 10 words that appear most often in the list are:",
    "fwe": "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
    "appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What "
    "are the three most frequently appeared words in the above coded text?",
    "fwe_prefix": " Answer: According to the coded text above, the three most frequently appeared words are:",
    "qa": "Answer the question based on the given documents. Only give me the answer and do not output any other "
    "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given documents. "
    "Only give me the answer and do not output any other words.\n\nQuestion: {query}",
    "qa_prefix": " Answer:",
    "noise": "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.",
    "needle": "One of the special magic {type_needle_v} for {key} is: {value}.",
}


def test_templates_are_rulers_strings():
    assert (SPEC["niah"], SPEC["niah_prefix"], SPEC["needle"]) == (T.NIAH_TEMPLATE, T.NIAH_PREFIX, T.NIAH_NEEDLE)
    assert (SPEC["vt"], SPEC["vt_prefix"]) == (T.VT_TEMPLATE, T.VT_PREFIX)
    assert (SPEC["cwe"], SPEC["cwe_prefix"]) == (T.CWE_TEMPLATE, T.CWE_PREFIX)
    assert (SPEC["fwe"], SPEC["fwe_prefix"]) == (T.FWE_TEMPLATE, T.FWE_PREFIX)
    assert (SPEC["qa"], SPEC["qa_prefix"], SPEC["noise"]) == (T.QA_TEMPLATE, T.QA_PREFIX, T.NOISE_SENTENCE)


def test_task_table():
    assert list(TASKS) == [
        "niah_single_1",
        "niah_single_2",
        "niah_single_3",
        "niah_multikey_1",
        "niah_multikey_2",
        "niah_multikey_3",
        "niah_multivalue",
        "niah_multiquery",
        "vt",
        "cwe",
        "fwe",
        "qa_1",
        "qa_2",
    ]
    t = TASKS
    assert (t["niah_single_1"].haystack, t["niah_single_2"].haystack, t["niah_multikey_2"].haystack) == (
        "noise",
        "essay",
        "needle",
    )
    assert (t["niah_multikey_3"].type_needle_k, t["niah_multikey_3"].type_needle_v) == ("uuids", "uuids")
    assert t["niah_multiquery"].num_needle_k == 4 and t["niah_multiquery"].num_needle_q == 4
    assert t["niah_multivalue"].num_needle_v == 4 and t["niah_multikey_1"].num_needle_k == 4
    assert [t[n].tokens_to_generate for n in ("niah_single_1", "vt", "cwe", "fwe", "qa_1")] == [128, 30, 120, 50, 32]
    assert {n for n, x in t.items() if x.metric == "string_match_part"} == {"qa_1", "qa_2"}


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return load_tokenizer(build_toy_bpe(tmp_path_factory.mktemp("tok") / "tokenizer.json", vocab_size=400))


@pytest.fixture(scope="module")
def samples(bpe):
    out = {}
    for name, tok in (("byte", ByteTokenizer()), ("bpe", bpe)):
        gen = RulerGenerator(tok, seed=7, fit="tight", cwe_rule="fit")  # ruler fit: test_ruler_fit_*
        out[name] = (tok, [gen.sample(task, length, i) for task in TASKS for length in (4096, 8192) for i in range(2)])
    return out


@pytest.mark.parametrize("tok_name", ["byte", "bpe"])
def test_every_sample_fits_and_fills_its_budget(samples, tok_name):
    tok, rows = samples[tok_name]
    for s in rows:
        count = len(tok.encode(s["input"] + s["answer_prefix"]))  # counted again, independently
        assert count == s["token_count"]
        assert count + TASKS[s["task"]].tokens_to_generate <= s["length"], s["task"]
        assert count >= 0.95 * (s["length"] - TASKS[s["task"]].tokens_to_generate), (s["task"], count)


def test_singular_rewrite(samples):
    _, rows = samples["byte"]
    single = next(s for s in rows if s["task"] == "niah_single_1")
    assert single["input"].startswith("A special magic number is hidden within the following text.")
    assert "I will quiz you about the number afterwards." in single["input"]
    key = re.search(r"What is the special magic number for (\S+) mentioned", single["input"]).group(1)
    assert single["answer_prefix"] == f" The special magic number for {key} mentioned in the provided text is"
    multi = next(s for s in rows if s["task"] == "niah_multivalue")
    assert multi["input"].startswith("Some special magic numbers are hidden")
    assert multi["answer_prefix"].endswith("mentioned in the provided text are")


@pytest.mark.parametrize("tok_name", ["byte", "bpe"])
def test_every_answer_is_in_the_input(samples, tok_name):
    tok, rows = samples[tok_name]
    for s in rows:
        task, text = TASKS[s["task"]], s["input"]
        if task.family == "niah":
            needles = re.findall(r"One of the special magic (\w+) for (\S+) is: (\S+)\.", text)
            asked = re.search(r"for (.+) mentioned in the provided text\?", text).group(1)
            keys = re.split(r", and |, ", asked)
            expected = [v for k in keys for (_, key, v) in needles if key == k]
            assert (
                sorted(s["outputs"]) == sorted(expected) and len(s["outputs"]) == task.num_needle_q * task.num_needle_v
            )
            if task.haystack == "noise":
                assert text.count(SPEC["noise"]) >= 10
        elif task.family == "vt":
            body = text.split("\n", text.count("\n"))  # the example comes first, then the real prompt
            value = re.search(r"assigned the value (\d+) in the text above\.$", text).group(1)
            main = text[text.rindex("Memorize and track") :]
            values = dict(re.findall(r"VAR (\w+) = (\d+)", main))
            links = re.findall(r"VAR (\w+) = VAR (\w+)", main)
            for _ in links:
                for dst, src in links:
                    if src in values:
                        values[dst] = values[src]
            assert sorted(s["outputs"]) == sorted(k for k, v in values.items() if v == value) and len(body) > 1
            # RULER's example: 3-letter names after the prefix and one more space, then a blank line
            # ("they are:  YXQ RDX NRI SOE RJT\n\nMemorize"); the task's own names have 5 letters
            names = r"[A-Z]{3}(?: [A-Z]{3}){" + str(task.num_hops) + "}"  # num_hops + 1 names
            assert re.search(r"they are:  " + names + r"\n\nMemorize and track", text)
            assert all(len(name) == 5 for name in s["outputs"])
            # its size as RULER's variable_tracking.py finds it: the most noise lines with the example's
            # template and answer prefix within 500 tokens (re-counted here at n and n + 1 lines)
            example = text[: text.rindex("Memorize and track")]
            question = example[: example.rindex(" Answer: ")]
            n = example.count(SPEC["noise"])
            one_more = question.replace(SPEC["noise"], SPEC["noise"] + "\n" + SPEC["noise"], 1)
            answer = example[example.rindex(" Answer: ") : example.rindex("they are:") + len("they are:")]
            if s["wrapper"] == T.BASE_WRAPPER:
                size = len(tok.encode(question + answer + " "))
                if size <= 500:
                    assert len(tok.encode(one_more + answer + " ")) > 500 and n >= 5
                else:  # not even 5 lines fit (a tiny vocabulary): RULER's search falls back to one step
                    assert n == 5
        elif task.family == "cwe":
            main = text[text.rindex("Below is a numbered list") :]
            counts = Counter(re.findall(r"\d+\. (\S+)", main))
            top = {w for w, _ in counts.most_common(10)}
            assert set(s["outputs"]) == top
            assert min(counts[w] for w in top) > max(c for w, c in counts.items() if w not in top)
        elif task.family == "fwe":
            words = text.split("coded words. ", 1)[1].split("\nQuestion:")[0].split()
            ranked = [w for w, _ in Counter(w for w in words if w != "...").most_common(3)]
            assert ranked == s["outputs"]
        else:  # qa: every answer sits in a document
            docs = text.split("The following are given documents.\n\n", 1)[1]
            assert any(a in docs for a in s["outputs"])
            numbers = [int(x) for x in re.findall(r"^Document (\d+):$", docs, flags=re.M)]
            assert numbers == list(range(1, len(numbers) + 1))  # numbered from 1, as RULER (i + 1)


def _trial_tokens(gen, task, length, n, trial=0):
    """Tokens of trial sample ``trial`` (seeded ``probe-<i>``: a sample of its own, not one of those generated)
    at size ``n``, counted independently here; and the budget."""
    budget = length - task.tokens_to_generate
    draft = gen._draft(task, budget, length, f"probe-{trial}")[0]
    text, prefix, _ = draft.render(n)
    return len(gen.tokenizer.encode(text + prefix)), budget


def _rulers_search(gen, task, length, step):
    """RULER's size search re-derived from its scripts (niah.py, variable_tracking.py, qa.py,
    common_words_extraction.py): an estimate from one sample, then a binary search in which every test
    draws a fresh sample (here: trial 0 for the estimate, trials 1, 2, ... for the tests)."""
    if task.family == "cwe":
        hi = int(length // (_trial_tokens(gen, task, length, 4096)[0] / 4096)) * 2
    else:
        hi = int(length / (_trial_tokens(gen, task, length, step)[0] / step) * 3)
    lo, hi, best, trial = step, max(hi, 2 * step), None, 1
    while lo <= hi:
        mid = (lo + hi) // 2
        tokens, budget = _trial_tokens(gen, task, length, mid, trial)
        trial += 1
        if tokens <= budget:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return step if best is None else best


@pytest.mark.parametrize("name", ["niah_multikey_2", "niah_single_1", "vt", "qa_1", "cwe"])
def test_ruler_fit_is_one_size_per_task_and_length_shrunk_by_whole_steps(bpe, name):
    task, length = TASKS[name], 8192
    gen = RulerGenerator(bpe, seed=11)
    rows = [gen.sample(task, length, i) for i in range(4)]
    step = {"niah_multikey_2": 25, "niah_single_1": 25, "vt": 10, "qa_1": 10, "cwe": 10}[name]  # RULER's scripts
    size = gen.ruler_size(task, length, length - task.tokens_to_generate)
    assert size == _rulers_search(gen, task, length, step)
    budget = length - task.tokens_to_generate
    for s in rows:
        assert s["fit"] == "ruler" and (size - s["size"]) % step == 0 and s["size"] <= size
        assert s["token_count"] == len(bpe.encode(s["input"] + s["answer_prefix"])) <= budget
        assert s["fill"] == pytest.approx(s["token_count"] / budget)
        if s["size"] < size:  # shrunk: one step more would not have fitted
            draft = gen._draft(task, budget, length, s["index"])[0]
            text, prefix, _ = draft.render(s["size"] + step)
            assert len(bpe.encode(text + prefix)) > budget
    tight = [RulerGenerator(bpe, seed=11, fit="tight").sample(task, length, i) for i in range(4)]
    assert all(t["fit"] == "tight" and t["fill"] >= 0.95 for t in tight)
    assert sum(s["fill"] for s in rows) <= sum(t["fill"] for t in tight)


def test_ruler_fit_of_fwe_is_rulers_linear_search(bpe):
    task, length = TASKS["fwe"], 8192
    gen = RulerGenerator(bpe, seed=11)
    budget = length - task.tokens_to_generate
    step = budget // 32
    size = gen.ruler_size(task, length, budget)
    assert (size - budget // 6) % step == 0  # from budget // 6 up in steps of budget // 32
    # one sample throughout (RULER's fwe draws its vocabulary once per call): the first size to reach
    # the budget stops the search, and the size is one step below it
    assert _trial_tokens(gen, task, length, size)[0] < budget <= _trial_tokens(gen, task, length, size + step)[0]
    s = gen.sample(task, length, 0)
    assert s["fit"] == "ruler" and s["size"] <= size and (size - s["size"]) % step == 0


def test_ruler_fit_falls_back_to_tight_where_no_whole_step_fits(bpe):
    # an essay haystack shrinks by 500 words: at 1,024 tokens no size RULER can reach fits
    s = RulerGenerator(bpe, seed=2).sample("niah_single_2", 1024, 0)
    assert s["fit"] == "tight" and s["token_count"] <= s["budget"]
    assert RulerGenerator(bpe, seed=2).sample("niah_single_1", 1024, 0)["fit"] == "ruler"  # 5-line steps


def test_cwe_rule_follows_rulers_4096_threshold(bpe):
    small = RulerGenerator(bpe, seed=1).sample("cwe", 2048, 0)
    assert "common x6, others x1" in small["source"] and small["cwe_rule"] == "ruler"
    with pytest.raises(RulerError, match="use `--cwe-rule fit`"):
        RulerGenerator(bpe, seed=1).sample("cwe", 4096, 0)  # x30/x3 cannot fit this tokenizer; RULER keeps them
    ours = RulerGenerator(bpe, seed=1, cwe_rule="fit").sample("cwe", 4096, 0)
    assert "common x6, others x1" in ours["source"] and ours["cwe_rule"] == "fit"
    tok = ByteTokenizer()
    big = RulerGenerator(tok, seed=1).sample("cwe", 32768, 0)
    assert "common x30, others x3" in big["source"]
    main = big["input"][big["input"].rindex("Below is a numbered list") :]
    counts = Counter(re.findall(r"\d+\. (\S+)", main))
    assert sorted(counts[w] for w in big["outputs"]) == [30] * 10 and set(counts.values()) == {30, 3}


def test_determinism_and_diversity(bpe):
    a = RulerGenerator(bpe, seed=3).sample("niah_multikey_2", 4096, 0)
    b = RulerGenerator(bpe, seed=3).sample("niah_multikey_2", 4096, 0)
    c = RulerGenerator(bpe, seed=3).sample("niah_multikey_2", 4096, 1)
    d = RulerGenerator(bpe, seed=4).sample("niah_multikey_2", 4096, 0)
    assert a == b
    assert a["input"] != c["input"] and a["outputs"] != c["outputs"] and a["input"] != d["input"]
    gen = RulerGenerator(ByteTokenizer(), seed=3, cwe_rule="fit")
    inputs = {gen.sample(t, 4096, i)["input"] for t in ("vt", "cwe", "fwe", "qa_1") for i in range(3)}
    assert len(inputs) == 12


def test_string_match_hand_computed():
    preds = ["The numbers are 123 and 456.", "nothing here", "ALPHA beta"]
    refs = [["123", "456", "789"], ["x"], ["alpha", "Beta"]]
    # all: (2/3 + 0 + 2/2) / 3 * 100 = 55.555... -> 55.56
    assert string_match_all(preds, refs) == 55.56
    # part: (1 + 0 + 1) / 3 * 100 = 66.67
    assert string_match_part(preds, refs) == 66.67
    assert string_match_all(["a"], [["A"]]) == 100.0
    with pytest.raises(ValueError, match="predictions"):
        string_match_all(["a"], [])


def _squad(tmp_path):
    data = {
        "version": "v2.0",
        "data": [
            {
                "title": "Rivers",
                "paragraphs": [
                    {
                        "context": "The Oulu river flows north into the bay.",
                        "qas": [
                            {
                                "question": "Where does the Oulu river flow?",
                                "id": "1",
                                "is_impossible": False,
                                "answers": [
                                    {"text": "north into the bay", "answer_start": 16},
                                    {"text": "north", "answer_start": 16},
                                ],
                            },
                            {"question": "Who owns the river?", "id": "2", "is_impossible": True, "answers": []},
                        ],
                    },
                    {"context": "Salmon swim upstream each autumn.", "qas": []},
                ],
            },
            {
                "title": "Bells",
                "paragraphs": [
                    {
                        "context": "The chapel bell was cast in 1721.",
                        "qas": [
                            {
                                "question": "When was the chapel bell cast?",
                                "id": "3",
                                "is_impossible": False,
                                "answers": [{"text": "1721", "answer_start": 28}],
                            }
                        ],
                    }
                ],
            },
        ],
    }
    path = tmp_path / "dev-v2.0.json"
    path.write_text(json.dumps(data))
    return path


def _hotpot(tmp_path):
    data = [
        {
            "_id": "a",
            "question": "Which town is the painter from?",
            "answer": "Bergen",
            "context": [["Painter", ["The painter was born ", "in Bergen."]], ["Lake", ["The lake is cold."]]],
            "supporting_facts": [["Painter", 1]],
        }
    ]
    path = tmp_path / "hotpot_dev_distractor_v1.json"
    path.write_text(json.dumps(data))
    return path


def test_squad_and_hotpotqa_loaders(tmp_path):
    squad = load_squad(_squad(tmp_path))
    assert squad.size == 3 and [q.question for q in squad.questions] == [
        "Where does the Oulu river flow?",
        "When was the chapel bell cast?",
    ]
    first = squad.questions[0]
    assert first.answers == ("north into the bay", "north")
    assert squad.document(first.gold[0]) == "The Oulu river flows north into the bay."
    assert [squad.document(i) for i in first.related] == ["Salmon swim upstream each autumn."]
    hotpot = load_hotpotqa(_hotpot(tmp_path))
    assert hotpot.questions[0].answers == ("Bergen",)
    assert hotpot.document(hotpot.questions[0].gold[0]) == "Painter\nThe painter was born in Bergen."
    gen = RulerGenerator(ByteTokenizer(), qa_files={"squad": _squad(tmp_path)})
    s = gen.sample("qa_1", 700, 0)
    assert "Document 1:" in s["input"] and "Document 0:" not in s["input"]
    assert "The Oulu river flows north into the bay." in s["input"]
    assert s["outputs"] == ["north into the bay", "north"] and s["source"].startswith("squad:")


def test_qa_documents_are_chosen_and_ordered_as_rulers_qa_py(tmp_path):
    def article(title, n):
        paragraphs = [{"context": f"{title} paragraph {i} says {i * 7}.", "qas": []} for i in range(n)]
        paragraphs[0]["qas"] = [
            {"question": f"What does {title} paragraph 0 say?", "id": title, "is_impossible": False,
             "answers": [{"text": "0", "answer_start": 0}, {"text": "0", "answer_start": 0}]}
        ]  # fmt: skip
        return {"title": title, "paragraphs": paragraphs}

    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"version": "v2.0", "data": [article("Alpha", 5), article("Beta", 20)]}))
    squad = load_squad(path)
    assert squad.questions[0].answers == ("0", "0")  # RULER keeps every answer text, duplicates too
    gen = RulerGenerator(ByteTokenizer(), seed=42, qa_files={"squad": path})
    task = TASKS["qa_1"]
    for n in (3, 8):
        order = list(range(n))
        random.Random(42).shuffle(order)  # RULER: random.Random(args.random_seed).shuffle(all_docs), gold first
        for index in (0, 1):  # a question of Alpha (4 related paragraphs) and one of Beta (19)
            draft = gen.builders._qa_draft(task, random.Random(f"42/qa_1/4096/{index}"), 4000, 4096, index)[0]
            text = draft.render(n)[0]
            docs = re.findall(r"Document (\d+):\n(\w+) paragraph (\d+)", text)
            assert [int(d[0]) for d in docs] == list(range(1, n + 1))
            own = "Alpha" if index == 0 else "Beta"
            gold = next(int(d[0]) for d in docs if d[1] == own and d[2] == "0")
            assert gold == order.index(0) + 1  # the same fixed-seed shuffle for every sample
            same_article = sum(d[1] == own for d in docs)
            if index == 0 and n == 8:  # more than the related ones: all of them, then others
                assert same_article == 5
            else:  # a sample of the related ones only
                assert same_article == n
    hotpot = load_hotpotqa(_hotpot(tmp_path))
    assert hotpot.documents == sorted(hotpot.documents)  # RULER sorts the unique documents


def test_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match="unknown RULER task"):
        resolve_tasks("niah_single_9")
    with pytest.raises(RulerError, match="use a longer length"):
        RulerGenerator(ByteTokenizer()).sample("cwe", 1024, 0)
    with pytest.raises(RulerError, match="leaves no room"):
        RulerGenerator(ByteTokenizer()).sample("niah_single_1", 100, 0)
    with pytest.raises(RulerError, match="does not exist"):
        RulerGenerator(ByteTokenizer(), haystack_files=[tmp_path / "none.txt"])
    (tmp_path / "bad.json").write_text("[1, 2")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_hotpotqa(tmp_path / "bad.json")
    runner = CliRunner()
    res = runner.invoke(
        app,
        ["ruler", "generate", "--out", str(tmp_path / "o.jsonl"), "--tokenizer", str(tmp_path / "missing.json")],
        env={"COLUMNS": "300"},
    )
    assert res.exit_code == 2 and "does not exist" in res.output and not (tmp_path / "o.jsonl").exists()
    res = runner.invoke(app, ["ruler", "generate", "--out", str(tmp_path / "o.jsonl"), "--tasks", "nope"])
    assert res.exit_code == 2 and "unknown RULER task" in res.output


def test_generate_command_writes_ruler_fields(tmp_path):
    res = CliRunner().invoke(
        app,
        [
            "ruler",
            "generate",
            "--out",
            str(tmp_path / "s.jsonl"),
            "--tasks",
            "niah_single_1,qa_2",
            "--lengths",
            "2048",
            "--samples",
            "2",
        ],
    )
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for r in rows:
        assert {"index", "input", "outputs", "length", "answer_prefix", "task", "token_count", "haystack"} <= set(r)


class Oracle(HookedModel):
    """Answers every prompt with its references (or nothing), to test the evaluation pipeline."""

    def __init__(self, answers: dict[str, list[str]], silent: bool = False) -> None:
        self.name, self.tokenizer, self.layers, self.max_positions = "oracle", ByteTokenizer(), [], None
        self.prompt_start = []
        self.answers, self.silent = answers, silent
        self.calls, self.batches = 0, []

    def decode(self, prompt_ids, max_new_tokens, stop_ids=None, hook=None):
        self.calls += 1
        text = self.tokenizer.decode(prompt_ids[0].tolist())
        refs = next(v for k, v in self.answers.items() if text.startswith(k))
        return [] if self.silent else self.tokenizer.encode(" " + " ".join(refs))

    def decode_batch(self, prompts, max_new_tokens, stop_ids=None, on_step=None):
        self.batches.append(len(prompts))
        return [self.decode(p, max_new_tokens, stop_ids) for p in prompts]


def test_eval_scores_resume_and_summary(tmp_path, monkeypatch):
    settings = RulerSettings(tasks=["niah_multivalue", "vt", "qa_1"], lengths=[2048, 4096], samples=2)
    gen = RulerGenerator(ByteTokenizer(), settings.seed)
    answers = {s["input"]: s["outputs"] for s in gen.samples(resolve_tasks(settings.tasks), settings.lengths, 2)}
    oracle = Oracle(answers)
    monkeypatch.setattr(evaluate_mod, "load_model", lambda *a, **k: oracle)
    monkeypatch.setattr(evaluate_mod, "decode_batch_size", lambda *a: 2)
    scores = evaluate("oracle", tmp_path, resolve_run(settings))
    assert per_task(scores) == {t: {2048: 100.0, 4096: 100.0} for t in settings.tasks}
    assert per_length(scores) == {2048: 100.0, 4096: 100.0} and overall(scores) == 100.0
    assert oracle.calls == 12
    assert oracle.batches == [2] * 6  # the two samples of each task x length together
    evaluate("oracle", tmp_path, resolve_run(settings))  # everything predicted already
    assert oracle.calls == 12
    silent = Oracle(answers, silent=True)
    monkeypatch.setattr(evaluate_mod, "load_model", lambda *a, **k: silent)
    zero = evaluate("oracle", tmp_path / "silent", resolve_run(settings))
    assert overall(zero) == 0.0 and set(zero[zero.scope == "task"]["score"]) == {0.0}
    saved = read_table(tmp_path / "ruler_scores.parquet")
    vt = saved.frame[(saved.frame.scope == "task") & (saved.frame.task == "vt")]
    assert vt["n"].tolist() == [2, 2] and saved.meta.settings["lengths"] == [2048, 4096]
    samples = read_table(tmp_path / "ruler_samples.parquet").frame  # one row per task x length x sample
    assert len(samples) == 12 and set(samples.score) == {100.0} and samples.outputs.map(len).min() >= 1
    other = RulerSettings(
        tasks=settings.tasks, lengths=settings.lengths, samples=2, seed=7, prompt_format="[{task_template}]"
    )
    with pytest.raises(RulerError, match=r"other settings \(`seed` 42 there, 7 now; `wrapper` .* there, .* now\)"):
        evaluate("oracle", tmp_path, resolve_run(other))  # would mix two runs' predictions


def test_batched_eval_predicts_what_one_at_a_time_does(tmp_path, monkeypatch):
    """Batches of prompts of different token counts (left-padded caches) give each sample's own
    greedy prediction; a float64 toy model keeps near-ties from deciding the comparison."""
    torch.manual_seed(3)
    model = HeadprobeModel(Transformer(preset("toy-k64v16")).double(), ByteTokenizer(), "toy")
    monkeypatch.setattr(evaluate_mod, "load_model", lambda *a, **k: model)
    settings = RulerSettings(tasks=["niah_multikey_3", "qa_1"], lengths=[1024], samples=3)
    run = resolve_run(settings)
    evaluate("toy", tmp_path / "one", run, progress=False, batch_size=1)
    evaluate("toy", tmp_path / "three", run, progress=False, batch_size=3)
    mixed = 0
    for task in settings.tasks:
        one = [
            json.loads(x) for x in (tmp_path / "one" / "predictions" / f"{task}-1024.jsonl").read_text().splitlines()
        ]
        three = (tmp_path / "three" / "predictions" / f"{task}-1024.jsonl").read_text().splitlines()
        mixed += len({r["token_count"] for r in one}) > 1
        assert one == [json.loads(x) for x in three]
    assert mixed  # some batch really mixes prompt lengths


def test_batch_size_is_bounded_by_memory():
    model = HeadprobeModel(Transformer(preset("toy-k64v16")), ByteTokenizer(), "toy")
    per = model.kv_cache_bytes(4096 + 128)
    cfg = model.model.cfg
    full = [cfg.attention(i) for i in range(cfg.n_layers) if cfg.layer_type(i) == "full"]
    sliding = [cfg.attention(i) for i in range(cfg.n_layers) if cfg.layer_type(i) == "sliding"]
    want = sum(4 * a.kv_heads * (a.qk_head_dim + a.v_head_dim) * 4224 for a in full)
    want += sum(4 * a.kv_heads * (a.qk_head_dim + a.v_head_dim) * a.window for a in sliding)
    assert per == want
    est = model.memory(4096).total
    assert evaluate_mod.decode_batch_size(model, 4096, 64 * 2**30) == evaluate_mod.MAX_BATCH
    limit = int((est + 10.5 * per) / 0.9)  # half of what a prefill leaves: 5.25 caches
    assert evaluate_mod.decode_batch_size(model, 4096, limit) == 5
    assert evaluate_mod.decode_batch_size(model, 4096, limit, requested=4) == 4
    with pytest.raises(DoesNotFit, match="`batch_size`"):
        evaluate_mod.decode_batch_size(model, 4096, limit, requested=6)
    with pytest.raises(DoesNotFit, match="shorter `lengths`"):
        evaluate_mod.decode_batch_size(model, 4096, int((est + 0.5 * per) / 0.9))


WRAPPER = "Some users are here.<|user|>\n{task_template}<|end|>\n<|assistant|>\n"


def test_wrapper_surrounds_every_prompt_and_the_cwe_example():
    gen = RulerGenerator(ByteTokenizer(), seed=5, wrapper=Wrapper.parse(WRAPPER), fit="tight", cwe_rule="fit")
    before, after = "Some users are here.<|user|>\n", "<|end|>\n<|assistant|>\n"
    for task in TASKS:
        s = gen.sample(task, 4096, 0)
        assert s["input"].startswith(before) and s["input"].endswith(after), task
        assert 0.95 * s["budget"] <= s["token_count"] <= s["budget"]
        assert s["wrapper"] == WRAPPER and s["prompt_format"] == "custom"
    # vt: the example sits inside the wrapper, before the task (RULER: "after any chat prefix")
    vt = gen.sample("vt", 4096, 0)["input"]
    assert vt.count(before) == 1 and vt.startswith(before + "Memorize and track")
    # cwe: the example goes through the whole template, answer included, then the real prompt
    cwe = gen.sample("cwe", 4096, 0)["input"]
    example, prompt = cwe.split(T.CWE_PREFIX + " 1. ", 1)[0], cwe.split("\n" + before, 1)[1]
    assert example.startswith(before + "Below is a numbered list") and example.endswith(after)
    assert prompt.startswith("Below is a numbered list") and cwe.count(before) == 2
    # the singular rewrite edits the task template, not the wrapper (RULER also rewrites the wrapper)
    single = gen.sample("niah_single_1", 4096, 0)["input"]
    assert single.startswith(before + "A special magic number is hidden")


def test_chat_wrapper_from_a_local_model_and_a_single_bos(tmp_path):
    from transformers import AutoTokenizer

    from headprobe.hooked.base import with_prompt_start
    from headprobe.model.tokenizer import HFTokenizer
    from headprobe.testing import build_toy_hf_model
    from headprobe.text.prompt_format import PLAIN, resolve_wrapper

    folder = build_toy_hf_model("llama", tmp_path / "m", layers=2)
    with pytest.raises(ValueError, match="no chat template"):
        resolve_wrapper("chat", folder)
    assert resolve_wrapper("auto", folder) == PLAIN  # auto: plain where there is no template
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    tok.chat_template = (
        "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    )
    tok.save_pretrained(str(folder))
    wrapper = resolve_wrapper("chat", folder)
    assert wrapper.template == "<s><|user|>\n{task_template}<|end|>\n<|assistant|>\n" and wrapper.is_chat
    assert resolve_wrapper("auto", folder) == wrapper  # auto: the template where there is one
    hf_tok = HFTokenizer(folder)
    ids = hf_tok.encode(wrapper.before + "hello")
    start = list(hf_tok.default_prefix)  # the toy llama tokenizer, like Llama's, adds a BOS by default
    assert start == [hf_tok.bos_id] and ids[0] == hf_tok.bos_id and with_prompt_start(start, ids) == ids
    assert with_prompt_start(start, ids[1:]) == ids
    with pytest.raises(ValueError, match="exactly once"):
        resolve_wrapper("<|user|>{task_template}{task_template}", None)
    with pytest.raises(ValueError, match=r"tokenizer_config\.json"):
        resolve_wrapper("chat", tmp_path)
    assert resolve_wrapper("base", folder) == resolve_wrapper("plain", folder) == PLAIN
    (tmp_path / "w.txt").write_text("[INST] {task_template} [/INST]")
    custom = resolve_wrapper(str(tmp_path / "w.txt"), folder)
    assert (custom.before, custom.after, custom.format) == ("[INST] ", " [/INST]", "custom")
    with pytest.raises(ValueError, match="unknown `prompt_format`"):
        resolve_wrapper("chatty", folder)


def test_generate_command_with_a_wrapper(tmp_path):
    args = ["ruler", "generate", "--out", str(tmp_path / "s.jsonl"), "--tasks", "qa_1", "--lengths", "2048"]
    res = CliRunner().invoke(app, [*args, "--samples", "1", "--prompt-format", "[INST] {task_template} [/INST]"])
    assert res.exit_code == 0, res.output
    row = json.loads((tmp_path / "s.jsonl").read_text())
    assert row["input"].startswith("[INST] Answer the question") and row["input"].endswith(" [/INST]")
    before = (tmp_path / "s.jsonl").read_text()
    res = CliRunner().invoke(app, [*args, "--samples", "1"])  # an existing file is kept without --overwrite
    assert res.exit_code == 2 and "s.jsonl exists (a file); give another --out, or add --overwrite" in res.output
    assert (tmp_path / "s.jsonl").read_text() == before
    res = CliRunner().invoke(app, [*args, "--samples", "1", "--prompt-format", "[INST] no slot", "--overwrite"])
    assert res.exit_code == 2 and "unknown --prompt-format" in res.output and "{task_template}" in res.output
    assert (tmp_path / "s.jsonl").read_text() == before  # refused before anything was written
    res = CliRunner().invoke(app, [*args, "--samples", "1", "--overwrite"])
    assert res.exit_code == 0 and (tmp_path / "s.jsonl").read_text() != before  # plain now, not [INST]


def test_eval_loads_the_model_in_the_requested_dtype(tmp_path, monkeypatch):
    seen = {}

    def fake_load(path, device="cpu", dtype=None, log=None):
        seen["dtype"] = dtype
        raise RulerError("stop here")

    monkeypatch.setattr(evaluate_mod, "load_model", fake_load)
    with pytest.raises(RulerError, match="stop here"):
        evaluate("x", tmp_path, resolve_run(RulerSettings(tasks=["vt"], lengths=[2048], samples=1, dtype="bf16")))
    assert seen["dtype"] is torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        evaluate("x", tmp_path, resolve_run(RulerSettings(tasks=["vt"], dtype="int8")))


def test_eval_several_checkpoints_isolates_failures(tmp_path):
    from headprobe.model.checkpoint import save_checkpoint
    from headprobe.testing import tiny_config

    for name in ("a", "b"):
        torch.manual_seed(ord(name))
        save_checkpoint(Transformer(tiny_config(vocab_size=264)), tmp_path / name)
    args = ["ruler", "eval", str(tmp_path / "a"), str(tmp_path / "missing"), str(tmp_path / "b")]
    opts = [
        "--tasks",
        "niah_single_1,qa_1",
        "--lengths",
        "1024",
        "--samples",
        "2",
        "--out",
        str(tmp_path / "r"),
        "--no-progress",
    ]
    res = CliRunner().invoke(app, [*args, *opts], env={"COLUMNS": "300"})
    assert res.exit_code == 1 and "missing" in res.output and "does not exist" in res.output
    run = json.loads((tmp_path / "r" / "run.json").read_text())
    assert set(run["checkpoints"]) == {"a", "b", "missing"} and set(run["errors"]) == {"missing"}
    grid = collect(tmp_path / "r", "ruler_scores")  # the grid in one table
    assert set(grid.model) == {"a", "b"}
    for name in ("a", "b"):
        own = read_table(tmp_path / "r" / name / "ruler_scores.parquet")
        assert own.meta.checkpoint == str(tmp_path / name) and set(per_task(own.frame)) == {"niah_single_1", "qa_1"}
        assert overall(grid[grid.model == name]) == overall(own.frame)
    assert not (tmp_path / "r" / "missing").exists()
    (tmp_path / "x").mkdir()
    res = CliRunner().invoke(app, ["ruler", "eval", str(tmp_path / "a"), str(tmp_path / "x" / ".." / "a"), *opts])
    assert res.exit_code == 2 and "share a results folder" in res.output
    res = CliRunner().invoke(app, ["ruler", "eval", str(tmp_path / "a"), "--tasks", "niah_single_9"])
    assert res.exit_code == 2 and "niah_single_9" in res.output


def test_vt_example_is_the_most_noise_lines_within_500_tokens():
    """RULER's variable_tracking.py sizes its in-context example by binary search: the most noise lines
    with the example's template and answer prefix within 500 tokens (with the toy BPE: about 12 lines;
    re-counted here at n and n + 1 lines)."""
    from headprobe.text.toy_tokenizer import open_tokenizer

    tok = open_tokenizer("toy")
    text = RulerGenerator(tok, seed=5).sample("vt", 4096, 0)["input"]
    example = text[: text.rindex("Memorize and track")]
    question, answer = example[: example.rindex(" Answer: ")], example[example.rindex(" Answer: ") :]
    answer = answer[: answer.index("they are:") + len("they are: ")]
    one_more = question.replace(SPEC["noise"], SPEC["noise"] + "\n" + SPEC["noise"], 1)
    assert len(tok.encode(question + answer)) <= 500 < len(tok.encode(one_more + answer))
    assert example.count(SPEC["noise"]) >= 8


def test_prediction_files_one_writer_each_read_together(tmp_path):
    from headprobe.evals.ruler.predictions import Predictions

    main, other = Predictions(tmp_path, 0), Predictions(tmp_path, 1)
    main.append("qa_1", 512, [{"index": 2, "pred": "c"}, {"index": 0, "pred": "a"}])
    other.append("qa_1", 512, [{"index": 1, "pred": "b"}])
    other.path("qa_1", 512).open("a").write('{"index": 3, "pr')  # process 1 was stopped mid-line
    assert other.path("qa_1", 512).name == "qa_1-512.p1.jsonl" and main.path("qa_1", 512).name == "qa_1-512.jsonl"
    torn = other.path("qa_1", 512).read_text()
    got = main.done("qa_1", 512)
    assert list(got) == [0, 1, 2] and [r["pred"] for r in got.values()] == ["a", "b", "c"]  # every file, in order
    assert other.path("qa_1", 512).read_text() == torn  # another writer's file is only read, never rewritten
    assert list(other.done("qa_1", 512)) == [0, 1, 2]
    assert other.path("qa_1", 512).read_text() == '{"index": 1, "pred": "b"}\n'  # its own: the torn line dropped
    assert Predictions(tmp_path).done("qa_1", 1024) == {}
