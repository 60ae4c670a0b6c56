"""Head ablation held to independent references: a hand-built copy head whose removal zeroes a known
logit, zero ablation = the head's columns of the output projection zeroed (ours and a Hugging Face
model), mean ablation = TransformerLens' hook_z replaced by the head's mean over positions; the head
sets of ``headprobe ablate`` and its bad inputs."""

from __future__ import annotations

import copy
import math

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

import headprobe as hp
from headprobe.ablation import AblateSettings, conditions, ranked_heads
from headprobe.ablation.settings import AblateError
from headprobe.cli import app
from headprobe.hooked import HeadprobeModel
from headprobe.hooked.ablation import AblationError, Head, parse_heads
from headprobe.model.checkpoint import save_checkpoint
from headprobe.model.config import AttentionConfig, ModelConfig
from headprobe.model.tokenizer import ByteTokenizer
from headprobe.model.transformer import Transformer
from headprobe.results import TableMeta, write_table
from headprobe.testing import build_toy_hf_model, tiny_config


def copy_head_model() -> HeadprobeModel:
    """One layer, two heads of width 2, d_model 8, no MLP. Every token embeds to e0 + e1 (scaled by id);
    head 0's values copy e0 into e4, head 1's copy e1 into e6; the LM head reads token 5's logit off e4
    and token 6's off e6, nothing else. So token 5's logit is non-zero only through head 0, and exactly
    zero once head 0 is ablated; head 1's ablation zeroes token 6's logit and leaves token 5's."""
    att = AttentionConfig(n_heads=2, qk_head_dim=2, v_head_dim=2, window=None)
    cfg = ModelConfig(vocab_size=8, d_model=8, n_layers=1, d_ff=4, swa=att, full=att, full_every=1,
                      tie_embeddings=False, max_seq_len=64)  # fmt: skip
    net = Transformer(cfg).double()
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        net.blocks[0].ln1.weight.fill_(1.0)
        net.blocks[0].ln2.weight.fill_(1.0)
        net.ln_final.weight.fill_(1.0)
        net.embed.weight[:, 0] = 1.0 + torch.arange(8.0)
        net.embed.weight[:, 1] = 2.0
        attn = net.blocks[0].attn
        attn.v_proj.weight[0, 0] = 1.0  # head 0's value dim 0 <- residual e0
        attn.v_proj.weight[2, 1] = 1.0  # head 1's value dim 0 <- residual e1
        attn.o_proj.weight[4, 0] = 1.0  # residual e4 <- head 0's output dim 0
        attn.o_proj.weight[6, 2] = 1.0  # residual e6 <- head 1's output dim 0
        net.lm_head.weight[5, 4] = 1.0
        net.lm_head.weight[6, 6] = 1.0
    return HeadprobeModel(net, ByteTokenizer(), "copy")


def test_a_copy_head_removed_zeroes_the_logit_it_wrote():
    model = copy_head_model()
    ids = torch.tensor([[1, 3, 2, 0]])
    plain = model.logits(ids)[0, -1]
    assert plain[5] > 0.5 and plain[6] > 0.5 and plain[0] == 0
    with model.ablate([Head(0, 0)], "zero"):
        cut = model.logits(ids)[0, -1]
    assert cut[5] == 0.0 and cut[6] > 0.5  # only head 0 wrote token 5's direction
    with model.ablate([Head(0, 1)], "zero"):
        other = model.logits(ids)[0, -1]
    assert other[6] == 0.0 and other[5] > 0.5
    # by hand: ln1 scales each embedding row to unit RMS, head 0's value is its first entry, queries and keys
    # are zero so each row attends uniformly to its prefix; ln_final scales the last residual row
    emb = torch.stack([1.0 + ids[0].double(), torch.full((4,), 2.0, dtype=torch.float64)], dim=1)
    eps = model.model.cfg.norm_eps  # RMSNorm: x / sqrt(mean(x^2) + eps)
    unit = emb / (emb.pow(2).sum(1, keepdim=True) / 8 + eps).sqrt()
    out0 = unit[:, 0].cumsum(0) / torch.arange(1, 5)  # head 0's output at each position
    out1 = unit[:, 1].cumsum(0) / torch.arange(1, 5)

    def logit5(head0: torch.Tensor) -> torch.Tensor:
        x = torch.zeros(8, dtype=torch.float64)
        x[0], x[1], x[4], x[6] = emb[-1, 0], emb[-1, 1], head0, out1[-1]
        return x[4] / (x.pow(2).mean() + eps).sqrt()

    assert torch.allclose(plain[5], logit5(out0[-1]), atol=1e-12, rtol=0)
    with model.ablate([Head(0, 0)], "mean"):  # head 0 writes its mean output over the prompt's positions
        mean = model.logits(ids)[0, -1]
    assert torch.allclose(mean[5], logit5(out0.mean()), atol=1e-12, rtol=0)
    assert torch.equal(model.logits(ids)[0, -1], plain)  # removed when the context closed


