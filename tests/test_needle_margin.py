"""The needle margin (headprobe.metrics.margin, docs/mechanisms.md): each head's best needle logit over the best
other key's, its mass and rank at the teacher-forced answer steps, against dense float64 logits of a small model
(grouped-query and sliding layers), a hand-built induction head and uniform head whose numbers are worked by
hand, and ``analyze --metrics needle_margin`` end to end (resumable, bad input refused before work)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from hand_built import GQA_SLIDING, InductionModel, gqa_sliding_model, hand_prompt
from reference import visible
from typer.testing import CliRunner

from headprobe.cli import app
from headprobe.hooked import HeadprobeModel
from headprobe.metrics.margin import margin_rows, margin_sample, margin_summary
from headprobe.model.checkpoint import save_checkpoint
from headprobe.model.transformer import Transformer
from headprobe.results import read_table
from headprobe.show import show_tables
from headprobe.testing import tiny_config
from headprobe.text.needles import CODE_NEEDLES, needle_prompt

CONFIG = GQA_SLIDING


@pytest.fixture(scope="module")
def tiny() -> HeadprobeModel:
    return gqa_sliding_model()


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def dense_margin(model: HeadprobeModel, prompt, reach: int) -> dict[tuple[int, int], dict[str, float]]:
    """Per (layer, head), from the definitions one key at a time: the full float64 logit matrix of the
    post-RoPE q/k TransformerLens caches (not the seam's hook), then at each answer row the best needle key's
    logit minus the best other visible key's, the softmax mass on the needle, and the needle's place among the
    keys by sorting (ties half). Byte-level: the answer is forced behind a space, its steps the answer's bytes."""
    answer = list(prompt.needle.answer.encode())
    ids = [*prompt.ids, ord(" "), *answer[:-1]]
    rows = [prompt.length + t for t in range(len(answer))]
    needle = range(prompt.answer_start, min(prompt.answer_end + reach, prompt.length))
    _, cache = model.model.run_with_cache(torch.tensor([ids]))
    out = {}
    for layer in range(CONFIG.n_layers):
        att = CONFIG.attention(layer)
        q = cache[f"blocks.{layer}.attn.hook_rot_q"].transpose(1, 2)[0].double()
        k = cache[f"blocks.{layer}.attn.hook_rot_k"].transpose(1, 2)[0].double()
        k = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0)
        seen = visible(len(ids), len(ids), att.window)
        for h in range(att.n_heads):
            s = (q[h] @ k[h].T) * att.qk_head_dim**-0.5
            margins, masses, ranks = [], [], []
            for row in rows:
                keys = [j for j in range(len(ids)) if seen[row, j]]
                mine = [float(s[row, j]) for j in keys if j in needle]
                others = [float(s[row, j]) for j in keys if j not in needle]
                z = sum(math.exp(float(s[row, j])) for j in keys)
                masses.append(sum(math.exp(v) for v in mine) / z)
                if mine:
                    best = max(mine)
                    margins.append(best - max(others))
                    ranks.append(1 + sum(v > best for v in others) + 0.5 * sum(v == best for v in others))
            out[layer, h] = {"margin": mean(margins), "mass": mean(masses), "rank": mean(ranks),
                             "seen": len(margins) / len(rows)}  # fmt: skip
    return out


@pytest.mark.parametrize(("depth", "reach"), [(30.0, 0), (100.0, 0), (100.0, 7)])
def test_margin_mass_and_rank_match_dense_float64_logits(tiny, depth, reach):
    prompt = needle_prompt(tiny.tokenizer, CODE_NEEDLES[0], 300, depth, seed=3)
    frame = margin_sample(tiny, prompt, 5, reach=reach)
    expected = dense_margin(tiny, prompt, reach)
    assert len(frame) == len(expected) and set(frame["sample"]) == {5} and set(frame["answer_steps"]) == {4}
    for r in frame.itertuples():
        want = expected[r.layer, r.head]
        assert r.mass == pytest.approx(want["mass"], rel=1e-9, abs=1e-12)
        assert r.seen == want["seen"]
        for name in ("margin", "rank"):
            got = getattr(r, name)
            assert (math.isnan(got) and math.isnan(want[name])) or got == pytest.approx(want[name], rel=1e-9, abs=1e-9)
    sliding = frame[frame.layer_type == "sliding"]
    # the window of 128 reaches the needle only when it sits at the end (depth 100): else no margin, mass 0
    assert (sliding["seen"] > 0).all() == (depth == 100.0) and (sliding["seen"] == 0).all() == (depth != 100.0)
    if depth != 100.0:
        assert sliding["margin"].isna().all() and sliding["rank"].isna().all() and (sliding["mass"] == 0).all()
    full = frame[frame.layer_type == "full"]
    assert (full["seen"] == 1).all() and full["margin"].notna().all() and (full["rank"] >= 1).all()


