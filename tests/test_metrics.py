"""Metrics against independent references: numpy SVD, brute-force Kendall distance, dense attention,
a hand-built copying model for the retrieval score."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
import torch
from reference import dense_entropy_per_head, dense_probs, entropy_of

from headprobe.hooked import HeadprobeModel, HookedModel
from headprobe.metrics import (
    attention_entropy,
    effective_rank,
    head_statistics,
    kendall_reordering,
    residual_effective_rank,
    retrieval_heads,
    retrieval_scores,
    rouge1_recall,
)
from headprobe.metrics.retrieval import head_scores, reference_span
from headprobe.metrics.rows import Rows
from headprobe.model.config import LayerInfo, LayerType
from headprobe.model.seam import AttentionCall
from headprobe.model.tokenizer import ByteTokenizer, HFTokenizer
from headprobe.model.transformer import Transformer
from headprobe.stats import attention_stats
from headprobe.testing import build_toy_bpe, tiny_config
from headprobe.text.haystack import text_inputs
from headprobe.text.needles import CODE_NEEDLES, NEEDLES, needle_prompt
from headprobe.text.prompt_format import PLAIN, Wrapper


def numpy_erank(x: np.ndarray, center: bool) -> float:
    if center:
        x = x - x.mean(0, keepdims=True)
    s = np.linalg.svd(x, compute_uv=False)
    p = s / s.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


@pytest.mark.parametrize("shape, rank", [((200, 16), 16), ((500, 32), 5), ((40, 64), 40)])
def test_effective_rank_matches_numpy_svd(shape, rank):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(shape[0], rank)) @ rng.normal(size=(rank, shape[1])) + 3.0  # offset: centring matters
    for center in (True, False):
        assert effective_rank(torch.tensor(x), center=center) == pytest.approx(numpy_erank(x, center), rel=1e-6)
    assert 1.0 <= effective_rank(torch.tensor(x), center=True) <= rank + 1e-6
    # the default is the documented definition (docs/metrics.md) and the tables' `value`: not centred
    assert effective_rank(torch.tensor(x)) == pytest.approx(numpy_erank(x, center=False), rel=1e-6)
    assert effective_rank(torch.tensor(x)) != pytest.approx(numpy_erank(x, center=True), rel=1e-3)


def test_effective_rank_hand_worked():
    # singular values 3 and 1: p = (3/4, 1/4), erank = exp(-(3/4 ln 3/4 + 1/4 ln 1/4))
    x = torch.tensor([[3.0, 0.0], [0.0, 1.0]])
    assert effective_rank(x) == pytest.approx(math.exp(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25))))


def brute_kendall(keys: list[tuple[int, float]]) -> float:
    """Probability-weighted Kendall distance by enumeration: every pair of ``(position, probability)``
    weighs p_a * p_b and disagrees when the more probable key is the older; equal probabilities: half."""
    num = den = 0.0
    for (ja, pa), (jb, pb) in itertools.combinations(keys, 2):
        w = pa * pb
        if pa == pb:
            d = 0.5
        else:
            likelier, other = (ja, jb) if pa > pb else (jb, ja)
            d = 1.0 if likelier < other else 0.0
        num, den = num + w * d, den + w
    return num / den


def _rows(rows: list[list[tuple[int, float]]], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.full((len(rows), k), -1, dtype=torch.long)
    prob = torch.zeros(len(rows), k, dtype=torch.float64)
    for r, keys in enumerate(rows):
        keys = sorted(keys, key=lambda kp: -kp[1])  # as the streaming top-k gives them
        idx[r, : len(keys)] = torch.tensor([j for j, _ in keys])
        prob[r, : len(keys)] = torch.tensor([p for _, p in keys], dtype=torch.float64)
    return idx, prob


def test_kendall_reordering_against_brute_force():
    rng = np.random.default_rng(1)
    rows = []
    for n in (2, 3, 5, 8):
        for _ in range(20):
            pos = rng.choice(100, size=n, replace=False)
            p = rng.dirichlet(np.ones(n))
            if n > 2 and rng.random() < 0.3:
                p[1] = p[0]  # some exact ties
            rows.append([(int(j), float(q)) for j, q in zip(pos, p, strict=True)])
    got = kendall_reordering(*_rows(rows, 8))
    for r, keys in enumerate(rows):
        assert got[r].item() == pytest.approx(brute_kendall(keys))
    assert math.isnan(kendall_reordering(torch.tensor([[4, -1, -1]]), torch.tensor([[1.0, 0, 0]]))[0].item())


def test_kendall_reordering_worked_examples():
    # docs/metrics.md: query at 9; p(9) = 0.5, p(7) = 0.3, p(8) = 0.2. Pairs (9,7) w .15 and (9,8) w .10
    # agree with recency, (7,8) w .06 disagrees (7 is likelier and older): 0.06 / 0.31
    got = kendall_reordering(*_rows([[(9, 0.5), (7, 0.3), (8, 0.2)]], 3))
    assert got[0].item() == pytest.approx(0.06 / 0.31)
    # a uniform row is exactly 0.5 (the unweighted count gave 0.553 from how ties fell in the top-k)
    assert kendall_reordering(*_rows([[(j, 1 / 16) for j in range(16)]], 16))[0].item() == 0.5
    # a near-perfect previous-token head, query at 20: p(19) = 0.97, the other 15 keys 0.002 each.
    # By hand: the only disagreeing pair with the top key is (19, 20), weight 0.97e; 14 agree; the 105
    # pairs of small keys tie (half each, weight e^2): (0.97 + 52.5e) / (15 * 0.97 + 105e) = 0.0728
    e = 0.002
    prev = [(19, 0.97)] + [(j, e) for j in (20, *range(5, 19))]
    want = (0.97 + 52.5 * e) / (15 * 0.97 + 105 * e)
    assert kendall_reordering(*_rows([prev], 16))[0].item() == pytest.approx(want) and want < 0.08


def test_reordering_extremes_from_attention():
    # 1-D keys: score = +j (newest wins: recency order, 0) or -j (oldest wins: reversed, 1)
    pos = torch.arange(40, dtype=torch.float32).view(1, 1, 40, 1)
    q = torch.ones(1, 1, 40, 1)
    for sign, want in ((1.0, 0.0), (-1.0, 1.0)):
        st = attention_stats(q, sign * pos, topk=6)
        got = kendall_reordering(st.topk_idx, st.topk_prob)[0, 0, 1:]  # row 0 has a single key
        assert torch.allclose(got, torch.full_like(got, want, dtype=got.dtype))
    flat = attention_stats(q, torch.zeros(1, 1, 40, 1), topk=6)  # every key equally likely: 0.5
    assert torch.allclose(kendall_reordering(flat.topk_idx, flat.topk_prob)[0, 0, 1:], torch.tensor(0.5).double())


def test_attention_entropy_matches_dense_probabilities():
    torch.manual_seed(0)
    net = Transformer(tiny_config(vocab_size=264))
    model = HeadprobeModel(net, ByteTokenizer(), "tiny")
    ids = torch.randint(0, 256, (2, 30))
    frame = attention_entropy(model, ids)
    want = dense_entropy_per_head(net, ids)
    for _, row in frame.iterrows():
        assert row["value"] == pytest.approx(float(want[row["layer"]][row["head"]]), abs=1e-5)
    assert list(frame.columns[:4]) == ["layer", "head", "layer_type", "value"]
    assert set(frame.layer_type) == {"sliding", "full"} and len(frame) == 3 * 4 + 2
    both = head_statistics(model, ids)
    assert np.allclose(both["entropy"]["value"], frame["value"])
    assert ((both["reordering"]["value"] >= 0) & (both["reordering"]["value"] <= 1)).all()


def test_rows_restrict_the_average():
    torch.manual_seed(0)
    net = Transformer(tiny_config(vocab_size=264))
    model = HeadprobeModel(net, ByteTokenizer(), "tiny")
    ids = torch.randint(0, 256, (1, 30))
    last = attention_entropy(model, ids, rows=Rows.parse("last:1").indices(30))
    _, cache = net.run_with_cache(ids)
    q = cache["blocks.3.attn.hook_rot_q"].transpose(1, 2)[:, :, -1:]
    k = cache["blocks.3.attn.hook_rot_k"].transpose(1, 2)
    want = entropy_of(dense_probs(q, k, None, 16**-0.5))[0, :, 0]
    got = last[last.layer == 3].sort_values("head")["value"].to_numpy()
    assert np.allclose(got, want.numpy(), atol=1e-5)


def test_rows():
    assert Rows.parse("all").indices(10) is None and Rows.parse(None).indices(10) is None
    assert Rows.parse("last:3").indices(10).tolist() == [7, 8, 9]
    assert Rows.parse("stride:4").indices(10).tolist() == [1, 5, 9]
    assert Rows.parse("last:50").indices(10).tolist() == list(range(10))
    assert [Rows.parse(x).count(10) for x in ("all", "last:3", "stride:4", "last:50")] == [10, 3, 3, 10]
    assert str(Rows.parse("stride:4")) == "stride:4" and Rows.parse(Rows.parse("last:2")) == Rows.parse("last:2")
    for bad in ("first:3", "last:", "stride:0", "last:-2", "everything"):
        with pytest.raises(ValueError, match="rows"):
            Rows.parse(bad)


def test_residual_effective_rank_pools_positions_like_a_direct_computation():
    torch.manual_seed(0)
    net = Transformer(tiny_config(vocab_size=264))
    model = HeadprobeModel(net, ByteTokenizer(), "tiny")
    ids = torch.randint(0, 256, (2, 25))
    frame = residual_effective_rank(model, ids)
    _, cache = net.run_with_cache(ids)
    assert frame.layer.tolist() == [-1, 0, 1, 2, 3] and frame.site.tolist()[0] == "embed"
    for _, row in frame.iterrows():
        name = "hook_embed" if row["layer"] < 0 else f"blocks.{row['layer']}.hook_resid_post"
        x = cache[name].reshape(-1, 32).double().numpy()
        assert row["value"] == pytest.approx(numpy_erank(x, False), rel=1e-6)  # Roy & Vetterli: no centring
        assert row["centered"] == pytest.approx(numpy_erank(x, True), rel=1e-6)
        assert row["tokens"] == 50


def test_rouge1_recall_stems_as_wu_et_al():
    assert rouge1_recall("a spoonful of black pepper", "It is a spoonful of black pepper!") == 1.0
    assert rouge1_recall("a spoonful of black pepper", "black pepper") == pytest.approx(2 / 5)
    assert rouge1_recall("amber falcon seventeen", "Amber, FALCON...") == pytest.approx(2 / 3)
    # Porter stems by hand: eating -> eat, mussels -> mussel, lighthouses/lighthouse -> lighthous;
    # matched: eat saffron mussel at lighthous = 5 of the reference's 7 tokens (the, cafe unmatched)
    assert rouge1_recall("eat saffron mussels at the lighthouse cafe", "eating saffron mussel at lighthouses") == (
        pytest.approx(5 / 7)
    )
    # without stemming only "bright" matches (1/4: dropped); with it all four do (kept)
    assert rouge1_recall("painted boats bright stripes", "paints boat bright stripe") == 1.0
    assert rouge1_recall("the the cat", "the cat") == pytest.approx(2 / 3)  # counts are clipped


def test_needle_prompt_places_the_answer():
    tok = ByteTokenizer()
    for depth in (0.0, 50.0, 100.0):
        p = needle_prompt(tok, NEEDLES[1], 600, depth)
        assert p.length == 600
        assert tok.decode(p.ids[p.answer_start : p.answer_end]) == NEEDLES[1].answer
        assert tok.decode(p.ids).endswith("Question: " + NEEDLES[1].question + "\nAnswer:")
    starts = [needle_prompt(tok, NEEDLES[0], 800, d).answer_start for d in (0.0, 50.0, 100.0)]
    assert starts[0] < 100 < starts[1] < starts[2] and starts[2] > 600
    started = needle_prompt(tok, NEEDLES[1], 600, 50.0, start=[256])  # a model whose prompts start with a BOS
    assert started.length == 600 and started.ids[0] == 256 and 256 not in started.ids[1:]
    assert tok.decode(started.ids[started.answer_start : started.answer_end]) == NEEDLES[1].answer
    ids = text_inputs(tok, 300, 2)
    assert ids.shape == (2, 300) and not torch.equal(ids[0], ids[1]) and 256 not in ids  # no start: text only
    assert text_inputs(tok, 300, 1, start=[256, 257])[0, :3].tolist()[:2] == [256, 257]


def _metaspace_bpe(tmp_path):
    """A SentencePiece-style tokenizer (Metaspace pre-tokenizer: ``'▁'`` marks a word start)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from headprobe.text.corpus import document

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "</s>"])
    tok.train_from_iterator((document(0, i)[1] for i in range(100)), trainer)
    tok.save(str(tmp_path / "meta.json"))
    return HFTokenizer(tmp_path / "meta.json")