def _zeroed_columns(net: Transformer, heads: list[Head]) -> Transformer:
    """An independent reference: ``net`` with each ablated head's input columns of ``o_proj`` zeroed."""
    ref = copy.deepcopy(net)
    with torch.no_grad():
        for h in heads:
            attn = ref.blocks[h.layer].attn
            width = attn.cfg.v_head_dim
            attn.o_proj.weight[:, h.head * width : (h.head + 1) * width] = 0
    return ref


def test_zero_ablation_equals_the_head_s_output_projection_zeroed_ours():
    torch.manual_seed(0)
    net = Transformer(tiny_config()).double()
    model = HeadprobeModel(net, ByteTokenizer(), "tiny")
    heads = [Head(1, 2), Head(3, 0)]  # a grouped-query sliding layer and the full layer (qk 16 != v 4)
    ids = torch.randint(0, 40, (1, 23))
    with model.ablate(heads, "zero"):
        got = model.logits(ids)
        tokens = model.decode(ids, 6, [])
    ref = HeadprobeModel(_zeroed_columns(net, heads), ByteTokenizer(), "ref")
    assert torch.allclose(got, ref.logits(ids), atol=1e-12, rtol=0)
    assert not torch.allclose(got, model.logits(ids), atol=1e-6)  # the ablation did something
    assert tokens == ref.decode(ids, 6, [])  # through the KV cache too


def test_zero_ablation_equals_the_head_s_output_projection_zeroed_hf(tmp_path):
    folder = build_toy_hf_model("llama", tmp_path / "llama", layers=2, heads=4, kv_heads=2)
    model = hp.load_model(folder, dtype=torch.float64)
    ids = torch.randint(3, 500, (1, 17))
    heads = [Head(0, 3), Head(1, 1)]
    with model.ablate(heads, "zero"):
        got = model.logits(ids)
    with torch.no_grad():
        for h in heads:
            o = model.hf.model.layers[h.layer].self_attn.o_proj
            o.weight[:, h.head * 16 : (h.head + 1) * 16] = 0  # head_dim 16
    assert torch.allclose(got, model.logits(ids), atol=1e-10, rtol=0)


def test_mean_ablation_equals_hook_z_replaced_by_the_head_mean():
    """TransformerLens' hook_z ([batch, pos, heads, v_dim]) is the per-head output before o_proj: the
    reference replaces the head's z by its mean over the positions. One layer, so each decode step's
    running mean (over every position so far) is the full pass's mean at the last position."""
    torch.manual_seed(1)
    net = Transformer(tiny_config(n_layers=1, full_every=1)).double()
    model = HeadprobeModel(net, ByteTokenizer(), "one")
    ids = torch.randint(0, 40, (1, 19))

    def reference(seq: torch.Tensor) -> torch.Tensor:
        def mean_z(z, hook):
            z = z.clone()
            z[:, :, 1] = z[:, :, 1].mean(1, keepdim=True)
            return z

        return net.run_with_hooks(seq, fwd_hooks=[("blocks.0.attn.hook_z", mean_z)])

    with model.ablate([Head(0, 1)], "mean"):
        got = model.logits(ids)
        tokens = model.decode(ids, 5, [])
    assert torch.allclose(got, reference(ids), atol=1e-12, rtol=0)
    seq = ids
    for token in tokens:  # each greedy token is the reference's argmax over the sequence so far
        assert int(reference(seq)[0, -1].argmax()) == token
        seq = torch.cat([seq, torch.tensor([[token]])], dim=1)


