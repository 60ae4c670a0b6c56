"""The train and data commands end to end (typer's runner, in process)."""

from __future__ import annotations

import json

import torch
from typer.testing import CliRunner

from headprobe.cli import app
from headprobe.model.checkpoint import load_checkpoint
from headprobe.testing import tiny_config
from trainer.data import TokenData
from trainer.mfu import mfu, peak_flops

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "300"})


def test_data_and_train_commands(tmp_path):
    src = tmp_path / "corpus.txt"
    src.write_text("A small document about keys and doors. " * 200)
    res = invoke("data", "prepare", str(src), "--out", str(tmp_path / "data"))
    assert res.exit_code == 0, res.output
    assert "7,801 tokens" in res.output  # 39 bytes x 200 + one end-of-document token
    assert len(TokenData(tmp_path / "data")) == 7801
    assert invoke("data", "verify", str(tmp_path / "data")).exit_code == 0

    cfg = tmp_path / "model.json"
    cfg.write_text(tiny_config(vocab_size=264, max_seq_len=64).to_json())
    res = invoke(
        "train",
        "--config",
        str(cfg),
        "--data",
        str(tmp_path / "data"),
        "--steps",
        "3",
        "--batch-size",
        "2",
        "--seq-len",
        "32",
        "--out",
        str(tmp_path / "run"),
        "--save-every",
        "2",
    )
    assert res.exit_code == 0, res.output
    assert "done: 3 steps, 192 tokens" in res.output
    model, _ = load_checkpoint(tmp_path / "run" / "final")
    res = invoke("train", "export", str(tmp_path / "run" / "step_000003"), str(tmp_path / "exported"))
    assert res.exit_code == 0, res.output
    exported, _ = load_checkpoint(tmp_path / "exported")
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), exported.state_dict().values(), strict=True)
    )


def test_synth_command(tmp_path):
    res = invoke("data", "synth", "--tokens", "3000", "--out", str(tmp_path / "s"))
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert manifest["total_tokens"] >= 3000 and f"{manifest['total_tokens']:,} tokens" in res.output


def test_errors_exit_with_a_message(tmp_path):
    res = invoke("train", "--stage", "cpt", "--out", str(tmp_path / "r"), "--steps", "1")
    assert res.exit_code == 2 and "give --init" in res.output
    res = invoke("data", "prepare", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "d"))
    assert res.exit_code == 2 and "does not exist" in res.output
    res = invoke("train", "--stage", "rl", "--out", str(tmp_path / "r"))
    assert res.exit_code == 2 and "'rl' is not one of" in res.output and "--stage" in res.output


def test_mfu_arithmetic():
    # 6e9 FLOP/token x 10,000 tokens/s over 2 devices of 100 TFLOP/s = 30%
    assert mfu(6e9, 10_000, 100e12, 2) == 0.3
    assert mfu(6e9, 10_000, None, 1) is None
    assert peak_flops(torch.device("cpu")) is None and peak_flops(torch.device("cpu"), 5e12) == 5e12


def test_train_flags_are_the_config_fields_with_their_defaults():
    """`headprobe train` has one option per TrainConfig field (the dataclass is the one place for defaults),
    and the values given reach the run's recorded config."""
    import dataclasses
    from enum import Enum

    from typer.main import get_command

    from headprobe.core.settings import parse_count
    from trainer.config import TrainConfig

    def plain(value):
        return value.value if isinstance(value, Enum) else value

    params = {p.name: p for p in get_command(app).commands["train"].params}
    fields = dataclasses.fields(TrainConfig)
    assert set(params) == {f.name for f in fields}
    for f in fields:
        given = params[f.name].default  # a count (`--keep`) as its text: a number, or `all`
        given = parse_count(given) if f.metadata.get("form") == "count" else given
        assert plain(given) == plain(f.default), f.name
        assert params[f.name].help == f.metadata["help"]
    assert params["batch_size"].opts == ["--batch-size"] and "--no-resume" in params["resume"].secondary_opts