@pytest.mark.parametrize("kind", ["byte-level", "metaspace"])
def test_needle_prompt_is_its_text_tokenised_whole(tmp_path, kind):
    """Issue 11: tokenising the needle's pieces apart gave byte-level BPE a lone ' ' before a space-less
    answer; the prompt must be exactly the tokenisation of its own text, and the answer span exactly the
    tokens that spell the answer (for byte-level BPE ' 4471' with its space: ' 4', '4', '7', '1' or so)."""
    if kind == "byte-level":
        tok = HFTokenizer(build_toy_bpe(tmp_path / "bpe.json", vocab_size=600))
    else:
        tok = _metaspace_bpe(tmp_path)
    chat = Wrapper("chat", "<|user|>\n", "<|end|>\n<|assistant|>\n")
    for needle, depth, wrapper in itertools.product((*NEEDLES[:2], CODE_NEEDLES[0]), (0.0, 40.0, 100.0), (PLAIN, chat)):
        p = needle_prompt(tok, needle, 300, depth, start=[7], wrapper=wrapper)
        assert p.ids == [7, *tok.encode(p.text)] and p.prompt_format == wrapper.format
        assert len(p.ids) in (299, 300)
        _, offsets = tok.encode_offsets(p.text)
        a = p.text.index(needle.sentence) + len(needle.before)
        b = a + len(needle.answer)
        inside = [j + 1 for j, (s, e) in enumerate(offsets) if s < b and e > a]  # +1: the start id
        assert (p.answer_start, p.answer_end) == (inside[0], inside[-1] + 1)
        assert needle.answer in tok.decode(p.ids[p.answer_start : p.answer_end])  # edge tokens may hold more
        question = needle.prompt.format(question=needle.question)
        if wrapper is PLAIN:  # Wu et al.'s plain prompt: "...\nAnswer:" (the codes: "... The code for the X is")
            ending = "\nAnswer:" if needle in NEEDLES else " " + needle.before.rstrip()
            assert p.text.endswith(question + ending) and p.text.startswith(" ")
        else:  # the task in the user turn; the builtin needles' assistant turn starts empty
            ending = "" if needle in NEEDLES else needle.before.rstrip()
            assert p.text.startswith("<|user|>\n ") and p.text.endswith(question + chat.after + ending)
        assert tok.decode(p.ids[p.answer_start - 1 : p.answer_start]) != " "  # no lone space before it


