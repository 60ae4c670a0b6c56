"""Hardening, second round (issue 28), first part: every count on the command line goes through one rule,
repeated lengths are one length, an existing file is replaced only when asked, and four inputs that
ended in a traceback end in one line. Each refusal exits 2 before any work, names the option, and
leaves nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_checks import invoke, refused

from headprobe.analysis import AnalyzeSettings
from headprobe.analysis.settings import AnalyzeError
from headprobe.cli.common import token_counts
from headprobe.evals.ruler.settings import RulerError, RulerSettings
from headprobe.testing import tiny_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("ck") / "tiny", vocab_size=264, max_seq_len=1024)


@pytest.mark.parametrize(
    ("args", "option", "needs", "got"),
    [
        (["ruler", "eval", "{ckpt}", "--batch-size", "-1"], "--batch-size", "at least 0", "got -1"),
        (["ruler", "eval", "{ckpt}", "--samples", "0"], "--samples", "at least 1", "got 0"),
        (["shortctx", "eval", "{ckpt}", "--limit", "-3"], "--limit", "at least 1", "got -3"),
        (["shortctx", "eval", "{ckpt}", "--batch-size", "0"], "--batch-size", "at least 1", "got 0"),
        (["analyze", "{ckpt}", "--max-new-tokens", "0"], "--max-new-tokens", "at least 1", "got 0"),
        (["analyze", "{ckpt}", "--samples", "-2"], "--samples", "at least 1", "got -2"),
        (["analyze", "{ckpt}", "--topk", "0"], "--topk", "at least 1", "got 0"),
        (["ablate", "{ckpt}", "--heads", "1.0", "--samples", "0"], "--samples", "at least 1", "got 0"),
        (["study", "--jobs", "0"], "--jobs", "at least 1", "got 0"),
        (["demo", "--jobs", "-1"], "--jobs", "at least 1", "got -1"),
        (["train", "grid", "--jobs", "0"], "--jobs", "at least 1", "got 0"),
        (["plan", "--seq-len", "0"], "--seq-len", "at least 1", "got 0"),
        (
            ["explore", "{ckpt}", "--needle", "--length", "256", "--port", "-1"],
            "--port",
            "a value from 0 to 65535",
            "got -1",
        ),
        (["ruler", "generate", "--out", "{tmp}/s.jsonl", "--reserve", "-1"], "--reserve", "at least 0", "got -1"),
        (["data", "synth", "--tokens", "0", "--out", "{tmp}/d"], "--tokens", "at least 1", "got 0"),
    ],
)
def test_non_positive_counts_are_refused_by_one_rule(tmp_path, ckpt, args, option, needs, got):
    out = tmp_path / "out"
    args = [a.replace("{ckpt}", str(ckpt)).replace("{tmp}", str(tmp_path)) for a in args]
    if args[0] in ("ruler", "shortctx", "analyze", "ablate", "study", "demo") and args[:2] != ["ruler", "generate"]:
        args += ["--out", str(out)]
    refused(invoke(*args), f"{option}: give {needs}, {got}")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, no folder made


def test_a_length_given_twice_is_measured_once(tmp_path, ckpt):
    assert token_counts("1k,1K,1024,2048,2k") == [1024, 2048]
    res = invoke("analyze", ckpt, "--metrics", "entropy", "--lengths", "256,256", "--samples", "1", "--out",
                 tmp_path / "o", "--no-progress")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "o" / "run.json").read_text())["settings"]["lengths"] == [256]
    assert "-1 of" not in res.output and "done earlier" not in res.output
    with pytest.raises(AnalyzeError, match=r"`lengths` lists 256 more than once"):
        AnalyzeSettings(lengths=[256, 512, 256]).validate()
    with pytest.raises(RulerError, match=r"`lengths` lists 1024 more than once; give each length once"):
        RulerSettings(lengths=[1024, 1024]).validate()


def test_ruler_generate_keeps_an_existing_file_and_names_a_folder_or_a_missing_parent(tmp_path):
    kept = tmp_path / "kept.jsonl"
    kept.write_text("earlier\n")
    refused(invoke("ruler", "generate", "--out", kept), "kept.jsonl exists", "--overwrite")
    assert kept.read_text() == "earlier\n"
    refused(invoke("ruler", "generate", "--out", tmp_path), "is a folder; give the JSON-lines file to write")
    refused(invoke("ruler", "generate", "--out", tmp_path / "no" / "s.jsonl"), "does not exist; create it")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.jsonl"]


def test_inputs_that_ended_in_a_traceback_end_in_one_line(tmp_path, ckpt):
    # a results folder drawn into a file
    (tmp_path / "a_file").write_text("x")
    refused(invoke("figures", tmp_path, "--out", tmp_path / "a_file"), "--out", "is a file, not a folder")
    # a config that is not UTF-8 text
    (tmp_path / "latin1.json").write_bytes('{"name": "caf\xe9"}'.encode("latin-1"))
    refused(invoke("plan", "--config", tmp_path / "latin1.json"), "latin1.json is not UTF-8 text")
    # a Hugging Face folder whose config disagrees with its weights
    from headprobe.testing import build_toy_hf_model

    folder = build_toy_hf_model("llama", tmp_path / "hf", layers=2)
    config = json.loads((folder / "config.json").read_text())
    config["num_attention_heads"] = 12
    (folder / "config.json").write_text(json.dumps(config))
    res = invoke("analyze", folder, "--metrics", "entropy", "--lengths", "64", "--out", tmp_path / "o")
    assert res.exit_code == 2 and "Traceback" not in res.output  # the one checkpoint fails: the run's error
    errors = [line for line in res.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "cannot load as a Hugging Face causal LM" in errors[0]
    assert "not a multiple of the number of attention heads (12)" in errors[0] and "config.json" in errors[0]
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a torch without CUDA")
def test_training_on_cuda_with_a_cpu_build_says_so(tmp_path):
    res = invoke("train", "--preset", "toy-d16", "--steps", "1", "--device", "cuda", "--out", tmp_path / "run")
    refused(res, "--device cuda", "sees no CUDA GPU", "--device cpu")
    assert not (tmp_path / "run").exists()


def test_inputs_that_were_ignored_without_a_word_are_refused(tmp_path, ckpt):
    # shortctx: a --file with the built-in task
    (tmp_path / "items.jsonl").write_text("{}\n")
    refused(invoke("shortctx", "eval", ckpt, "--task", "builtin", "--file", tmp_path / "items.jsonl", "--out",
                   tmp_path / "o"), "--file", "--task builtin has none", "drop --file")  # fmt: skip
    # explore: a length beyond what the model was trained on, as analyze and ruler eval refuse it
    page = tmp_path / "page.html"
    refused(invoke("explore", ckpt, "--needle", "--length", "2048", "--export", page),
            "2,048 tokens exceed the 1,024 positions it was trained on", "--allow-beyond-trained")  # fmt: skip
    assert not page.exists()


def test_explore_refuses_the_results_of_another_model(tmp_path, ckpt):
    import pandas as pd

    from headprobe.results import TableMeta, write_table

    rows = [{"model": name, "layer": 0, "head": 0, "layer_type": "sliding", "value": 0.5, "n_kept": 1,
             "n_samples": 1, "length": 256} for name in ("other-a", "other-b")]  # fmt: skip
    for name in ("other-a", "other-b"):
        frame = pd.DataFrame([r for r in rows if r["model"] == name])
        write_table(tmp_path / "res" / name / "retrieval.parquet", frame, TableMeta("retrieval", name))
    page = tmp_path / "page.html"
    refused(invoke("explore", ckpt, "--needle", "--length", "512", "--results", tmp_path / "res", "--export", page),
            "holds results of other-a (another checkpoint), other-b (another checkpoint), not of tiny",
            "give the folder that `headprobe analyze` of this model wrote")  # fmt: skip
    # a folder of one other model's results is refused too (it was taken whatever its name: issue 37)
    refused(invoke("explore", ckpt, "--needle", "--length", "512", "--results", tmp_path / "res" / "other-a",
                   "--export", page), "holds results of other-a (another checkpoint), not of tiny")  # fmt: skip
    big = pd.DataFrame([{**rows[0], "model": "tiny", "layer": 40}])  # a table of this name that records no path
    write_table(tmp_path / "solo" / "tiny" / "retrieval.parquet", big, TableMeta("retrieval", "tiny"))
    refused(invoke("explore", ckpt, "--needle", "--length", "512", "--results", tmp_path / "solo", "--export", page),
            "tiny's retrieval table has heads tiny lacks (layer 40")  # fmt: skip
    assert not page.exists()
