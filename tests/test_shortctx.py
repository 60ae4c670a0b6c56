"""Multiple-choice scoring against hand-computed log-likelihoods; loaders on hand-written files."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from headprobe.cli import app
from headprobe.evals.shortctx import (
    HeadprobeLM,
    Item,
    ShortCtxError,
    builtin_items,
    evaluate_items,
    load_task,
    loglikelihood,
)
from headprobe.hooked import HookedModel
from headprobe.model.tokenizer import ByteTokenizer
from headprobe.results import read_table


class BigramModel(HookedModel):
    """Logits depend only on the previous byte: row ``t`` of a fixed table. So log p(next | prev) is
    ``log_softmax(table[prev])[next]``, computable by hand."""

    def __init__(self) -> None:
        self.name, self.tokenizer, self.layers, self.max_positions = "bigram", ByteTokenizer(), [], None
        self.prompt_start = []
        self.device = torch.device("cpu")
        g = torch.Generator().manual_seed(0)
        self.table = torch.randn(264, 264, generator=g, dtype=torch.float64)

    def logits(self, input_ids):
        return self.table[input_ids]


def hand_logprob(model: BigramModel, text: str, start: int) -> float:
    """Sum of log p(byte i | byte i-1) for i >= start, from the table directly."""
    b = list(text.encode())
    total = 0.0
    for i in range(start, len(b)):
        row = model.table[b[i - 1]]
        total += float(row[b[i]] - torch.logsumexp(row, 0))
    return total


def test_loglikelihood_hand_computed():
    m = BigramModel()
    ll, greedy = loglikelihood(m, "The cat", " sat")
    assert ll == pytest.approx(hand_logprob(m, "The cat sat", len("The cat")), abs=1e-12)
    expect_greedy = all(int(m.table[a].argmax()) == b for a, b in zip(b"t sa", b" sat", strict=True))
    assert greedy == expect_greedy


def test_acc_and_length_normalised_acc():
    m = BigramModel()
    ctx = "Q:"
    choices = [" ab", " abcdefgh"]
    lls = [hand_logprob(m, ctx + c, len(ctx)) for c in choices]
    item = Item(tuple((ctx, c) for c in choices), label=0)
    result = evaluate_items(m, [item])
    pred = max(range(2), key=lambda i: lls[i])
    pred_norm = max(range(2), key=lambda i: lls[i] / len(choices[i]))
    assert result["items"][0]["pred"] == pred and result["items"][0]["pred_norm"] == pred_norm
    assert result["acc"] == float(pred == 0) and result["acc_norm"] == float(pred_norm == 0)
    assert result["items"][0]["loglikelihoods"] == pytest.approx(lls)


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_original_format_loaders(tmp_path):
    arc = write(
        tmp_path / "arc.jsonl",
        [
            {
                "id": "x",
                "question": {
                    "stem": "Sky colour?",
                    "choices": [{"text": "blue", "label": "A"}, {"text": "red", "label": "B"}],
                },
                "answerKey": "A",
            }
        ],
    )
    items = load_task("arc", arc)
    assert items == [Item((("Question: Sky colour?\nAnswer:", " blue"), ("Question: Sky colour?\nAnswer:", " red")), 0)]
    obqa = load_task(
        "openbookqa",
        write(
            tmp_path / "obqa.jsonl",
            [
                {
                    "question": {
                        "stem": "Heat makes ice",
                        "choices": [{"text": "melt", "label": "A"}, {"text": "grow", "label": "B"}],
                    },
                    "answerKey": "A",
                }
            ],
        ),
    )
    assert obqa[0].pairs[0] == ("Heat makes ice", " melt")
    csqa = load_task(
        "commonsenseqa",
        write(
            tmp_path / "cs.jsonl",
            [
                {
                    "answerKey": "B",
                    "question": {
                        "stem": "Where do fish live?",
                        "choices": [{"label": "A", "text": "desk"}, {"label": "B", "text": "sea"}],
                    },
                }
            ],
        ),
    )
    assert csqa[0].label == 1
    hs = load_task(
        "hellaswag",
        write(
            tmp_path / "hs.jsonl",
            [
                {
                    "activity_label": "Cooking",
                    "ctx_a": "A man cuts onions.",
                    "ctx_b": "he",
                    "endings": ["fries them [title] well.", "sleeps."],
                    "label": 0,
                }
            ],
        ),
    )
    assert hs[0].pairs[0] == ("Cooking: A man cuts onions. He", " fries them. well.")
    wg = load_task(
        "winogrande",
        write(
            tmp_path / "wg.jsonl",
            [{"sentence": "Ann gave Bo a book because _ was kind.", "option1": "Ann", "option2": "Bo", "answer": "1"}],
        ),
    )
    assert wg[0].pairs == (
        ("Ann gave Bo a book because Ann", " was kind."),
        ("Ann gave Bo a book because Bo", " was kind."),
    )
    assert wg[0].label == 0
    write(tmp_path / "valid.jsonl", [{"goal": "Open a jar", "sol1": "twist the lid", "sol2": "eat the lid"}])
    (tmp_path / "valid-labels.lst").write_text("0\n")
    piqa = load_task("piqa", tmp_path / "valid.jsonl")
    assert piqa[0].pairs[1] == ("Question: Open a jar\nAnswer:", " eat the lid") and piqa[0].label == 0
    race_dir = tmp_path / "race"
    race_dir.mkdir()
    (race_dir / "1.txt").write_text(
        json.dumps(
            {
                "article": "Tom runs.",
                "questions": ["Who runs?"],
                "options": [["Tom", "Ann", "Bo", "Cy"]],
                "answers": ["A"],
            }
        )
    )
    race = load_task("race", race_dir)
    assert race[0].pairs[0] == ("Article: Tom runs.\n\nQuestion: Who runs?\nAnswer:", " Tom") and race[0].label == 0
    mine = load_task(
        "jsonl", write(tmp_path / "mine.jsonl", [{"context": "2+2=", "choices": [" 4", " 5"], "label": 0}])
    )
    assert mine[0].pairs == (("2+2=", " 4"), ("2+2=", " 5"))


def test_loader_errors(tmp_path):
    with pytest.raises(ShortCtxError, match="does not exist"):
        load_task("arc", tmp_path / "none.jsonl")
    with pytest.raises(ShortCtxError, match="lacks the field"):
        load_task("hellaswag", write(tmp_path / "x.jsonl", [{"context": "a", "choices": ["b"], "label": 0}]))
    with pytest.raises(ShortCtxError, match=r"unknown `task` .mmlu."):
        load_task("mmlu", tmp_path / "x.jsonl")
    with pytest.raises(ShortCtxError, match="not an index"):
        load_task("jsonl", write(tmp_path / "y.jsonl", [{"context": "a", "choices": ["b"], "label": 3}]))


def test_builtin_items_are_answerable_from_their_context():
    for item in builtin_items(30):
        ctx, right = item.pairs[item.label]
        value = right.strip()
        if ctx.startswith("The special code"):
            assert f" is {value}." in ctx
        elif ctx.startswith("Numbers:"):
            seq = [int(x) for x in ctx.split(":")[1].strip(" ,").split(",")]
            assert int(value) == seq[-1] + (seq[1] - seq[0])
        else:
            assert ctx.endswith(f"{value} {value} {value}")
        assert len({c for _, c in item.pairs}) == 4


def test_lm_eval_adapter():
    from lm_eval.api.instance import Instance

    m = BigramModel()
    lm = HeadprobeLM(model=m)
    reqs = [Instance("loglikelihood", {}, ("The cat", " sat"), 0), Instance("loglikelihood", {}, ("A", "B"), 1)]
    assert [r[0] for r in lm.loglikelihood(reqs)] == pytest.approx(
        [hand_logprob(m, "The cat sat", 7), hand_logprob(m, "AB", 1)]
    )
    rolling = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, ("hello",), 0)])
    eos_first = float(m.table[257][ord("h")] - torch.logsumexp(m.table[257], 0))
    assert rolling[0] == pytest.approx(eos_first + hand_logprob(m, "hello", 1))
    assert math.isfinite(rolling[0])


class Echo(HookedModel):
    """Answers each prompt with the prompt in capitals, then '\nno'; records the batches it was given."""

    def __init__(self) -> None:
        self.name, self.tokenizer, self.layers, self.max_positions = "echo", ByteTokenizer(), [], None
        self.prompt_start = []
        self.device = torch.device("cpu")
        self.batches: list[int] = []

    def decode(self, prompt_ids, max_new_tokens, stop_ids=None, hook=None):
        text = self.tokenizer.decode(prompt_ids[0].tolist()).upper() + "\nno"
        return self.tokenizer.encode(text)[:max_new_tokens]

    def decode_batch(self, prompts, max_new_tokens, stop_ids=None, on_step=None):
        self.batches.append(len(prompts))
        return [self.decode(p, max_new_tokens, stop_ids) for p in prompts]


def test_generate_until_cuts_at_stop_strings_and_batches_by_budget():
    from lm_eval.api.instance import Instance

    echo = Echo()
    lm = HeadprobeLM(model=echo, batch_size=8)
    reqs = [
        Instance("generate_until", {}, ("ab", {"until": ["\n"], "max_gen_toks": 10}), 0),
        Instance("generate_until", {}, ("cdcd", {"until": ["\n"], "max_gen_toks": 3}), 1),
        Instance("generate_until", {}, ("ef", {"until": "F", "max_gen_toks": 10}), 2),
    ]
    assert lm.generate_until(reqs) == ["AB", "CDC", "E"]
    assert echo.batches == [2, 1]  # the two 10-token requests together, in request order


def test_shortctx_cli(tmp_path):
    from headprobe.model.checkpoint import save_checkpoint
    from headprobe.model.transformer import Transformer
    from headprobe.testing import tiny_config

    save_checkpoint(Transformer(tiny_config(vocab_size=264)), tmp_path / "ck")
    runner = CliRunner()
    res = runner.invoke(app, ["shortctx", "eval", str(tmp_path / "ck"), "--limit", "6", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    scores = read_table(tmp_path / "r" / "ck" / "shortctx_scores.parquet").frame.set_index("metric")
    items = read_table(tmp_path / "r" / "ck" / "shortctx_items.parquet").frame
    assert scores.loc["acc", "n"] == 6 and len(items) == 6 and 0 <= scores.loc["acc", "value"] <= 1
    assert scores.loc["acc", "value"] == pytest.approx((items.pred == items.label).mean())  # derived from the items
    assert scores.loc["acc_norm", "value"] == pytest.approx((items.pred_norm == items.label).mean())
    res = runner.invoke(app, ["shortctx", "eval", str(tmp_path / "ck"), "--task", "arc"], env={"COLUMNS": "300"})
    assert res.exit_code == 2 and "needs --file" in res.output


def test_shortctx_cli_dtype(tmp_path):
    from headprobe.model.checkpoint import save_checkpoint
    from headprobe.model.transformer import Transformer
    from headprobe.testing import tiny_config

    save_checkpoint(Transformer(tiny_config(vocab_size=264)), tmp_path / "ck")
    runner = CliRunner()
    results = {}
    for dtype in ("float32", "float64"):
        out = tmp_path / dtype
        args = ["shortctx", "eval", str(tmp_path / "ck"), "--limit", "9", "--dtype", dtype, "--out", str(out)]
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
        results[dtype] = read_table(out / "ck" / "shortctx_scores.parquet")
    assert results["float64"].meta.settings["dtype"] == "float64"
    acc = {d: r.frame.set_index("metric").loc["acc", "value"] for d, r in results.items()}
    assert acc["float64"] == acc["float32"]  # same weights, more precise sums
    res = runner.invoke(app, ["shortctx", "eval", str(tmp_path / "ck"), "--dtype", "fp8"], env={"COLUMNS": "300"})
    assert res.exit_code == 2 and "unknown dtype 'fp8'" in res.output


def test_batched_loglikelihoods_equal_one_at_a_time():
    """Right-padded batches of different lengths score each pair as it scores alone (a real causal
    model in float64), and the batch-size and logit-budget limits are respected."""
    from headprobe.evals.shortctx import loglikelihoods
    from headprobe.hooked import HeadprobeModel
    from headprobe.model.transformer import Transformer
    from headprobe.testing import tiny_config

    torch.manual_seed(0)
    model = HeadprobeModel(Transformer(tiny_config(vocab_size=264)).double(), ByteTokenizer(), "tiny")
    pairs = [("The cat", " sat"), ("A much longer context than the others here", " yes"), ("", "x"), ("Q", " 42!")]
    alone = [loglikelihood(model, c, x) for c, x in pairs]
    shapes = []
    real = model.logits
    model.logits = lambda ids: shapes.append(tuple(ids.shape)) or real(ids)
    batched = loglikelihoods(model, pairs, batch_size=3)
    for (a, ga), (b, gb) in zip(alone, batched, strict=True):
        assert b == pytest.approx(a, abs=1e-9) and ga == gb
    assert [s[0] for s in shapes] == [1, 3]  # the first (longest) alone measures the vocabulary
    assert shapes[1][1] == max(len(c.encode()) + len(x.encode()) for c, x in pairs[:1] + pairs[2:])