class CopyModel(HookedModel):
    """A hand-built two-layer model. Layer 1 head 0 has one-hot positional queries and keys with
    q_t = 50 * e(answer_start + t) and k_j = e(j), so at decode step t its argmax is the t-th answer
    token, which the model emits; after the answer it attends just past it and emits a newline.
    Layer 1 head 1 and layer 0 (a sliding window of 8) have zero queries: their argmax is the first
    visible key, never the answer. ``fail_depths`` makes it answer with noise instead."""

    def __init__(self, fail_depths=()):
        self.name, self.tokenizer, self.device = "copy", ByteTokenizer(), torch.device("cpu")
        self.prompt_start = []
        self.layers = [
            LayerInfo(0, LayerType.SLIDING, 2, 2, 2048, 2048, 8),
            LayerInfo(1, LayerType.FULL, 2, 2, 2048, 2048, None),
        ]
        self.max_positions = 2048
        self.fail_depths = fail_depths
        self.target: tuple[int, int] | None = None

    def decode(self, prompt_ids, max_new_tokens, stop_ids=None, hook=None):
        ids = prompt_ids[0].tolist()
        start, end = _answer_span(ids)
        depth_fails = any(abs(start / len(ids) * 100 - d) < 15 for d in self.fail_depths)
        out = []
        for step in range(max_new_tokens):
            n = len(ids) + step  # keys in the cache: prompt + generated so far (the query is the last)
            k = torch.eye(2048)[:n]
            q = torch.zeros(2, 1, 2048)
            q[0, 0, min(start + step, n - 1)] = 50.0
            token = ids[start + step] if start + step < end else 10  # newline after the answer
            if depth_fails:
                token = ord("x") if step < end - start else 10
            out.append(token)
            for layer, window in ((0, 8), (1, None)):
                kk = k if window is None else k[max(0, n - window) :]
                qq = q if layer == 1 else torch.zeros_like(q)
                hook(step, token, AttentionCall(layer, "sliding" if window else "full", qq[None], kk[None, None]
                                                 .expand(1, 2, -1, -1), window, 1.0, n - kk.shape[0]))  # fmt: skip
            if stop_ids and token in stop_ids:
                break
        return out

    def run(self, input_ids, hook=None, residual=None):
        """The teacher-forced pass over the prompt, ``" "`` and the answer but its last byte: the rows producing
        the answer's bytes are the last ``len(answer)`` ones, where layer 1 head 0 attends to the answer's bytes
        in turn, as when decoding; every other query is zero."""
        ids = input_ids[0].tolist()
        start, end = _answer_span(ids)
        n = len(ids)
        q = torch.zeros(2, n, 2048)
        for t in range(end - start):
            q[0, n - (end - start) + t, start + t] = 50.0
        k = torch.eye(2048)[:n][None, None].expand(1, 2, -1, -1)
        hook(AttentionCall(0, "sliding", torch.zeros_like(q)[None], k, 8, 1.0, 0))
        hook(AttentionCall(1, "full", q[None], k, None, 1.0, 0))


