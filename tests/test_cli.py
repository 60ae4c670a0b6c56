import json

import pytest
import torch
from reference import param_count
from typer.testing import CliRunner

import headprobe.analysis.items as items_mod
from headprobe.cli import app
from headprobe.cli.progress import progress_bar
from headprobe.core.errors import HeadprobeError
from headprobe.model.checkpoint import save_checkpoint
from headprobe.model.presets import list_presets, preset
from headprobe.model.transformer import Transformer
from headprobe.testing import tiny_config

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
        assert row["params"] == param_count(model)
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


# ---------------------------------------------------------------------------------------------
# a failing run does not print a finished progress line
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.manual_seed(0)
    return save_checkpoint(
        Transformer(tiny_config(vocab_size=264, max_seq_len=512)), tmp_path_factory.mktemp("c") / "tiny"
    )


@pytest.fixture
def broken(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text("{")
    return folder


def analyze_logged(*args: str):
    """``headprobe analyze`` as in a log file (CliRunner's stderr is no terminal), a progress line per update."""
    return runner.invoke(
        app,
        ["analyze", *args, "--metrics", "entropy", "--lengths", "256", "--samples", "2"],
        env={"HEADPROBE_PROGRESS_EVERY": "0", "COLUMNS": "300"},
    )


def progress_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("[analyze]")]


def test_a_run_whose_checkpoint_fails_to_load_prints_no_finished_progress_line(broken, tmp_path):
    out = analyze_logged(str(broken), "--out", str(tmp_path / "r"))
    assert out.exit_code == 2 and "broken/config.json is not valid JSON" in out.output
    assert "(100%)" not in out.output and progress_lines(out.output) == []  # nothing was done


def test_with_one_checkpoint_failing_the_progress_ends_at_the_share_done(broken, tiny, tmp_path):
    out = analyze_logged(str(broken), str(tiny), "--out", str(tmp_path / "r"))
    assert out.exit_code == 1 and "broken: " in out.output
    assert (tmp_path / "r" / "tiny" / "entropy.parquet").is_file()  # the other checkpoint ran
    assert "(100%)" not in out.output
    assert progress_lines(out.output)[-1].startswith("[analyze] 2/4 (50%)")  # tiny's 2 samples of 4 units


def test_a_checkpoint_failing_during_the_work_leaves_the_progress_where_it_stopped(tiny, tmp_path, monkeypatch):
    real, calls = items_mod.run_pass, []

    def second_pass_fails(*args, **kwargs):  # an error on purpose fails one checkpoint (a bug would stop all)
        calls.append(1)
        if len(calls) == 2:
            raise HeadprobeError("the second sample's pass failed")
        return real(*args, **kwargs)

    monkeypatch.setattr(items_mod, "run_pass", second_pass_fails)
    out = analyze_logged(str(tiny), "--out", str(tmp_path / "r"))
    assert out.exit_code == 2 and "error: the second sample's pass failed" in out.output
    assert "(100%)" not in out.output
    assert [line.split(" ")[1] for line in progress_lines(out.output)] == ["1/2"]  # sample 0 done, then the failure


def test_progress_lines_end_with_a_last_line_only_when_the_block_succeeds(capsys):
    with progress_bar("job") as bar:  # stderr is captured, not a terminal: progress lines, one per 30 s
        bar.start(1)
        bar.advance()  # too soon for a line
    assert capsys.readouterr().err.startswith("[job] 1/1 (100%)")
    with pytest.raises(RuntimeError), progress_bar("job") as bar:
        bar.start(1)
        bar.advance()
        raise RuntimeError("failed after the last unit")
    assert capsys.readouterr().err == ""