def test_ablation_refuses_heads_the_model_lacks_and_always_detaches():
    model = HeadprobeModel(Transformer(tiny_config()), ByteTokenizer(), "tiny")
    lacks = r"tiny has no head 4\.0,3\.2: it has layers 0-3 with 2 or 4 heads"
    with pytest.raises(AblationError, match=lacks), model.ablate([Head(4, 0), Head(3, 2), Head(0, 3)], "zero"):
        pass
    with pytest.raises(ValueError, match="unknown ablation mode 'half'"), model.ablate([Head(0, 0)], "half"):
        pass
    with pytest.raises(RuntimeError, match="inside"), model.ablate([Head(0, 0)], "zero"):
        raise RuntimeError("inside")
    assert not model.seam._interventions
    with pytest.raises(AblationError, match="one sequence at a time"), model.ablate([Head(3, 1)], "mean"):
        model.decode_batch([torch.tensor([[1, 2, 3]]), torch.tensor([[4, 5]])], 3, [])
    assert parse_heads("17.3, 18.7,17.3") == [Head(17, 3), Head(18, 7)]
    with pytest.raises(AblationError, match=r"is not LAYER\.HEAD"):
        parse_heads("17-3")


def _retrieval_folder(folder, scores: dict[tuple[int, int], float], model: str = "m") -> None:
    rows = [{"model": model, "layer": layer, "head": head, "layer_type": "full", "value": v, "n_kept": 1,
             "n_samples": 1, "length": n} for (layer, head), v in scores.items() for n in (256, 512)]  # fmt: skip
    write_table(folder / model / "retrieval.parquet", pd.DataFrame(rows), TableMeta("retrieval", model))


def test_head_sets_top_and_random(tmp_path):
    every = [Head(layer, head) for layer in range(3) for head in range(4)]
    scores = {(h.layer, h.head): 0.0 for h in every}
    scores.update({(2, 1): 0.9, (0, 3): 0.5, (1, 0): 0.5, (1, 2): math.nan, (2, 2): 0.1, (0, 0): 0.09})
    _retrieval_folder(tmp_path, scores)
    ranking = ranked_heads(tmp_path, None, "m")  # tables that record no checkpoint are taken by name
    ranked = ranking.heads
    assert ranking.model == "m" and ranked[:4] == [Head(2, 1), Head(0, 3), Head(1, 0), Head(2, 2)]
    assert Head(1, 2) not in ranked and ranking.retrieval_heads == {Head(2, 1), Head(0, 3), Head(1, 0), Head(2, 2)}
    s = AblateSettings(heads=["top:3", "random:3", "0.0,2.3"], seeds=[0, 1, 2], modes=["zero", "mean"],
                       from_results=str(tmp_path))  # fmt: skip
    runs = conditions(s, every, ranking)
    assert [c.label for c in runs][:6] == [
        "baseline", "top3-zero", "random3-zero-s0", "random3-zero-s1", "random3-zero-s2", "heads-0.0_2.3-zero"
    ]  # fmt: skip
    both = conditions(AblateSettings(heads=["top:3", "top:2", "random:2", "random:3"], seeds=[0]), every, ranking)
    assert len({c.label for c in both}) == len(both) == 5  # sets of two sizes are two conditions, two files
    assert len(runs) == 1 + 2 * (1 + 3 + 1)
    top = set(runs[1].heads)
    assert top == {Head(2, 1), Head(0, 3), Head(1, 0)}
    drawn = [set(c.heads) for c in runs if c.condition == "random" and c.mode == "zero"]
    # random sets: no top head, and no other retrieval head either (2.2 scores 0.1); 0.0 (0.09) may be drawn
    assert all(len(d) == 3 and not d & (top | {Head(2, 2)}) for d in drawn) and len({frozenset(d) for d in drawn}) == 3
    again = [set(c.heads) for c in conditions(s, every, ranking) if c.condition == "random" and c.mode == "zero"]
    assert again == drawn  # the same sets for the same seeds
    assert runs[5].heads == (Head(0, 0), Head(2, 3)) and runs[5].columns()["heads"] == "0.0,2.3"
    # heads scoring 0 are not ranked: 5 copied the needle at all (0.0 with 0.09 too), 4 of them >= 0.1
    assert len(ranked) == 5 and ranked[4] == Head(0, 0)
    with pytest.raises(AblateError, match=r"top:20: only 5 heads of m in .* copied the needle at all .*4 of them"):
        conditions(AblateSettings(heads=["top:20"], from_results=str(tmp_path)), every, ranking)
    with pytest.raises(AblateError, match="random:9: only 8 heads are not retrieval heads"):  # 12 - 4 (1.2: unscored)
        conditions(AblateSettings(heads=["random:9"], from_results=str(tmp_path)), every, ranking)