def _answer_span(ids):
    tok = ByteTokenizer()
    text = tok.decode(ids)
    for needle in NEEDLES:
        at = text.find(needle.answer)
        if at >= 0 and needle.question in text:
            return at, at + len(needle.answer)  # byte-level: one token per character, no start token
    raise AssertionError("no needle in prompt")


def test_retrieval_score_of_a_head_that_provably_copies():
    scores = retrieval_scores(CopyModel(), needles=NEEDLES[:2], lengths=[400, 700], depths=[20.0, 60.0])
    frame = scores.heads
    by_head = {(r.layer, r.head): r.value for r in frame.itertuples()}
    assert by_head[(1, 0)] == pytest.approx(1.0)
    assert by_head[(1, 1)] == 0.0 and by_head[(0, 0)] == 0.0 and by_head[(0, 1)] == 0.0
    forced = {(r.layer, r.head): r.forced_value for r in frame.itertuples()}  # the same copies, teacher-forced
    assert forced == pytest.approx({(0, 0): 0.0, (0, 1): 0.0, (1, 0): 1.0, (1, 1): 0.0})
    samples = scores.samples
    assert len(samples) == 8 and samples.kept.all() and (frame.n_kept == 8).all()
    heads = retrieval_heads(frame).set_index("layer_type")
    assert heads.loc["all", "retrieval_heads"] == 1 and heads.loc["full", "fraction"] == 0.5
    assert heads.loc["sliding", "retrieval_heads"] == 0