def test_a_hand_built_induction_head_keeps_a_margin_of_50_nats_and_a_uniform_head_ties_everywhere():
    """Rows 10-13 of ``"pq 4729.rs "`` + ``"472"`` (the forced answer ``4729``; span keys 3-6). The induction
    head's logit is 50 on the one span key after the row's token and 0 elsewhere; the uniform head's is 0 for
    every key, so its needle key ties with every other visible key: rank 1 + (other keys) / 2."""
    frame = margin_sample(InductionModel(), hand_prompt(), 0).set_index(["layer", "head"])
    full_induction, full_uniform = frame.loc[(0, 0)], frame.loc[(0, 1)]
    assert full_induction.margin == 50.0 and full_induction["rank"] == 1.0 and full_induction.seen == 1.0
    assert full_induction.mass == pytest.approx(1.0, abs=1e-12)
    # row r sees keys 0..r: 4 on the needle, r - 3 others (7, 8, 9, 10): ranks 4.5, 5, 5.5, 6
    assert full_uniform.margin == 0.0 and full_uniform["rank"] == pytest.approx(5.25, abs=1e-12)
    assert full_uniform.mass == pytest.approx((4 / 11 + 4 / 12 + 4 / 13 + 4 / 14) / 4, abs=1e-12)
    # the sliding layer (window 6): rows 10 and 11 see span keys 5-6 and 6 (no induction match inside the
    # window, so every logit is 0), rows 12 and 13 none: seen 1/2; ranks 1 + 4/2 and 1 + 5/2
    for h in (0, 1):
        row = frame.loc[(1, h)]
        assert row.seen == 0.5 and row.margin == 0.0 and row["rank"] == pytest.approx(3.25, abs=1e-12)
        assert row.mass == pytest.approx((2 / 6 + 1 / 6) / 4, abs=1e-12)
    # a reach of 2 makes keys 3-8 the needle: the uniform head's other keys are 5, 6, 7, 8 (ranks 3.5 .. 5)
    reached = margin_sample(InductionModel(), hand_prompt(), 0, reach=2).set_index(["layer", "head"])
    assert reached.loc[(0, 0)].margin == 50.0 and reached.loc[(0, 1)]["rank"] == pytest.approx(4.25, abs=1e-12)


def test_a_needle_the_head_looks_past_has_a_negative_margin_and_a_rank_behind_the_winner():
    """Row 11 (token ``4``) of the hand-built model, the "needle" keys 0-1 (``pq``): the induction head's 50 lands
    on key 4, outside; keys 0-1 score 0, as do the other 9 visible keys: margin -50, rank 1 + 1 + 9/2."""
    ids = list(b"pq 4729.rs 4")
    margin, mass, rank = margin_rows(InductionModel(), ids, [11], (0, 2))
    assert margin[0, 0, 0] == -50.0 and rank[0, 0, 0] == 6.5 and mass[0, 0, 0] == pytest.approx(0.0, abs=1e-20)
    assert margin[0, 0, 1] == 0.0 and rank[0, 0, 1] == 1 + 10 / 2 and mass[0, 0, 1] == pytest.approx(2 / 12)


def test_the_summary_names_the_head_with_the_most_mass_and_its_margin():
    frame = pd.DataFrame({"length": 512, "layer": [0, 0, 1, 1], "head": [0, 1, 0, 1],
                          "layer_type": ["sliding", "sliding", "full", "full"], "sample": 0,
                          "margin": [math.nan, -2.0, 1.5, -4.0], "mass": [0.0, 0.1, 0.6, 0.02],
                          "rank": [math.nan, 3.0, 1.0, 40.0], "seen": [0.0, 1.0, 1.0, 1.0]})  # fmt: skip
    stats = pd.DataFrame(margin_summary(frame), columns=["length", "layer_type", "layer", "s", "v"])
    v = stats.set_index(["layer_type", "s"])["v"]
    assert v["all", "top_layer"] == 1 and v["all", "top_head"] == 0 and v["all", "top_margin"] == 1.5
    assert v["all", "top_rank"] == 1.0 and v["all", "max_mass"] == 0.6
    assert v["all", "mean_mass"] == pytest.approx(0.18) and v["all", "mean_margin"] == pytest.approx(-1.5)
    assert v["sliding", "mean_margin"] == -2.0 and v["full", "mean_mass"] == pytest.approx(0.31)


def test_analyze_writes_the_needle_margin_table_resumes_it_and_refuses_a_needle_longer_than_the_context(tmp_path):
    torch.manual_seed(0)
    ckpt = save_checkpoint(Transformer(tiny_config(vocab_size=264, max_seq_len=512)), tmp_path / "tiny")
    args = ["analyze", str(ckpt), "--metrics", "needle_margin", "--lengths", "200,300", "--samples", "2",
            "--needles", "codes", "--needle-reach", "3", "--no-progress"]  # fmt: skip
    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "a")], env={"COLUMNS": "300"})
    assert res.exit_code == 0, res.output
    table = read_table(tmp_path / "a" / "tiny" / "needle_margin.parquet").frame
    heads = len(table.drop_duplicates(["layer", "head"]))
    assert (table.groupby(["length", "sample"]).size() == heads).all() and heads > 4
    assert sorted(set(table["length"])) == [200, 300] and sorted(set(table["sample"])) == [0, 1]
    assert set(table["model"]) == {"tiny"} and table["mass"].between(0, 1).all() and (table["answer_steps"] == 4).all()
    assert "needle_margin L=    200" in res.output and "the top head" in res.output
    again = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "a")], env={"COLUMNS": "300"})
    assert again.exit_code == 0 and "done earlier" in again.output
    assert read_table(tmp_path / "a" / "tiny" / "needle_margin.parquet").frame.equals(table)
    shown = show_tables(tmp_path / "a", ["needle_margin"], top=2)[0].frame
    means = table.groupby(["layer", "head", "length"])[["mass", "margin"]].mean()
    first = means["mass"].groupby(["layer", "head"]).mean().sort_values(ascending=False).index[:2]
    assert [(m, la, h) for m, la, h, _ in shown.index] == [("tiny", la, h) for la, h in first]
    assert list(shown.columns) == ["mass@200", "margin@200", "mass@300", "margin@300"]
    layer, head = first[0]
    assert shown.iloc[0]["margin@300"] == pytest.approx(means.loc[(layer, head, 300), "margin"], abs=1e-3)
    short = CliRunner().invoke(app, [*args[:5], "64", *args[6:], "--out", str(tmp_path / "b")], env={"COLUMNS": "300"})
    assert short.exit_code == 2 and "too short for the needle" in short.output and not (tmp_path / "b").exists()