def test_ranked_heads_says_what_is_wrong_with_the_folder(tmp_path):
    with pytest.raises(
        AblateError, match=r"holds no retrieval table .*; run `headprobe analyze MODEL --metrics retrieval --out NEW"
    ):
        ranked_heads(tmp_path, None, "m")
    _retrieval_folder(tmp_path / "a", {(0, 0): math.nan, (0, 1): math.nan})
    with pytest.raises(AblateError, match="scores no head: no needle sample was kept"):
        ranked_heads(tmp_path / "a", None, "m")
    _retrieval_folder(tmp_path / "b", {(0, 0): 0.5}, model="x")
    _retrieval_folder(tmp_path / "b", {(0, 0): 0.5}, model="y")
    with pytest.raises(
        AblateError, match=r"holds retrieval scores of x \(another model\), y \(another model\), not of m;"
    ):
        ranked_heads(tmp_path / "b", None, "m")


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ck") / "tiny"
    save_checkpoint(Transformer(tiny_config(vocab_size=264, max_seq_len=1024)), path, ByteTokenizer())
    return path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--heads", "top:3"], "--heads top:K ranks heads by their retrieval scores: give --from"),
        (["--heads", "top:3", "--from", "{tmp}/none"], "--from {tmp}/none is not a folder"),
        (["--heads", "top:3", "--from", "{tmp}"], "and give --from NEW_FOLDER"),
        (["--heads", "9.0"], "tiny has no head 9.0: it has layers 0-3"),
        (["--heads", "top:0", "--from", "{tmp}"], "--heads 'top:0': write top:K or random:K with K >= 1"),
        (["--heads", "1.0", "--tasks", "needle,vt"], "--tasks vt: choose among needle, niah_single_1"),
        (["--heads", "1.0", "--modes", "half"], "unknown ablation mode 'half'"),
        (["--heads", "1.0", "--depths", "50,120"], "--depths: give a value from 0 to 100, got 120.0"),
        (
            ["--heads", "top:3", "--from", "{tmp}", "--score", "needle_mass"],
            "holds no needle_mass table (`headprobe analyze --metrics needle_mass` writes it); run `headprobe analyze",
        ),
        (
            ["--heads", "top:3", "--from", "{tmp}", "--score", "wu"],
            "--score wu: choose among retrieval, retrieval_forced, needle_mass, query_focus, echo, induction",
        ),
    ],
)
def test_ablate_refuses_bad_inputs_before_any_work(tmp_path, tiny_ckpt, args, message):
    out = tmp_path / "out"
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    res = CliRunner().invoke(app, ["ablate", str(tiny_ckpt), "--out", str(out), "--lengths", "256", *args])
    assert res.exit_code == 2, res.output
    assert message.replace("{tmp}", str(tmp_path)) in " ".join(res.output.split()), res.output
    assert "Traceback" not in res.output and not out.exists()