def test_retrieval_threshold_convention():
    frame = pd.DataFrame({"layer_type": ["full", "full", "sliding"], "value": [0.1, 0.35, 0.0999]})
    inclusive = retrieval_heads(frame).set_index("layer_type")  # >= 0.1: the study's definition
    assert inclusive.loc["all", "retrieval_heads"] == 2 and inclusive.loc["full", "fraction"] == 1.0
    strict = retrieval_heads(frame, strict=True).set_index("layer_type")  # > 0.1: Wu et al.'s wording
    assert strict.loc["all", "retrieval_heads"] == 1 and strict.loc["full", "fraction"] == 0.5
    assert retrieval_heads(frame, threshold=0.3).set_index("layer_type").loc["all", "retrieval_heads"] == 1


def test_reference_span_is_the_first_window_with_over_90_percent_of_the_answer_tokens():
    # hand-worked: an 11-token answer 1..11 behind a 9. The window at 0 ([9, 1..10]) already holds 10 of
    # the 11 distinct answer tokens (0.909 > 0.9), so the reference's span starts one token early
    prompt = [9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 8]
    assert reference_span(prompt, list(range(1, 12))) == (0, 11)
    # a 5-token answer: the early window holds 4 of 5 (0.8), so the span is exact
    assert reference_span([9, 1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5]) == (1, 6)
    # a repeated token counts once: {1, 2} at 0 covers all of the answer's set {1, 2}
    assert reference_span([1, 2, 2, 1, 2], [2, 1, 2]) == (0, 3)
    assert reference_span([7, 8, 9], [1, 2]) == (-1, -1)  # not found: no head can score


