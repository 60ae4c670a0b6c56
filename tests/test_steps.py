"""A run's step checkpoints as models (headprobe.core.steps, headprobe.model.step_checkpoint): kept with
``train --keep all``, chosen with ``analyze RUN --steps``, read from their DCP shards, and measured with step and
tokens columns in every table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from headprobe.core.identity import checkpoint_identity, identity_changes
from headprobe.core.steps import StepError, StepInfo, list_steps, parse_steps, select_steps
from headprobe.hooked import load_model
from headprobe.hooked.load import trained_positions
from headprobe.model.checkpoint import model_kind
from headprobe.results import read_table
from headprobe.testing import tiny_config
from tests.cli_checks import invoke, one_error
from trainer.config import TrainConfig, TrainError
from trainer.train import train
from trainer.train_state import training_differences

STEPS, EVERY, BATCH, SEQ = 6, 2, 2, 32


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A pt run of 6 steps of 2 x 32 tokens, a step checkpoint kept every 2 steps (``--keep all``)."""
    root = tmp_path_factory.mktemp("steps")
    (root / "model.json").write_text(tiny_config(vocab_size=264, max_seq_len=256).to_json())
    cfg = TrainConfig(config=str(root / "model.json"), out=str(root / "run"), steps=STEPS, batch_size=BATCH,
                      seq_len=SEQ, save_every=EVERY, keep="all", threads=1, progress=False)  # fmt: skip
    train(cfg)
    return root / "run"


def fake_run(root: Path, steps: list[int]) -> Path:
    """A run folder whose step folders hold only what choosing reads (state.json beside an empty dcp/)."""
    for step in steps:
        folder = root / f"step_{step:06d}"
        (folder / "dcp").mkdir(parents=True)
        (folder / "state.json").write_text(json.dumps({"step": step, "tokens": step * 64}))
    (root / ".step_000999.tmp").mkdir()  # a step being written is none of them
    return root


# ---------------------------------------------------------------------------------------------
# --keep all
# ---------------------------------------------------------------------------------------------
def test_keep_all_keeps_every_step_where_a_count_keeps_the_newest(run, tmp_path):
    assert [s for s, _ in list_steps(run)] == [2, 4, 6]
    (tmp_path / "model.json").write_text(tiny_config(vocab_size=264, max_seq_len=256).to_json())
    train(TrainConfig(config=str(tmp_path / "model.json"), out=str(tmp_path / "two"), steps=STEPS, batch_size=BATCH,
                      seq_len=SEQ, save_every=EVERY, keep=2, threads=1, progress=False))  # fmt: skip
    assert [s for s, _ in list_steps(tmp_path / "two")] == [4, 6]


def test_keep_takes_all_or_a_count_in_any_form_and_refuses_other_words():
    assert [TrainConfig(keep=k).keep for k in ("all", "ALL", " 3 ", 3, 0)] == [0, 0, 3, 3, 0]
    with pytest.raises(TrainError, match=r"`keep`: give a whole number, or all \(every one\), got 'some'"):
        TrainConfig(keep="some")
    res = invoke("train", "--keep", "every", "--preset", "toy-d16", "--steps", "1", "--out", "unused")
    one_error(res, 2, "--keep", "give a whole number, or all")


