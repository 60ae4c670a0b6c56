"""The teacher-forced retrieval score and the forced mass (headprobe.metrics.retrieval, docs/metrics.md) against
a dense float64 reference, a hand-built induction head whose scores are known exactly, and a random model that
answers no needle yet gets both scores."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from hand_built import GQA_SLIDING, InductionModel, gqa_sliding_model, hand_prompt
from reference import dense_forced, dense_probs

from headprobe.hooked import HeadprobeModel
from headprobe.metrics import retrieval_scores
from headprobe.metrics.retrieval import forced_answer, forced_rows, forced_scores, head_scores
from headprobe.metrics.summaries import retrieval_rows
from headprobe.model.tokenizer import ByteTokenizer
from headprobe.text.needles import CODE_NEEDLES, NEEDLES, NeedlePrompt, needle_prompt

CONFIG = GQA_SLIDING


@pytest.fixture(scope="module")
def tiny() -> HeadprobeModel:
    return gqa_sliding_model()


@pytest.mark.parametrize(("depth", "reach"), [(30.0, 0), (100.0, 0), (30.0, 7), (100.0, 120)])
def test_forced_scores_match_dense_float64_attention(tiny, depth, reach):
    prompt = needle_prompt(tiny.tokenizer, CODE_NEEDLES[0], 300, depth, seed=3)
    scores, steps = forced_scores(tiny, prompt, reach=reach)
    value, set_value, mass = dense_forced(tiny, prompt, reach)
    if reach == 120:  # at depth 100 the question alone follows the needle: the reach stops at the prompt end
        assert prompt.length - prompt.answer_end < 120
    assert steps == len(CODE_NEEDLES[0].answer) == 4
    for (layer, h), expected in mass.items():
        assert scores.forced_mass[layer, h] == pytest.approx(expected, rel=1e-5, abs=1e-7)
        assert scores.value[layer, h] == value[layer, h] and scores.set_value[layer, h] == set_value[layer, h]
    full = [m for (layer, _), m in mass.items() if CONFIG.attention(layer).window is None]
    sliding = [m for (layer, _), m in mass.items() if CONFIG.attention(layer).window is not None]
    assert min(full) > 0  # every full head puts some mass on the span
    assert (max(sliding) > 0) == (depth == 100.0)  # the window reaches the needle only at depth 100


def test_forced_rows_argmax_and_mass_of_any_span_match_dense_float64(tiny):
    # a wide span (most of the prompt), so the argmax often lands inside it and the masses are far from 0 and 1
    prompt = needle_prompt(tiny.tokenizer, CODE_NEEDLES[1], 200, 50.0, seed=1)
    ids, rows, span = prompt.ids, [150, 170, 199], (20, 180)
    argmax, mass = forced_rows(tiny, ids, rows, span)
    _, cache = tiny.model.run_with_cache(torch.tensor([ids]))
    for layer in range(CONFIG.n_layers):
        att = CONFIG.attention(layer)
        q = cache[f"blocks.{layer}.attn.hook_rot_q"].transpose(1, 2)
        k = cache[f"blocks.{layer}.attn.hook_rot_k"].transpose(1, 2)
        p = dense_probs(q, k, att.window, att.qk_head_dim**-0.5)[0]
        for i, row in enumerate(rows):
            assert argmax[i, layer, : att.n_heads].tolist() == p[:, row].argmax(-1).tolist()
            expected = p[:, row, span[0] : span[1]].sum(-1)
            assert mass[i, layer, : att.n_heads] == pytest.approx(expected.numpy(), rel=1e-5, abs=1e-7)
        assert (argmax[:, layer, att.n_heads :] == -1).all()  # a layer with fewer heads than the widest


def test_a_hand_built_induction_head_scores_exactly_one_and_a_uniform_head_its_share_of_the_keys():
    prompt = hand_prompt()
    assert forced_answer(ByteTokenizer(), prompt) == ([ord(c) for c in "4729"], [0, 1, 2, 3])
    scores, steps = forced_scores(InductionModel(), prompt)
    assert steps == 4
    # full layer: the induction head lands on 3, 4, 5, 6, each holding the token being forced
    assert scores.value[0, 0] == 1.0 and scores.set_value[0, 0] == 1.0
    assert scores.forced_mass[0, 0] == pytest.approx(1.0, abs=1e-12)  # e^-50 elsewhere
    # the uniform head: argmax on key 0 (first of equal scores), outside the span; mass 4 / (row + 1)
    assert scores.value[0, 1] == 0.0 and scores.set_value[0, 1] == 0.0
    assert scores.forced_mass[0, 1] == pytest.approx((4 / 11 + 4 / 12 + 4 / 13 + 4 / 14) / 4, abs=1e-12)
    # sliding layer, window 6: rows 10..13 see keys 5..10, 6..11, 7..12, 8..13, i.e. 2, 1, 0, 0 span keys; the
    # induction head finds no earlier occurrence inside its window, so it spreads evenly like the uniform head.
    # Its argmax (key 5 '2', 6 '9', then 7 and 8 outside the span) never holds the token being forced
    for h in (0, 1):
        assert scores.value[1, h] == 0.0
        assert scores.forced_mass[1, h] == pytest.approx((2 / 6 + 1 / 6 + 0 + 0) / 4, abs=1e-12)


def test_the_needle_reach_adds_the_keys_after_the_span_to_the_mass_alone():
    """Keys 3-6 hold the answer; a reach of 2 makes the mass count keys 3-8, a reach of 100 keys 3-10 (the prompt
    ends at 11: the forced answer's own tokens never count). Worked by hand from the uniform heads' 1 / (keys
    seen); the copy scores are Wu's rule on the span alone, unchanged."""
    prompt, model = hand_prompt(), InductionModel()
    for reach, keys in ((0, 4), (2, 6), (100, 8)):
        scores, _ = forced_scores(model, prompt, reach=reach)
        assert scores.value[0, 0] == 1.0 and scores.set_value[0, 0] == 1.0 and scores.value[0, 1] == 0.0
        assert scores.forced_mass[0, 0] == pytest.approx(1.0, abs=1e-12)  # the induction head: all on the span
        expected = sum(keys / (row + 1) for row in (10, 11, 12, 13)) / 4
        assert scores.forced_mass[0, 1] == pytest.approx(expected, abs=1e-12)
    # sliding layer, window 6, reach 2 (keys 3-8): rows 10..13 see keys 5..10, 6..11, 7..12, 8..13: 4, 3, 2, 1 of them
    scores, _ = forced_scores(model, prompt, reach=2)
    for h in (0, 1):
        assert scores.forced_mass[1, h] == pytest.approx((4 + 3 + 2 + 1) / 6 / 4, abs=1e-12)


def test_needle_reading_heads_are_those_with_a_forced_mass_of_at_least_a_tenth():
    heads = pd.DataFrame({"layer": [0, 0, 1, 1, 1], "head": [0, 1, 0, 1, 2], "length": 512,
                          "layer_type": ["sliding", "sliding", "full", "full", "full"],
                          "value": 0.0, "n_kept": 1, "n_samples": 1, "forced_value": 0.0,
                          "forced_mass": [0.3, 0.0999, 0.1, 0.05, 0.7]})  # fmt: skip
    rows = pd.DataFrame(retrieval_rows(heads), columns=["length", "layer_type", "layer", "s", "v"])
    stats = rows.set_index(["layer_type", "s"])["v"]
    assert stats["all", "reading_heads"] == 3 and stats["all", "reading_fraction"] == pytest.approx(3 / 5)
    assert stats["full", "reading_heads"] == 2 and stats["full", "reading_fraction"] == pytest.approx(2 / 3)
    assert stats["sliding", "reading_heads"] == 1 and stats["full", "forced_retrieval_heads"] == 0


def test_the_forced_answer_follows_the_prompt_as_the_model_would_read_it():
    tok = ByteTokenizer()
    for needle in (CODE_NEEDLES[2], NEEDLES[0]):  # "... is" + " 4471"; "...\nAnswer:" + " eat saffron ..."
        prompt = needle_prompt(tok, needle, 250, 40.0)
        tokens, steps = forced_answer(tok, prompt)
        assert tokens == list((" " + needle.answer).encode())  # behind a space, which is forced but not scored
        assert steps == list(range(1, len(needle.answer) + 1))
        assert [tokens[i] for i in steps] == prompt.ids[prompt.answer_start : prompt.answer_end]
    bare = NeedlePrompt(hand_prompt().ids, 3, 7, hand_prompt().needle, 50.0, "hand")  # no text: the span's tokens
    assert forced_answer(tok, bare) == ([ord(c) for c in "4729"], [0, 1, 2, 3])


def test_a_model_that_answers_no_needle_still_gets_finite_forced_scores(tiny):
    scores = retrieval_scores(tiny, needles=CODE_NEEDLES[:2], lengths=[200], depths=[20.0, 100.0], max_new_tokens=8)
    heads, samples = scores.heads, scores.samples
    assert not samples["kept"].any() and (heads["n_kept"] == 0).all() and heads["value"].isna().all()
    assert (samples["answer_steps"] == 4).all()
    for column in ("forced_value", "forced_set_value", "forced_mass"):
        assert heads[column].between(0, 1).all()  # finite, and a share
    # the head table's forced columns are the copies' means over every sample (none was kept)
    means = scores.copies.groupby(["layer", "head"])[["forced_value", "forced_mass"]].mean()
    got = heads.set_index(["layer", "head"])[["forced_value", "forced_mass"]]
    pd.testing.assert_frame_equal(got, means, check_exact=False, rtol=1e-12)
    # the summary: Wu's count is 0 of every head (no score), the teacher-forced statistics are there
    rows = pd.DataFrame(retrieval_rows(heads.assign(length=200)), columns=["length", "layer_type", "layer", "s", "v"])
    stats = rows.set_index(["layer_type", "s"])["v"]
    assert stats["all", "retrieval_heads"] == 0 and math.isnan(stats["all", "mean_score"])
    hits = int((heads["forced_value"] >= 0.1).sum())
    assert stats["all", "forced_retrieval_heads"] == hits and stats["all", "forced_fraction"] == hits / len(heads)
    full = heads[heads["layer_type"] == "full"]
    assert stats["full", "forced_mass"] == pytest.approx(full["forced_mass"].mean())
    assert stats["full", "forced_mass"] > 0


def test_head_scores_average_the_forced_scores_over_every_sample_kept_or_not():
    copies = pd.DataFrame(
        {"layer": [0, 0] * 3, "head": [0, 1] * 3, "layer_type": ["full"] * 6, "sample": [0, 0, 1, 1, 2, 2],
         "value": [0.5, 0.0, 1.0, 1.0, 0.25, 0.1], "set_value": [0.25, 0.0, 1.0, 1.0, 0.25, 0.1],
         "forced_value": [1.0, 0.0, 0.5, 0.25, 0.0, 0.5], "forced_set_value": [0.5, 0.0, 0.5, 0.25, 0.0, 0.5],
         "forced_mass": [0.9, 0.1, 0.6, 0.2, 0.3, 0.0]}
    )  # fmt: skip
    samples = pd.DataFrame({"sample": [0, 1, 2], "kept": [True, False, False]})
    heads = head_scores(copies, samples)
    assert heads["value"].tolist() == pytest.approx([0.5, 0.0])  # the one kept sample
    assert heads["forced_value"].tolist() == pytest.approx([1.5 / 3, 0.75 / 3])  # all three
    assert heads["forced_set_value"].tolist() == pytest.approx([1.0 / 3, 0.75 / 3])
    assert heads["forced_mass"].tolist() == pytest.approx([1.8 / 3, 0.3 / 3])
    none = head_scores(copies, samples.assign(kept=False))
    assert none["value"].isna().all() and none["forced_value"].tolist() == heads["forced_value"].tolist()