def test_train_flag_values_reach_the_config(tmp_path):
    cfg = tmp_path / "model.json"
    cfg.write_text(tiny_config(vocab_size=264, max_seq_len=32).to_json())
    args = ["train", "--config", str(cfg), "--steps", "1", "--batch-size", "2", "--out", str(tmp_path / "run")]
    res = invoke(*args, "--lr", "0.01", "--beta2", "0.9", "--schedule", "wsd", "--freeze", "attention-full")
    assert res.exit_code == 0, res.output
    saved = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert (saved["lr"], saved["beta2"], saved["schedule"], saved["freeze"]) == (0.01, 0.9, "wsd", "attention-full")
    assert saved["frozen"] == [f"blocks.3.attn.{p}_proj.weight" for p in "qkvo"]  # the one full layer


def test_synth_tasks_command_writes_masked_data_and_trains_on_it(tmp_path):
    res = invoke(
        "data", "synth", "--tokens", "8000", "--out", str(tmp_path / "t"), "--tasks", "recall=1,copy=1",
        "--distance", "100:200", "--pairs", "2:3",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    data = TokenData(tmp_path / "t", verify=True)
    assert all(s.mask_file for s in data.manifest.shards)
    assert data.manifest.extra["tasks"]["settings"]["distance"] == [100, 200]
    assert 0 < data.masks(0, len(data)).mean() < 0.5  # only the recalled values and copies are targets
    cfg = tmp_path / "model.json"
    cfg.write_text(tiny_config(vocab_size=264, max_seq_len=64).to_json())
    args = ["--config", str(cfg), "--data", str(tmp_path / "t"), "--steps", "2", "--batch-size", "2"]
    res = invoke("train", *args, "--seq-len", "64", "--out", str(tmp_path / "run"))
    assert res.exit_code == 0, res.output
    res = invoke("data", "synth", "--tokens", "100", "--out", str(tmp_path / "x"), "--tasks", "copy=1,sing=2")
    assert res.exit_code == 2 and "unknown task 'sing'" in res.output and "--tasks" in res.output


def test_study_command_trains_measures_and_reports_then_resumes(tmp_path):
    curriculum = tmp_path / "c.json"
    curriculum.write_text(json.dumps({"tasks": {"needle": 1}, "levels": [{"distance": [0, 40], "pairs": [1, 1]}]}))
    recipe = {
        "scale": "toy",
        "seeds": [0, 1],
        "runs": {
            "pt": {"curriculum": "c.json", "tokenizer": "byte", "seq_len": 256, "batch_size": 1, "steps": 2},
            "cpt": {"from": "pt", "curriculum": "c.json", "seq_len": 256, "batch_size": 1, "steps": 1},
        },
        "study": {
            "probes": ["needle@40"],
            "probe_samples": 1,
            "analysis_runs": [],
            "ruler_runs": [],
            "shortctx_runs": [],
        },
    }
    (tmp_path / "recipe.json").write_text(json.dumps(recipe))
    args = ["study", "--recipe", str(tmp_path / "recipe.json"), "--members", "d16", "--out", str(tmp_path / "out")]
    res = invoke(*args, "--seeds", "1", "--runs", "pt")
    assert res.exit_code == 0, res.output
    assert "Held-out needle retrieval" in res.output and f"results: {tmp_path / 'out'}" in res.output
    # it ends by drawing what the results allow (probes only here) and naming what it skipped
    assert (tmp_path / "out" / "figures" / "probes.png").is_file()
    assert f"figures: {tmp_path / 'out' / 'figures'} (" in res.output and "skipped: ruler_by_length" in res.output
    manifest = json.loads((tmp_path / "out" / "runs" / "manifest.json").read_text())
    # --seeds and --runs won: no cpt
    assert [(r["member"], r["seed"], r["run"]) for r in manifest["runs"]] == [("toy-d16", 1, "pt")]
    again = invoke(*args, "--seeds", "1", "--runs", "pt")
    assert again.exit_code == 0 and "finished earlier, skipping" in again.output
    missing = invoke("study", "--recipe", str(tmp_path / "none.json"))
    assert missing.exit_code == 2 and "does not exist" in missing.output
    bad = invoke("study", "--recipe", str(tmp_path / "recipe.json"), "--profile", "fast")
    assert bad.exit_code == 2 and "no profile 'fast'" in bad.output