# ---------------------------------------------------------------------------------------------
# Choosing steps
# ---------------------------------------------------------------------------------------------
def test_steps_are_chosen_as_all_every_k_or_a_list(tmp_path):
    root = fake_run(tmp_path / "run", [100, 200, 250, 300, 800])
    names = lambda spec: [p.name for p in select_steps(root, spec)]  # noqa: E731
    assert names("all") == ["step_000100", "step_000200", "step_000250", "step_000300", "step_000800"]
    assert names("every:200") == ["step_000200", "step_000800"]
    assert names("800, 100") == ["step_000100", "step_000800"]
    assert parse_steps(" Every:50 ") == 50 and parse_steps("3,1,3") == [1, 3]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("150,300,700", "holds no step 150, 700; it holds steps 100, 200, 250, 300, 800"),
        ("every:7", "none of"),
        ("every:0", "every:K takes a whole number of steps K of at least 1"),
        ("first", "'first' is not a step"),
        ("", "no step is named"),
    ],
)
def test_a_step_choice_it_cannot_meet_is_refused_naming_what_the_run_holds(tmp_path, spec, says):
    root = fake_run(tmp_path / "run", [100, 200, 250, 300, 800])
    with pytest.raises(StepError, match=says.replace("(", r"\(").replace(")", r"\)")):
        select_steps(root, spec)


def test_a_run_without_steps_or_a_step_folder_given_as_the_run_is_refused(tmp_path):
    (tmp_path / "bare").mkdir()
    with pytest.raises(StepError, match=r"holds no step checkpoints.*--save-every K --keep all"):
        select_steps(tmp_path / "bare", "all")
    root = fake_run(tmp_path / "run", [100])
    with pytest.raises(StepError, match=f"one step checkpoint, not a run folder; give its run folder {root}"):
        select_steps(root / "step_000100", "all")


def test_long_step_lists_are_shortened_in_messages(tmp_path):
    root = fake_run(tmp_path / "run", list(range(10, 210, 10)))
    with pytest.raises(StepError, match=r"it holds steps 10, 20, 30, \.\.\. \(15 more\) \.\.\., 190, 200$"):
        select_steps(root, "5")


# ---------------------------------------------------------------------------------------------
# A step folder is a model
# ---------------------------------------------------------------------------------------------
def test_the_last_step_folder_is_the_final_checkpoint_bit_for_bit(run):
    """Two paths to the same weights: the trainer's own export at the end (`final/`, written from the model in
    memory) and our reader of the step's DCP shards."""
    step, final = load_model(run / f"step_{STEPS:06d}"), load_model(run / "final")
    ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(step.module(ids), final.module(ids))
        earlier = load_model(run / "step_000002").module(ids)
    assert not torch.equal(earlier, final.module(ids))  # an earlier step is another model
    assert step.name == f"{run.parent.name}-run-step_{STEPS:06d}"
    assert model_kind(run / "step_000002") == "step"
    assert trained_positions(run / "step_000002") == 256  # the config's max_seq_len, from state.json


def test_step_info_is_the_steps_and_tokens_trained(run):
    assert StepInfo.of(run / "step_000004") == StepInfo(4, 4 * BATCH * SEQ)
    assert StepInfo.of(run / "final") is None


def test_a_step_folders_identity_follows_its_shards(run, tmp_path):
    import shutil

    copy = tmp_path / "step_000002"
    shutil.copytree(run / "step_000002", copy)
    before = checkpoint_identity(copy)
    shard = next((copy / "dcp").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes() + b"\0")
    assert identity_changes(before, checkpoint_identity(copy)) == ["weights"]


def test_damaged_shards_are_one_line_naming_the_folder(run, tmp_path):
    import shutil

    copy = tmp_path / "s" / "step_000002"
    shutil.copytree(run / "step_000002", copy)
    for shard in (copy / "dcp").glob("*.distcp"):
        shard.write_bytes(b"")
    res = invoke("analyze", copy, "--metrics", "entropy", "--lengths", "32", "--samples", "1", "--out", tmp_path / "o")
    one_error(res, 2, f"{copy / 'dcp'}: the weights cannot be read (EOFError)", "give another step")


def test_a_damaged_state_file_is_one_line_naming_it(run, tmp_path):
    import shutil

    copy = tmp_path / "s" / "step_000002"
    shutil.copytree(run / "step_000002", copy)
    (copy / "state.json").write_text("{not json")
    res = invoke("analyze", copy, "--metrics", "entropy", "--lengths", "32", "--samples", "1", "--out", tmp_path / "o")
    one_error(res, 2, f"{copy / 'state.json'} cannot be read", "the step folder is damaged")


