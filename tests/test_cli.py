import json

import torch
from typer.testing import CliRunner

from headprobe.cli import app
from headprobe.model.presets import list_presets, preset
from headprobe.model.transformer import Transformer

runner = CliRunner()


def test_plan_json_every_preset_against_built_models():
    result = runner.invoke(app, ["plan", "--json", "--seq-len", "8192"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["name"] for r in rows] == list_presets()
    for row in rows:
        assert {"name", "params", "attn_params", "flops_per_token", "kv_bytes_per_token"} <= set(row)
        with torch.device("meta"):
            model = Transformer(preset(row["name"]))
        assert row["params"] == model.num_params()
        assert row["attn_params"] == sum(p.numel() for n, p in model.named_parameters() if ".attn." in n)
        assert row["seq_len"] == 8192


def test_plan_scale_and_table():
    result = runner.invoke(app, ["plan", "--scale", "toy"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    for name in list_presets("toy"):
        assert name in result.output
    assert "0.6b" not in result.output


def test_plan_config_file_and_errors(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(preset("toy-d32", n_layers=12, full_every=4).to_json())
    rows = json.loads(runner.invoke(app, ["plan", "--json", "--config", str(path)]).output)
    assert len(rows) == 1 and rows[0]["n_full_layers"] == 3
    bad = runner.invoke(app, ["plan", "--scale", "7b"])
    assert bad.exit_code != 0 and "unknown scale" in bad.output
    missing = runner.invoke(app, ["plan", "--config", str(tmp_path / "none.json")], env={"COLUMNS": "400"})
    assert missing.exit_code != 0 and "does not exist" in missing.output