def test_reference_span_lowers_a_perfect_copiers_score_as_wu_et_al_s_code_would():
    lengths, depths = [400], [20.0, 60.0]
    exact = retrieval_scores(CopyModel(), needles=NEEDLES[:2], lengths=lengths, depths=depths)
    ref = retrieval_scores(CopyModel(), needles=NEEDLES[:2], lengths=lengths, depths=depths, span="reference")
    expected = []
    tok = ByteTokenizer()
    for sample in ref.samples.itertuples():
        needle = next(n for n in NEEDLES if n.question == sample.question)
        answer = tok.encode(needle.answer)
        n, wanted = len(answer), set(answer)
        ids = needle_prompt(tok, needle, sample.length, sample.depth, seed=0).ids
        start = next(i for i in range(len(ids)) if len(set(ids[i : i + n]) & wanted) / len(wanted) > 0.9)
        exact_start = ids.index(answer[0], start)  # the copier walks the answer's own bytes
        while ids[exact_start : exact_start + n] != answer:
            exact_start = ids.index(answer[0], exact_start + 1)
        assert (sample.span_start, sample.span_end) == (start, start + n)
        assert start < exact_start  # these answers are long: the reference's window starts early
        expected.append(max(0, n - (exact_start - start)) / n)  # copies that land inside the shifted window
    copier = ref.heads.set_index(["layer", "head"]).loc[(1, 0), "value"]
    assert copier == pytest.approx(np.mean(expected)) and copier < 1.0
    assert exact.heads.set_index(["layer", "head"]).loc[(1, 0), "value"] == pytest.approx(1.0)


def test_failed_samples_are_excluded_not_counted_as_zero():
    scores = retrieval_scores(CopyModel(fail_depths=[60.0]), needles=NEEDLES[:1], lengths=[500], depths=[20.0, 60.0])
    frame, samples = scores.heads, scores.samples
    assert samples.kept.tolist() == [True, False]
    row = frame[(frame["layer"] == 1) & (frame["head"] == 0)].iloc[0]
    assert row.value == pytest.approx(1.0) and row.n_kept == 1 and row.n_samples == 2
    assert row.forced_value == pytest.approx(1.0)  # forced, it copies in the failed sample too, which counts
    none = retrieval_scores(CopyModel(fail_depths=[20.0]), needles=NEEDLES[:1], lengths=[500], depths=[20.0]).heads
    assert none.value.isna().all() and (none.n_kept == 0).all()


def test_head_scores_average_the_kept_samples_copy_scores_by_hand():
    # two heads, three samples; sample 1 was answered wrongly, so its (large) copy scores do not count
    copies = pd.DataFrame(
        {"layer": [0, 0] * 3, "head": [0, 1] * 3, "layer_type": ["full"] * 6, "sample": [0, 0, 1, 1, 2, 2],
         "value": [0.5, 0.0, 1.0, 1.0, 0.25, 0.1], "set_value": [0.25, 0.0, 1.0, 1.0, 0.25, 0.1],
         "forced_value": 0.0, "forced_set_value": 0.0, "forced_mass": 0.0}  # (tests/test_forced_scores.py)
    )  # fmt: skip
    samples = pd.DataFrame({"sample": [0, 1, 2], "kept": [True, False, True]})
    heads = head_scores(copies, samples)
    assert heads[["layer", "head"]].values.tolist() == [[0, 0], [0, 1]]
    assert heads["value"].tolist() == pytest.approx([(0.5 + 0.25) / 2, (0.0 + 0.1) / 2])
    assert heads["set_value"].tolist() == pytest.approx([(0.25 + 0.25) / 2, (0.0 + 0.1) / 2])
    assert (heads["n_kept"] == 2).all() and (heads["n_samples"] == 3).all()
    none = head_scores(copies, samples.assign(kept=False))
    assert none["value"].isna().all() and (none["n_kept"] == 0).all()


def test_copy_table_holds_every_sample_including_failed_ones():
    scores = retrieval_scores(CopyModel(fail_depths=[60.0]), needles=NEEDLES[:1], lengths=[500], depths=[20.0, 60.0])
    copies = scores.copies
    assert sorted(copies["sample"].unique()) == [0, 1] and len(copies) == 2 * len(scores.heads)
    kept = copies[copies["sample"] == 0].set_index(["layer", "head"])["value"]
    assert scores.heads.set_index(["layer", "head"])["value"].equals(kept)  # one kept sample: its own scores