# ---------------------------------------------------------------------------------------------
# analyze RUN --steps
# ---------------------------------------------------------------------------------------------
def test_analyze_steps_measures_each_chosen_step_with_step_and_tokens_columns(run, tmp_path):
    out = tmp_path / "out"
    res = invoke("analyze", run, "--steps", "every:4,", "--metrics", "entropy", "--lengths", "32", "--samples", "1",
                 "--out", out, "--no-progress")  # fmt: skip
    one_error(res, 2, "--steps 'every:4,'", "every:K takes a whole number")
    res = invoke("analyze", run, "--steps", "2,6", "--metrics", "entropy", "--lengths", "32", "--samples", "1",
                 "--out", out, "--no-progress")  # fmt: skip
    assert res.exit_code == 0, res.output
    folders = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert folders == [f"{run.parent.name}-run-step_000002", f"{run.parent.name}-run-step_000006"]
    for folder, step in zip(folders, (2, 6), strict=True):
        for table in ("entropy", "analysis_summary"):
            frame = read_table(out / folder / f"{table}.parquet").frame
            assert list(frame.columns[:3]) == ["model", "step", "tokens"]
            assert set(frame["step"]) == {step} and set(frame["tokens"]) == {step * BATCH * SEQ}
    # the step's numbers are the final checkpoint's: the same weights through the other reader
    res = invoke("analyze", run / "final", "--metrics", "entropy", "--lengths", "32", "--samples", "1", "--out",
                 tmp_path / "final", "--no-progress")  # fmt: skip
    assert res.exit_code == 0, res.output
    final = read_table(next(p for p in (tmp_path / "final").iterdir() if p.is_dir()) / "entropy.parquet").frame
    last = read_table(out / folders[1] / "entropy.parquet").frame
    assert "step" not in final.columns
    assert last["value"].tolist() == final["value"].tolist()
    # resumable like any analysis: a rerun adds the steps not yet measured and skips the rest
    res = invoke("analyze", run, "--steps", "all", "--metrics", "entropy", "--lengths", "32", "--samples", "1",
                 "--out", out)  # fmt: skip
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    assert all(f"step_00000{k} entropy @ 32: done earlier, skipped" in said for k in (2, 6))
    assert "step_000004 entropy @ 32: done earlier" not in said and (out / f"{folders[0][:-1]}4").is_dir()


def test_analyze_steps_refuses_a_run_without_them_before_any_work(tmp_path):
    (tmp_path / "run").mkdir()
    res = invoke("analyze", tmp_path / "run", "--steps", "all", "--out", tmp_path / "out")
    one_error(res, 2, "holds no step checkpoints", "--keep all")
    assert not (tmp_path / "out").exists()
    fake_run(tmp_path / "r2", [10, 20])
    res = invoke("analyze", tmp_path / "r2", "--steps", "30", "--out", tmp_path / "out")
    one_error(res, 2, "holds no step 30; it holds steps 10, 20")
    assert not (tmp_path / "out").exists()


def test_the_toy_recipes_steps_profile_keeps_every_25th_pt_step_and_trains_as_the_qk_norm_one(tmp_path):
    from trainer.grid import Recipe, _run_config

    steps, plain = Recipe.load("toy", "qk-norm-steps"), Recipe.load("toy", "qk-norm")
    cfg = _run_config("toy-d64", 0, steps.runs["pt"], tmp_path / "pt", None, None)
    assert (cfg.save_every, cfg.keep, cfg.eval_every) == (25, 0, 25)  # "keep": "all"
    same = _run_config("toy-d64", 0, plain.runs["pt"], tmp_path / "pt", None, None)
    assert training_differences(cfg.to_dict(), same.to_dict()) == []  # the numbers it trains are the qk-norm grid's
    assert steps.runs["cpt"] == plain.runs["cpt"]
