"""The retrieval-head definitions (headprobe.metrics.definitions, docs/metrics.md): each against a dense float64
implementation written here from its paper's words (full attention matrices from the post-RoPE queries and keys
TransformerLens caches, values, the output projection and the unembedding), and on hand-built heads whose scores are
worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from hand_built import GQA_SLIDING, InductionModel, ValueInductionModel, gqa_sliding_model, hand_prompt
from reference import dense_forced, dense_probs, visible

from headprobe.hooked import HeadprobeModel
from headprobe.metrics import METRICS, DecodeOptions
from headprobe.metrics.definitions import head_table
from headprobe.metrics.headkv import needle_mass
from headprobe.metrics.locos import logit_contrib
from headprobe.metrics.probe import score_sample
from headprobe.metrics.qrhead import query_focus
from headprobe.metrics.razor import copy_attention, razor, repeated_ids
from headprobe.text.needles import ANSWER_PREFIX, CODE_NEEDLES, NEEDLES, Needle, NeedlePrompt, needle_prompt

CONFIG = GQA_SLIDING


@pytest.fixture(scope="module")
def tiny() -> HeadprobeModel:
    return gqa_sliding_model()


def dense_layers(model: HeadprobeModel, ids: list[int]) -> list[dict]:
    """Per layer, from the TransformerLens cache: ``p [heads, L, L]`` (float64, dense), ``v [heads, L, v_dim]`` (each
    query head's values), ``w_o [d_model, heads * v_dim]``, ``window``."""
    _, cache = model.model.run_with_cache(torch.tensor([ids]))
    out = []
    for layer in range(CONFIG.n_layers):
        att = CONFIG.attention(layer)
        q = cache[f"blocks.{layer}.attn.hook_rot_q"].transpose(1, 2).double()
        k = cache[f"blocks.{layer}.attn.hook_rot_k"].transpose(1, 2).double()
        v = cache[f"blocks.{layer}.attn.hook_v"].transpose(1, 2)[0].double()
        groups = att.n_heads // att.kv_heads
        out.append({"p": dense_probs(q, k, att.window, att.qk_head_dim**-0.5)[0],
                    "v": v.repeat_interleave(groups, 0), "window": att.window,
                    "w_o": model.model.blocks[layer].attn.o_proj.weight.double()})  # fmt: skip
    return out


def forced(prompt: NeedlePrompt) -> tuple[list[int], list[int], list[int]]:
    """Byte-level: the prompt ends in a non-space, so the answer is forced behind a space; its steps are the answer's
    bytes, produced at the rows of the space and the answer's bytes but the last."""
    answer = list(prompt.needle.answer.encode())
    return [*prompt.ids, ord(" "), *answer[:-1]], [prompt.length + t for t in range(len(answer))], answer


def grid(frame: pd.DataFrame) -> dict[tuple[int, int], float]:
    return {(r.layer, r.head): r.value for r in frame.itertuples()}


def frame_of(name: str, model, prompt, reach: int = 0, seed: int = 0, sample: int = 0) -> pd.DataFrame:
    return METRICS[name].decode(model, prompt, sample, DecodeOptions(needle_reach=reach, seed=seed))[f"{name}_samples"]


@pytest.mark.parametrize(("depth", "reach"), [(30.0, 0), (100.0, 0), (100.0, 7)])
def test_needle_mass_matches_a_dense_float64_top_k_mass(tiny, depth, reach):
    prompt = needle_prompt(tiny.tokenizer, CODE_NEEDLES[0], 300, depth, seed=3)
    ids, rows, _ = forced(prompt)
    needle = range(prompt.answer_start, min(prompt.answer_end + reach, prompt.length))
    got = grid(frame_of("needle_mass", tiny, prompt, reach))
    for layer, d in enumerate(dense_layers(tiny, ids)):
        for h in range(d["p"].shape[0]):
            total = 0.0
            for r in rows:
                p = d["p"][h, r].tolist()
                top = sorted(range(len(p)), key=lambda j: (-p[j], j))[: len(needle)]
                total += sum(p[j] for j in top if j in needle)
            assert got[layer, h] == pytest.approx(total / len(needle), rel=1e-9, abs=1e-12)
    if depth == 30.0:  # the sliding window of 128 cannot reach the needle: nothing on it
        assert all(got[layer, h] == 0 for layer, h in got if CONFIG.attention(layer).window)


@pytest.mark.parametrize(("depth", "reach"), [(30.0, 0), (100.0, 3)])
def test_logit_contrib_matches_a_dense_float64_sum_over_keys(tiny, depth, reach):
    prompt = needle_prompt(tiny.tokenizer, NEEDLES[1], 360, depth, seed=1)
    ids, rows, targets = forced(prompt)
    first = prompt.text.index(NEEDLES[1].sentence)  # byte-level, no prompt start: characters are tokens
    needle = set(range(first, min(first + len(NEEDLES[1].sentence) + reach, prompt.length)))
    w_u = tiny.model.lm_head.weight.double()
    got = grid(frame_of("logit_contrib", tiny, prompt, reach))
    for layer, d in enumerate(dense_layers(tiny, ids)):
        dv = d["v"].shape[-1]
        seen = visible(len(ids), len(ids), d["window"])
        for h in range(d["p"].shape[0]):
            per_step = []
            for r, y in zip(rows, targets, strict=True):
                w = d["w_o"][:, h * dv : (h + 1) * dv].T @ w_u[y]
                keys = [j for j in range(len(ids)) if seen[r, j]]
                phi = {j: float(d["p"][h, r, j]) * float(d["v"][h, j].detach() @ w.detach()) for j in keys}
                on = [j for j in keys if j in needle]
                off = [j for j in keys if j not in needle]
                minus = sum(phi[j] for j in off) * len(on) / len(off) if off else 0.0
                per_step.append(sum(phi[j] for j in on) - minus)
            assert got[layer, h] == pytest.approx(sum(per_step) / len(per_step), rel=1e-7, abs=1e-10)


@pytest.mark.parametrize("reach", [0, 4])
def test_query_focus_matches_a_dense_float64_calibrated_sum(tiny, reach):
    needle = NEEDLES[2]
    prompt = needle_prompt(tiny.tokenizer, needle, 320, 40.0, seed=2)
    text = prompt.text
    suffix = needle.prompt.format(question=needle.question) + ANSWER_PREFIX
    query = len(text) - len(suffix)
    assert text[query:] == suffix and prompt.query_start == query
    null_text = text[:query] + suffix.replace(needle.question, "N/A")
    first = text.index(needle.sentence)
    doc = list(range(first, min(first + len(needle.sentence) + reach, query)))
    real = dense_layers(tiny, list(text.encode()))
    null = dense_layers(tiny, list(null_text.encode()))
    got = grid(frame_of("query_focus", tiny, prompt, reach))
    for layer in range(CONFIG.n_layers):
        for h in range(real[layer]["p"].shape[0]):
            c = real[layer]["p"][h, query:, doc].mean(0)
            c0 = null[layer]["p"][h, query:, doc].mean(0)
            d = c - c0
            theta = float(d.mean()) - 2 * float(d.std(unbiased=True))
            want = sum(float(x) for x in d if float(x) > theta)
            assert got[layer, h] == pytest.approx(want, rel=1e-7, abs=1e-12)


@pytest.mark.parametrize("sample", [0, 1])
def test_echo_and_induction_match_dense_float64_sums_over_the_earlier_copies(tiny, sample):
    ids, n = repeated_ids(tiny, 259, seed=4, sample=sample)
    assert n == 64 and len(ids) == 256 and ids[:64] * 4 == ids and max(ids) < 256
    echo = grid(frame_of("echo", tiny, NeedlePrompt([0] * 259, 0, 1, NEEDLES[0], 0.0, ""), seed=4, sample=sample))
    induction = grid(frame_of("induction", tiny, NeedlePrompt([0] * 259, 0, 1, NEEDLES[0], 0.0, ""), seed=4,
                              sample=sample))  # fmt: skip
    for layer, d in enumerate(dense_layers(tiny, ids)):
        for h in range(d["p"].shape[0]):
            p = d["p"][h]
            rows = range(n, 4 * n)
            want_echo = sum(sum(float(p[m, m - k * n]) for k in (1, 2, 3) if m - k * n >= 0) for m in rows) / len(rows)
            want_ind = sum(sum(float(p[m, m - k * n + 1]) for k in (1, 2, 3) if m - k * n >= 0) for m in rows) / len(
                rows
            )
            # each row's log-sum-exp is streamed in the model's float32: relative error about 1e-7
            assert echo[layer, h] == pytest.approx(want_echo, rel=1e-6, abs=1e-12)
            assert induction[layer, h] == pytest.approx(want_ind, rel=1e-6, abs=1e-12)


def test_retrieval_forced_is_the_teacher_forced_copy_score_of_every_head(tiny):
    """Against the dense reference of the forced copy score (tests/test_forced_scores.py's, from the definition)."""
    prompt = needle_prompt(tiny.tokenizer, CODE_NEEDLES[1], 300, 100.0, seed=5)
    value, set_value, _ = dense_forced(tiny, prompt)
    frame = frame_of("retrieval_forced", tiny, prompt)
    for r in frame.itertuples():
        assert r.value == pytest.approx(value[r.layer, r.head], abs=1e-12)
        assert r.set_value == pytest.approx(set_value[r.layer, r.head], abs=1e-12)


# hand-built heads: head 0 attends (logit 50) to the keys just after earlier copies of its row's token, head 1 evenly
# to every key it sees; layer 0 is full, layer 1 a sliding window of 6 (tests/hand_built.py)


def test_a_hand_built_induction_head_puts_its_top_mass_on_the_needle_and_ties_go_to_the_earlier_keys():
    """``"pq 4729.rs "`` + forced ``"472"``: rows 10-13, needle keys 3-6, K = 4. The induction head puts all its mass
    on the span key holding the next answer token: 4 x 1 / 4. The uniform head's top 4 are its 4 earliest keys (ties),
    of which key 3 is on the needle: (1/11 + 1/12 + 1/13 + 1/14) / 4. In the window of 6, rows 10 and 11 see keys
    5-10 and 6-11: top 4 = 5-8 (2 needle keys, 2/6) and 6-9 (1/6); rows 12 and 13 see none: (3/6) / 4."""
    model = InductionModel()
    scores = score_sample(model, needle_mass(model, hand_prompt(), DecodeOptions())).values["value"]
    assert scores[0, 0] == pytest.approx(1.0, abs=1e-12)
    assert scores[0, 1] == pytest.approx((1 / 11 + 1 / 12 + 1 / 13 + 1 / 14) / 4, abs=1e-12)
    assert scores[1, 0] == pytest.approx(1 / 8, abs=1e-12) and scores[1, 1] == pytest.approx(1 / 8, abs=1e-12)


def test_a_hand_built_head_sends_the_answer_logit_from_the_needle_and_a_distractor_counts_against_it():
    """``"pq 4729.4s "`` + forced ``"472"``: needle sentence keys 0-7 (``"pq 4729."``), a distractor ``4`` at key 8. A
    key sends logit ``[token = y]`` (values one-hot, identities after). Uniform head, full layer: row 10 (y = 4) sends
    1/11 from key 3 and 1/11 from key 8, scaled by 8 needle keys / 3 others: 1/11 - 8/33; rows 11-13 send 1/12, 1/13,
    1/14 from the needle. Induction head: rows 10, 12, 13 put all on the next answer token (1); row 11 (token 4)
    splits between keys 4 (``7``, the answer) and 9 (after the distractor, ``s``): 1/2. The sliding layer (window 6):
    row 10 sees keys 5-10 evenly (both heads: key 3 is out of reach), the distractor at key 8 sends 1/6 against 3 needle
    keys and 3 others: -1/6; rows 11-13 see no answer token (the induction head's key 9 holds ``s``): -1/24."""
    text = "pq 4729.4s "
    prompt = NeedlePrompt(list(text.encode()), 3, 7, Needle("pq ", "4729", ".", "the code?"), 50.0, "hand", text,
                          sentence=(0, 8))  # fmt: skip
    model = ValueInductionModel()
    scores = score_sample(model, logit_contrib(model, prompt, DecodeOptions())).values["value"]
    assert scores[0, 1] == pytest.approx((1 / 11 - 8 / 33 + 1 / 12 + 1 / 13 + 1 / 14) / 4, abs=1e-12)
    assert scores[0, 0] == pytest.approx((1 + 1 / 2 + 1 + 1) / 4, abs=1e-12)
    assert scores[1, 0] == pytest.approx(-1 / 24, abs=1e-12) and scores[1, 1] == pytest.approx(-1 / 24, abs=1e-12)


def test_a_hand_built_induction_head_focuses_the_question_on_the_needle_more_than_a_null_question():
    """``"pq 4729. Q 47"``: needle sentence keys 0-7, question part from key 8 (`` Q 47``), question ``47``; the null
    prompt ``"pq 4729. Q N/A"``. The induction head (full layer), real rows 8-12: row 8 (space) -> key 3; row 9
    (``Q``, never seen) -> even over keys 0-9; row 10 (space) -> keys 3 and 9 by halves; row 11 (``4``) -> key 4;
    row 12 (``7``) -> key 5. Null rows 8-13: rows 8-10 as before, rows 11-13 (``N/A``, never seen) even over 12, 13
    and 14 keys."""
    needle = Needle("pq ", "4729", ".", "47", prompt=" Q {question}", answer_prefix="")
    text = "pq 4729. Q 47"
    prompt = NeedlePrompt(list(text.encode()), 3, 7, needle, 50.0, "hand", text, sentence=(0, 8), query_start=8,
                          question=(11, 13))  # fmt: skip
    model = InductionModel()
    scores = score_sample(model, query_focus(model, prompt, DecodeOptions())).values["value"]
    real = [{3: 1.0}, {j: 1 / 10 for j in range(10)}, {3: 0.5, 9: 0.5}, {4: 1.0}, {5: 1.0}]
    null = [
        {3: 1.0},
        {j: 1 / 10 for j in range(10)},
        {3: 0.5, 9: 0.5},
        *({j: 1 / m for j in range(m)} for m in (12, 13, 14)),
    ]
    c = np.array([sum(row.get(j, 0.0) for row in real) / len(real) for j in range(8)])
    c0 = np.array([sum(row.get(j, 0.0) for row in null) / len(null) for j in range(8)])
    d = c - c0
    theta = d.mean() - 2 * d.std(ddof=1)
    assert scores[0, 0] == pytest.approx(d[d > theta].sum(), abs=1e-12)
    assert d[3] > 0 and scores[0, 0] > 0  # the question's own tokens find their copies in the needle


def test_hand_built_heads_on_four_copies_echo_and_induct_exactly():
    """``"abcdefgh"`` four times (no repeat inside a copy): the induction head puts all its mass on the tokens after
    the row's earlier copies (induction 1, echo 0); the uniform head puts ``1 / (m + 1)`` on each of ``m // 8`` earlier
    copies (and as many next tokens); the window of 6 reaches no earlier copy (8 back): 0."""
    ids = list(b"abcdefgh" * 4)
    echo = copy_attention(InductionModel(), ids, 0, 8, after=0)
    induction = copy_attention(InductionModel(), ids, 0, 8, after=1)
    uniform = sum((m // 8) / (m + 1) for m in range(8, 32)) / 24
    assert induction[0, 0] == pytest.approx(1.0, abs=1e-12) and echo[0, 0] == pytest.approx(0.0, abs=1e-12)
    assert echo[0, 1] == pytest.approx(uniform, abs=1e-12) and induction[0, 1] == pytest.approx(uniform, abs=1e-12)
    assert np.all(echo[1] == 0.0) and np.all(induction[1] == 0.0)


def test_a_prompt_without_what_a_definition_needs_has_no_number_and_says_why():
    no_question = Needle("The code is ", "4729", ".", "What is the code?", prompt=" Tell me the code.")
    prompt = needle_prompt(InductionModel().tokenizer, no_question, 60, 50.0)
    assert prompt.question == (-1, -1)
    rows = frame_of("query_focus", InductionModel(), prompt)
    assert rows["value"].isna().all() and set(rows["missing"]) == {
        "the prompt holds no question (the needle's prompt has no {question}, or it is empty)"
    }
    short = score_sample(InductionModel(), razor(InductionModel(), NeedlePrompt([0] * 7, 0, 1, NEEDLES[0], 0.0, ""),
                                                 DecodeOptions(), 0, 1))  # fmt: skip
    assert short.missing == "7 tokens hold no 4 copies of 2 or more random tokens" and not short.values
    reference = frame_of("retrieval_forced", InductionModel(), NeedlePrompt(list(b"pq 47.rs "), 3, 5,
                         Needle("pq ", "4729", ".", "q?"), 50.0, "hand", "pq 47.rs "))  # fmt: skip
    assert reference["value"].notna().all()  # the exact span is known: scored
    options = DecodeOptions(span="reference")
    elsewhere = NeedlePrompt(list(b"pq 47.rs "), 3, 5, Needle("pq ", "9999", ".", "q?"), 50.0, "h", "pq 47.rs ")
    missing = METRICS["retrieval_forced"].decode(InductionModel(), elsewhere, 0, options)["retrieval_forced_samples"]
    assert missing["value"].isna().all() and missing["missing"].str.startswith("no answer span").all()


def test_the_head_table_averages_the_scored_samples_and_gives_each_kv_group_its_max_and_mean():
    rows = []
    for sample, values, why in [(0, [0.1, 0.5, 0.2, 0.0], ""), (1, [0.3, 0.1, 0.4, 0.2], ""), (2, [9, 9, 9, 9], "no")]:
        for head, v in enumerate(values):
            rows.append({"layer": 1, "head": head, "layer_type": "full", "kv_head": head // 2, "sample": sample,
                         "value": math.nan if why else float(v), "missing": why})  # fmt: skip
    table = head_table(pd.DataFrame(rows), ["value"]).set_index("head")
    assert table["value"].tolist() == pytest.approx([0.2, 0.3, 0.3, 0.1])
    assert set(table["n_scored"]) == {2} and set(table["n_samples"]) == {3}
    assert table["group_max"].tolist() == pytest.approx([0.3, 0.3, 0.3, 0.3])
    assert table["group_mean"].tolist() == pytest.approx([0.25, 0.25, 0.2, 0.2])
    assert table["kv_head"].tolist() == [0, 0, 1, 1]


def test_logit_contrib_of_a_hugging_face_model_matches_transformers_own_eager_attention(hf_models):
    """Llama (4 query heads on 2 key/value heads): transformers' eager attention probabilities
    (``output_attentions``) and its own value projection's outputs, through ``o_proj`` and ``lm_head``, key by key."""
    from transformers import AutoModelForCausalLM

    from headprobe.hooked import load_model
    from headprobe.metrics.retrieval import forced_prompt

    folder = hf_models["llama"]
    model = load_model(folder)
    prompt = needle_prompt(model.tokenizer, NEEDLES[3], 120, 90.0, start=model.prompt_start)
    assert model.tokenizer.decode(prompt.ids[slice(*prompt.sentence)]).strip() == NEEDLES[3].sentence
    ids, rows, targets = (lambda f: (f.ids, f.rows, f.targets))(forced_prompt(model, prompt))
    eager = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager", dtype=torch.float64)
    eager.requires_grad_(False)
    values = {}
    hooks = [layer.self_attn.v_proj.register_forward_hook(lambda m, a, out, i=i: values.__setitem__(i, out))
             for i, layer in enumerate(eager.model.layers)]  # fmt: skip
    with torch.no_grad():
        attentions = eager(torch.tensor([ids]), output_attentions=True).attentions
    for h in hooks:
        h.remove()
    cfg = eager.config
    heads, kv, dv = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    needle = set(range(*prompt.sentence))
    got = grid(frame_of("logit_contrib", model, prompt))
    for layer, p in enumerate(attentions):
        v = values[layer][0].view(len(ids), kv, dv)
        w_o = eager.model.layers[layer].self_attn.o_proj.weight
        for h in range(heads):
            steps = []
            for r, y in zip(rows, targets, strict=True):
                w = w_o[:, h * dv : (h + 1) * dv].T @ eager.lm_head.weight[y]
                keys = list(range(r + 1))
                phi = {j: float(p[0, h, r, j]) * float(v[j, h // (heads // kv)] @ w) for j in keys}
                on, off = [j for j in keys if j in needle], [j for j in keys if j not in needle]
                steps.append(sum(phi[j] for j in on) - (sum(phi[j] for j in off) * len(on) / len(off) if off else 0.0))
            assert got[layer, h] == pytest.approx(sum(steps) / len(steps), rel=1e-3, abs=1e-9)
    assert max(abs(v) for v in got.values()) > 1e-5  # not all zero (random weights send small logits)


def test_agreement_is_scipys_spearman_and_the_jaccard_of_the_top_tenth_per_layer_type():
    from scipy.stats import spearmanr

    from headprobe.metrics.agreement import head_agreement

    rng = np.random.default_rng(0)
    heads = pd.DataFrame([(layer, h) for layer in range(4) for h in range(5)], columns=["layer", "head"])
    heads["layer_type"] = np.where(heads["layer"] % 2, "full", "sliding")
    a = rng.normal(size=20)
    b = a + rng.normal(scale=0.5, size=20)
    b[3] = b[7] = 0.0  # a tie
    c = np.full(20, math.nan)  # a definition without a number (Wu's on a model that answers nothing)
    tables = {name: heads.assign(length=512, value=v) for name, v in
              (("needle_mass", a), ("logit_contrib", b), ("retrieval", c))}  # fmt: skip
    table = head_agreement(tables).set_index(["layer_type", "definition_a", "definition_b"])
    assert list(table.index.get_level_values(1).unique()) == ["retrieval", "needle_mass"]  # the registry's order
    row = table.loc[("all", "needle_mass", "logit_contrib")]
    assert row.spearman == pytest.approx(spearmanr(a, b).statistic, abs=1e-12) and row.n_heads == 20
    top_a, top_b = set(np.argsort(-a)[:2]), set(np.argsort(-b)[:2])
    assert row.k == 2 and row.jaccard == pytest.approx(len(top_a & top_b) / len(top_a | top_b))
    full = (heads["layer_type"] == "full").to_numpy()
    row = table.loc[("full", "needle_mass", "logit_contrib")]
    assert row.spearman == pytest.approx(spearmanr(a[full], b[full]).statistic, abs=1e-12) and row.n_heads == 10
    empty = table.loc[("all", "retrieval", "needle_mass")]
    assert empty.n_heads == 0 and math.isnan(empty.spearman) and math.isnan(empty.jaccard) and empty.k == 0


def test_analyze_writes_every_definition_and_their_agreement_says_which_samples_have_no_number(tmp_path):
    import json

    from typer.testing import CliRunner

    from headprobe.cli import app
    from headprobe.model.checkpoint import save_checkpoint
    from headprobe.model.transformer import Transformer
    from headprobe.results import read_table
    from headprobe.show import show_tables
    from headprobe.testing import tiny_config

    torch.manual_seed(0)
    ckpt = save_checkpoint(Transformer(tiny_config(vocab_size=264, max_seq_len=512)), tmp_path / "tiny")
    needles = tmp_path / "needles.jsonl"
    needles.write_text(json.dumps({"before": "The code is ", "answer": "4729", "after": ".", "question": "the code?",
                                   "prompt": " Tell me the code."}) + "\n")  # fmt: skip
    names = "retrieval_forced,needle_mass,query_focus,echo,induction,logit_contrib"
    args = ["analyze", str(ckpt), "--metrics", names, "--lengths", "200", "--samples", "2", "--needles", str(needles),
            "--no-progress", "--out", str(tmp_path / "a")]  # fmt: skip
    res = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert res.exit_code == 0, res.output
    folder = tmp_path / "a" / "tiny"
    heads = 0
    for name in names.split(","):
        table = read_table(folder / f"{name}.parquet").frame
        heads = heads or len(table)
        assert len(table) == heads and set(table["model"]) == {"tiny"} and set(table["n_samples"]) == {2}
        assert (table["n_scored"] == (0 if name == "query_focus" else 2)).all()
        assert table["value"].isna().all() == (name == "query_focus")
    assert "query_focus @ 200 sample 0: no number, the prompt holds no question" in res.output
    assert "query_focus      L=    200: 0/2 samples scored: no number" in res.output
    agreement = read_table(folder / "head_agreement.parquet").frame
    pairs = agreement[agreement.layer_type == "all"]
    assert len(pairs) == 15 and (pairs.loc[pairs.definition_a == "query_focus", "n_heads"] == 0).all()
    shown = {t.title: t.frame for t in show_tables(tmp_path / "a", ["definitions", "head_agreement"], top=2)}
    assert len(shown["head definitions: agreement per pair"]) == len(agreement)
    tops = shown["head definitions: top 2 heads per checkpoint and length"]
    echo = read_table(folder / "echo.parquet").frame.sort_values(
        ["value", "layer", "head"], ascending=[False, True, True]
    )
    assert tops["echo"].tolist() == [f"{r.layer}.{r.head}" for r in echo.head(2).itertuples()]
    assert "query_focus" not in tops or (tops["query_focus"] == "").all()
    again = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert again.exit_code == 0 and "done earlier" in again.output
    assert read_table(folder / "head_agreement.parquet").frame.equals(agreement)


def test_the_definitions_of_one_sample_share_one_pass_per_distinct_input_and_score_as_alone(tiny, monkeypatch):
    """Seven definitions on one needle sample: three forward passes (the prompt with its forced answer, for five of
    them; the null question; the random copies, for echo and induction) besides Wu's greedy decode (through the
    KV cache, not ``run``), and each one's numbers equal its own run alone."""
    from headprobe.analysis.items import decode_items
    from headprobe.analysis.settings import AnalyzeSettings

    names = ["retrieval_forced", "needle_mass", "query_focus", "echo", "induction", "logit_contrib"]
    settings = AnalyzeSettings(metrics=["retrieval", *names], needle_reach=3, seed=2, max_new_tokens=5)
    prompt = needle_prompt(tiny.tokenizer, NEEDLES[0], 300, 60.0, seed=1)
    alone = {n: frame_of(n, tiny, prompt, reach=3, seed=2, sample=1) for n in names}
    options = DecodeOptions(max_new_tokens=5, needle_reach=3, seed=2)
    wu_alone = METRICS["retrieval"].decode(tiny, prompt, 1, options)
    inputs = []
    real = type(tiny).run
    monkeypatch.setattr(type(tiny), "run", lambda self, ids, **kw: inputs.append(ids.shape[1]) or real(self, ids, **kw))
    together = decode_items(tiny, 300, settings, [METRICS[n] for n in ["retrieval", *names]], prompt, 1)
    forced = prompt.length + len(" " + NEEDLES[0].answer) - 1  # byte-level: the answer forced behind a space
    null = prompt.length - len(NEEDLES[0].question) + len("N/A")
    assert sorted(inputs) == sorted([forced, null, 300])  # 300 = 4 copies of 75 random bytes
    for name in names:
        got = together[METRICS[name]][f"{name}_samples"]
        assert (got["length"] == 300).all()
        pd.testing.assert_frame_equal(got.drop(columns="length"), alone[name])
    for table, frame in wu_alone.items():  # Wu's forced columns read the shared pass; its decode is its own
        pd.testing.assert_frame_equal(together[METRICS["retrieval"]][table][frame.columns], frame)


def test_a_hand_built_induction_head_copies_every_forced_answer_token_and_a_uniform_head_none():
    """``"pq 4729.rs "`` + forced ``"472"``: at rows 10-13 the induction head's largest probability falls on the span
    key holding the token being forced (4, 7, 2, 9): 4 copies over a span of 4, each span key once. The uniform head's
    ties go to key 0 (``p``), outside the span: 0. The sliding layer (window 6) reaches no matching key: 0."""
    rows = frame_of("retrieval_forced", InductionModel(), hand_prompt()).set_index(["layer", "head"])
    assert rows.loc[(0, 0), "value"] == 1.0 and rows.loc[(0, 0), "set_value"] == 1.0
    assert rows.loc[(0, 1), "value"] == 0.0 and (rows.loc[1, "value"] == 0.0).all()
