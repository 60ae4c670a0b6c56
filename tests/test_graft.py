"""``headprobe graft`` (headprobe.graft, docs/mechanisms.md): hybrids exact to the bit (all parts = the donor's
logits, none = the base's, attention from a cpt-frozen donor = the base), the part groups of our checkpoints and
Hugging Face models, two architectures refused before any work, the held-out loss against the trainer's own
loss, and the command end to end (resumable, its table beside analyze's)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from headprobe.cli import app
from headprobe.graft import GraftError, PartsError, grafted, parse_parts
from headprobe.graft.hybrid import selected
from headprobe.graft.measure import heldout_losses
from headprobe.graft.parts import group_of, layer_of
from headprobe.hooked import HeadprobeModel, load_model
from headprobe.model.checkpoint import save_checkpoint
from headprobe.model.eval_loss import split_losses
from headprobe.model.tokenizer import ByteTokenizer
from headprobe.model.transformer import Transformer
from headprobe.results import read_table
from headprobe.testing import build_toy_hf_model, tiny_config
from headprobe.text.heldout import eval_rows
from trainer.config import TrainConfig
from trainer.train import train

CONFIG = tiny_config(vocab_size=264, max_seq_len=256)
IDS = torch.tensor([list(b"The old ferry crossed at dawn, and the code was 4721 for the night.")])


def model(seed: int, config=CONFIG, name: str = "m") -> HeadprobeModel:
    torch.manual_seed(seed)
    return HeadprobeModel(Transformer(config), ByteTokenizer(), name)


def params(m) -> dict[str, torch.Tensor]:
    return dict(m.module.named_parameters(remove_duplicate=False))


def test_all_parts_give_the_donors_logits_none_the_bases_and_a_part_set_exactly_its_own_weights():
    base, donor = model(0, name="base"), model(1, name="donor")
    assert torch.equal(grafted(base, donor, "all").logits(IDS), donor.logits(IDS))
    assert torch.equal(grafted(base, donor, "none").logits(IDS), base.logits(IDS))
    hybrid = grafted(base, donor, "mlp:1+attn.qk:0")
    mine, b, d = params(hybrid), params(base), params(donor)
    moved = {n for n in mine if n.startswith(("blocks.1.mlp.", "blocks.0.attn.q_proj", "blocks.0.attn.k_proj"))}
    assert len(moved) == 5  # gate, up, down of block 1; q and k of block 0
    for name, tensor in mine.items():
        assert torch.equal(tensor, d[name] if name in moved else b[name]), name
    assert not torch.equal(hybrid.logits(IDS), base.logits(IDS))
    assert torch.equal(params(base)["blocks.1.mlp.up_proj.weight"], b["blocks.1.mlp.up_proj.weight"])  # base untouched
    assert hybrid.name == "base+donor[mlp:1+attn.qk:0]"
    with base.ablate([]):  # the hybrid's seam is its own: hooks on the base do not reach it
        assert hybrid.seam is not base.seam


def test_attention_from_a_donor_trained_with_frozen_attention_changes_nothing(tmp_path):
    """The study's cpt-frozen run: the trainer's own frozen-attention cpt, then its attention grafted into the pt
    checkpoint it started from gives the pt model's logits bit for bit, and every other part gives the donor's."""
    (tmp_path / "m.json").write_text(tiny_config(vocab_size=264, max_seq_len=64).to_json())
    common = dict(batch_size=2, seq_len=64, warmup_steps=1, progress=False)
    train(TrainConfig(config=str(tmp_path / "m.json"), out=str(tmp_path / "pt"), steps=3, lr=3e-3, **common))
    train(TrainConfig(stage="cpt", init=str(tmp_path / "pt" / "final"), out=str(tmp_path / "cpt"), steps=3,
                      freeze="attention", **common))  # fmt: skip
    pt, frozen = load_model(tmp_path / "pt" / "final"), load_model(tmp_path / "cpt" / "final")
    assert not torch.equal(pt.logits(IDS), frozen.logits(IDS))  # cpt changed the model ...
    assert torch.equal(grafted(pt, frozen, "attn").logits(IDS), pt.logits(IDS))  # ... not its attention
    assert torch.equal(grafted(pt, frozen, "embed+norms+mlp").logits(IDS), frozen.logits(IDS))


def test_a_hugging_face_model_grafts_by_its_own_parameter_names(tmp_path):
    base = load_model(build_toy_hf_model("qwen3", tmp_path / "a", layers=2, seed=0))
    donor = load_model(build_toy_hf_model("qwen3", tmp_path / "b", layers=2, seed=1))
    ids = torch.tensor([[1, 5, 9, 200, 17, 3, 44, 45]])
    assert torch.equal(grafted(base, donor, "all").logits(ids), donor.logits(ids))
    assert torch.equal(grafted(base, donor, "none").logits(ids), base.logits(ids))
    qk = selected(base, "attn.qk:1")
    assert qk == [f"model.layers.1.self_attn.{p}.weight" for p in ("q_proj", "k_proj", "q_norm", "k_norm")]
    norms = selected(base, "norms")
    assert "model.norm.weight" in norms and "model.layers.0.input_layernorm.weight" in norms
    assert not any("self_attn" in n for n in norms)  # the query/key norms are attention's
    assert selected(base, "param:*.mlp.up_proj.*") == [f"model.layers.{i}.mlp.up_proj.weight" for i in (0, 1)]


@pytest.mark.parametrize(
    ("name", "layer", "group"),
    [
        ("embed.weight", None, "embed"),
        ("lm_head.weight", None, "unembed"),
        ("ln_final.weight", None, "norms"),
        ("blocks.3.ln1.weight", 3, "norms"),
        ("blocks.2.attn.q_norm.weight", 2, "attn.qk"),
        ("blocks.0.attn.o_proj.weight", 0, "attn.vo"),
        ("blocks.12.mlp.down_proj.weight", 12, "mlp"),
        ("model.embed_tokens.weight", None, "embed"),
        ("model.norm.weight", None, "norms"),
        ("model.layers.7.post_attention_layernorm.weight", 7, "norms"),
        ("model.layers.7.self_attn.v_proj.bias", 7, "attn.vo"),
        ("model.layers.7.self_attn.sinks", 7, "attn"),
    ],
)
def test_every_parameter_name_belongs_to_one_group(name, layer, group):
    assert layer_of(name) == layer and group_of(name) == group


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("mlps", "unknown part 'mlps'"),
        ("embed:3", "embed has no layers"),
        ("mlp:2-1", "layers '2-1'"),
        ("attn:x", "layers 'x'"),
        ("param:", "needs a glob"),
        ("", "an empty part set"),
    ],
)
def test_a_part_set_that_does_not_read_is_refused_naming_it(spec, message):
    with pytest.raises(PartsError, match=message):
        parse_parts(spec)


def test_a_tied_embedding_is_one_weight_and_a_set_naming_nothing_is_refused():
    tied = tiny_config(vocab_size=264, max_seq_len=256, tie_embeddings=True)
    base, donor = model(0, tied), model(1, tied)
    assert selected(base, "embed") == selected(base, "unembed") == ["embed.weight", "lm_head.weight"]
    hybrid = grafted(base, donor, "unembed")
    assert torch.equal(params(hybrid)["embed.weight"], params(donor)["embed.weight"])
    assert parse_parts("mlp:0-1,3").groups[0].layers == (0, 1, 3)
    with pytest.raises(PartsError, match="names no parameter"):
        grafted(base, donor, "mlp:40")


def test_two_architectures_are_refused_naming_the_difference():
    wide = tiny_config(vocab_size=264, max_seq_len=256, d_ff=CONFIG.d_ff * 2)
    with pytest.raises(GraftError, match=r"differ in their configuration \(d_ff"):
        grafted(model(0), model(1, wide), "mlp")
    trained_longer = tiny_config(vocab_size=264, max_seq_len=1024)  # the trained length is no architecture
    assert torch.equal(grafted(model(0), model(1, trained_longer), "all").logits(IDS), model(1).logits(IDS))


def test_the_held_out_loss_of_any_model_equals_the_trainers_loss_of_ours():
    m = model(3)
    mine = heldout_losses(m)
    theirs = split_losses(m.model, eval_rows(m.tokenizer))
    for name, value in theirs.items():
        assert mine[name][0] == pytest.approx(value, rel=1e-5)
    assert mine["eval_loss"][1] == sum(mine[k][1] for k in ("eval_loss_local", "eval_loss_retrieval"))


def test_graft_writes_its_table_resumes_and_refuses_two_architectures_before_any_work(tmp_path):
    base = save_checkpoint(model(0).model, tmp_path / "base")
    donor = save_checkpoint(model(1).model, tmp_path / "donor")
    args = ["graft", str(base), str(donor), "--parts", "mlp", "--parts", "attn:0+norms", "--lengths", "200",
            "--samples", "2", "--needles", "codes", "--max-new-tokens", "8", "--no-progress"]  # fmt: skip
    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "g")], env={"COLUMNS": "300"})
    assert res.exit_code == 0, res.output
    table = read_table(tmp_path / "g" / "base" / "graft.parquet").frame
    assert list(dict.fromkeys(table["parts"])) == ["none", "mlp", "attn:0+norms", "all"]
    assert set(table["metric"]) == {"needle_accuracy", "needle_prefix", "retrieval_heads", "forced_retrieval_heads",
                                    "reading_heads", "top_forced_mass", "eval_loss", "eval_loss_local",
                                    "eval_loss_retrieval"}  # fmt: skip
    counts = table.drop_duplicates("parts").set_index("parts")["n_parameters"]
    assert counts["none"] == 0 and counts["mlp"] == 3 * CONFIG.n_layers and counts["all"] == len(params(model(0)))
    # the base's and the donor's own held-out losses, measured as models, not as hybrids
    losses = table[table.metric == "eval_loss"].set_index("parts")["value"]
    assert losses["none"] == pytest.approx(heldout_losses(load_model(base))["eval_loss"][0], rel=1e-9)
    assert losses["all"] == pytest.approx(heldout_losses(load_model(donor))["eval_loss"][0], rel=1e-9)
    assert "graft: each part set's hybrid" in res.output
    again = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "g")], env={"COLUMNS": "300"})
    assert again.exit_code == 0 and again.output.count("done earlier") == 4
    other = save_checkpoint(Transformer(tiny_config(vocab_size=264, max_seq_len=256, d_ff=96)), tmp_path / "o")
    res = CliRunner().invoke(app, ["graft", str(base), str(other), "--lengths", "200", "--out", str(tmp_path / "h")])
    assert res.exit_code != 0 and "differ in their configuration (d_ff" in " ".join(res.output.split())
    assert not (tmp_path / "h" / "base").exists()  # nothing measured, nothing written for it
    res = CliRunner().invoke(app, ["graft", str(base), str(donor), "--lengths", "24", "--out", str(tmp_path / "i")])
    assert res.exit_code == 2 and "too short for the needle" in res.output and "--lengths" in res.output
    assert not (tmp_path / "i").exists()
    assert not math.isnan(losses["mlp"]) and "graft" in json.dumps(
        json.loads((tmp_path / "g" / "run.json").read_text())
    )