def test_ablate_runs_resumes_and_shows(tmp_path, tiny_ckpt, monkeypatch):
    """A random model answers nothing right: what is checked is the tables' shape, that every condition
    decodes the same prompts, the resume and ``show``."""
    out = tmp_path / "out"
    args = ["ablate", str(tiny_ckpt), "--out", str(out), "--lengths", "256", "--depths", "0,100", "--samples", "1",
            "--heads", "1.0,3.1", "--heads", "random:2", "--seeds", "0,1", "--modes", "zero,mean",
            "--max-new-tokens", "4", "--no-progress"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    samples = pd.read_parquet(out / "tiny" / "ablation_samples.parquet")
    table = pd.read_parquet(out / "tiny" / "ablation.parquet")
    assert len(samples) == 2 * (1 + 2 * (1 + 2)) and set(samples["model"]) == {"tiny"}
    assert samples.groupby(["condition", "mode", "seed"])["token_count"].apply(list).map(tuple).nunique() == 1
    assert set(table["n"]) == {1} and set(table["depth"]) == {0.0, 100.0}
    assert "baseline" in res.output and "random 2 zero" in res.output and "1.0,3.1 mean" in res.output
    import headprobe.ablation.job as job

    monkeypatch.setattr(job, "decode_prompts", lambda *a, **k: pytest.fail("decoded again"))
    assert CliRunner().invoke(app, args).exit_code == 0  # every part done: nothing decodes
    shown = CliRunner().invoke(app, ["show", str(out), "--metric", "ablation"])
    assert shown.exit_code == 0 and "needle accuracy with heads ablated" in shown.output


def _definition_folder(folder, name: str, scores: dict[tuple[int, int], float], model: str = "m") -> None:
    rows = [{"model": model, "layer": layer, "head": head, "layer_type": "full", "value": v, "length": 256}
            for (layer, head), v in scores.items()]  # fmt: skip
    write_table(folder / model / f"{name}.parquet", pd.DataFrame(rows), TableMeta(name, model))


def test_top_sets_by_other_definitions_are_their_own_conditions_beside_one_random_control(tmp_path):
    """Two definitions rank the same 8 heads differently; each top:2 is its own condition (``top:<definition>``),
    and the random sets avoid both top sets (no retrieval-head threshold on these scales: negative scores and
    zeros are merely not ranked)."""
    every = [Head(layer, head) for layer in range(2) for head in range(4)]
    mass = {(h.layer, h.head): 0.0 for h in every} | {(1, 2): 0.6, (0, 1): 0.3, (1, 3): 0.01}
    logit = {(h.layer, h.head): -0.5 for h in every} | {(0, 0): 2.0, (1, 2): 1.5}
    _definition_folder(tmp_path, "needle_mass", mass)
    _definition_folder(tmp_path, "logit_contrib", logit)
    rankings = [ranked_heads(tmp_path, None, "m", name) for name in ("needle_mass", "logit_contrib")]
    assert rankings[0].heads == [Head(1, 2), Head(0, 1), Head(1, 3)] and rankings[0].retrieval_heads == set()
    assert rankings[1].heads == [Head(0, 0), Head(1, 2)] and rankings[1].score == "logit_contrib"
    s = AblateSettings(heads=["top:2", "random:3"], seeds=[0, 1], from_results=str(tmp_path),
                       score=["needle_mass", "logit_contrib"])  # fmt: skip
    runs = conditions(s, every, *rankings)
    assert [c.label for c in runs] == ["baseline", "top-needle_mass2-zero", "top-logit_contrib2-zero",
                                       "random3-zero-s0", "random3-zero-s1"]  # fmt: skip
    assert runs[1].condition == "top:needle_mass" and set(runs[1].heads) == {Head(1, 2), Head(0, 1)}
    assert runs[2].condition == "top:logit_contrib" and set(runs[2].heads) == {Head(0, 0), Head(1, 2)}
    tops = {Head(1, 2), Head(0, 1), Head(0, 0)}
    assert all(not set(c.heads) & tops for c in runs[3:])
    with pytest.raises(AblateError, match=r"top:3: only 2 heads of m in .* score above 0 by logit_contrib; ask for"):
        conditions(AblateSettings(heads=["top:3"], score=["logit_contrib"]), every, rankings[1])
    _definition_folder(tmp_path / "none", "query_focus", {(0, 0): math.nan})
    with pytest.raises(AblateError, match=r"scores no head: no sample had a number .*query_focus_samples"):
        ranked_heads(tmp_path / "none", None, "m", "query_focus")
