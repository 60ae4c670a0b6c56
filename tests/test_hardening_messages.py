"""Hardening, second round (issue 28): inputs whose message was vague or missing. A ``ruler eval --data``
file fitted to another tokenizer is refused with its lengths measured for the model (a file that records
no tokenizer is measured and said so); each refusal is one ``error:`` line naming the problem and the
fix, and writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_checks import invoke, refused, run_command
from tokenizers import Tokenizer

from headprobe.model.tokenizer import ByteTokenizer, HFTokenizer
from headprobe.testing import build_toy_bpe, tiny_checkpoint


@pytest.fixture(scope="module")
def bpe_model(tmp_path_factory) -> Path:
    """A tiny model of ours with a 300-id BPE tokenizer."""
    root = tmp_path_factory.mktemp("bpe")
    tok = HFTokenizer(build_toy_bpe(root / "tok.json"))
    return tiny_checkpoint(root / "tiny-bpe", tokenizer=tok, vocab_size=304, max_seq_len=2048)


def test_a_tokenizer_fingerprint_is_its_vocabulary_not_its_file(tmp_path):
    first = build_toy_bpe(tmp_path / "a.json")
    copy = tmp_path / "copy.json"
    Tokenizer.from_file(str(first)).save(str(copy), pretty=False)  # the same tokenizer, other bytes
    assert copy.read_bytes() != first.read_bytes()
    assert HFTokenizer(copy).fingerprint == HFTokenizer(first).fingerprint
    other = build_toy_bpe(tmp_path / "b.json", vocab_size=301)
    assert HFTokenizer(other).fingerprint != HFTokenizer(first).fingerprint
    assert ByteTokenizer().fingerprint == "byte"


def byte_samples(tmp_path: Path) -> Path:
    data = tmp_path / "byte.jsonl"
    res = invoke("ruler", "generate", "--tokenizer", "byte", "--tasks", "niah_single_1", "--lengths", "512",
                 "--samples", "2", "--out", data)  # fmt: skip
    assert res.exit_code == 0, res.output
    return data


def test_ruler_eval_refuses_data_fitted_to_another_tokenizer(tmp_path, bpe_model):
    data = byte_samples(tmp_path)
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    assert {r["tokenizer"] for r in rows} == {"byte"}
    bpe = Tokenizer.from_file(str(bpe_model / "tokenizer.json"))  # measured by the tokenizers library itself
    counts = [len(bpe.encode(r["input"] + r["answer_prefix"], add_special_tokens=False).ids) for r in rows]
    assert max(counts) < 300  # the 512-byte samples are far shorter in BPE tokens
    out = tmp_path / "out"
    res = invoke("ruler", "eval", bpe_model, "--data", data, "--out", out, "--no-progress")
    refused(res, f"--data {data} was generated for another tokenizer (byte)",
            f"at 512 tokens they are {min(counts):,}-{max(counts):,}", "ruler generate --tokenizer",
            "or evaluate without --data")  # fmt: skip
    assert not out.exists()


def test_ruler_eval_measures_data_that_records_no_tokenizer(tmp_path, bpe_model):
    data = byte_samples(tmp_path)
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    foreign = tmp_path / "ruler_own.jsonl"  # as RULER's own files: no tokenizer recorded
    foreign.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "tokenizer"}) + "\n" for r in rows))
    bpe = Tokenizer.from_file(str(bpe_model / "tokenizer.json"))
    counts = [len(bpe.encode(r["input"] + r["answer_prefix"], add_special_tokens=False).ids) for r in rows]
    res = invoke("ruler", "eval", bpe_model, "--data", foreign, "--out", tmp_path / "out", "--no-progress")
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    assert f"--data {foreign} records no tokenizer; measured with this model's: at 512 tokens they are " in flat
    assert f"{min(counts):,}-{max(counts):,}" in flat
    assert (tmp_path / "out" / bpe_model.name / "ruler_scores.parquet").is_file()  # and evaluated them


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("byte") / "tiny", vocab_size=264, max_seq_len=1024)


def test_a_path_of_the_wrong_kind_is_called_what_it_is(tmp_path, byte_model):
    folder, afile = tmp_path / "folder", tmp_path / "afile"
    folder.mkdir()
    afile.write_text("some text\n")
    out = tmp_path / "out"
    cases = [
        (["analyze", byte_model, "--haystack-file", folder, "--out", out],
         f"--haystack-file {folder} is a folder, not a file"),
        (["train", "--preset", "toy-d16", "--data", afile, "--steps", "1", "--out", out],
         f"data folder {afile} is a file, not a folder"),
        (["data", "prepare", folder, "--out", out], f"source {folder} is a folder, not a file"),
        (["figures", afile, "--out", out], f"results folder {afile} is a file, not a folder"),
        (["ruler", "eval", byte_model, "--data", folder, "--out", out], f"--data {folder} is a folder, not a file"),
        (["ruler", "generate", "--qa-file", folder, "--tasks", "qa_1", "--out", tmp_path / "s.jsonl"],
         f"--qa-file {folder} is a folder, not a file"),
        (["explore", byte_model, "--text", folder, "--export", tmp_path / "e.html"],
         f"--text {folder} is a folder, not a file"),
    ]  # fmt: skip
    for args, says in cases:
        refused(invoke(*args), says)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "folder"]  # nothing written


def test_a_file_that_is_not_utf8_is_named_with_the_fix(tmp_path, byte_model):
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes('{"text": "café"}\n'.encode("latin-1"))
    out = tmp_path / "out"
    byte = b'{"text": "caf'.__len__()  # where the é is: the first byte that is not UTF-8
    fix = "convert it to UTF-8"
    cases = [
        (["ruler", "eval", byte_model, "--data", latin, "--out", out], f"--data {latin} is not UTF-8 text"),
        (["ruler", "generate", "--qa-file", latin, "--tasks", "qa_1", "--out", tmp_path / "s.jsonl"],
         f"QA file {latin} is not UTF-8 text"),
        (["shortctx", "eval", byte_model, "--task", "jsonl", "--file", latin, "--out", out],
         f"task file {latin} is not UTF-8 text"),
    ]  # fmt: skip
    for args, says in cases:
        refused(invoke(*args), says, f"at byte {byte}", fix)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latin.jsonl"]


def test_an_unwritable_out_is_named_not_a_temporary_file(tmp_path, byte_model):
    afile = tmp_path / "afile"
    afile.write_text("keep")
    # errors that reach the top of the command are shown there: run it as a user does
    generate = ["ruler", "generate", "--tasks", "niah_single_1", "--lengths", "1024", "--samples", "1"]
    out = "/proc/headprobe-test.jsonl"
    message = refused(run_command(*generate, "--out", out), f"cannot write {out}", "give a path in a folder you can")
    assert ".tmp-" not in message and "Errno" not in message
    analyze = ["analyze", byte_model, "--metrics", "entropy", "--lengths", "128", "--samples", "1", "--no-progress"]
    message = refused(run_command(*analyze, "--out", afile / "r"), f"cannot write {afile / 'r'}", "a folder you can")
    assert ".headprobe.lock" not in message and afile.read_text() == "keep"


def test_vague_messages_say_what_to_do(tmp_path, byte_model):
    refused(invoke("ruler", "generate", "--prompt-format", "chat", "--out", tmp_path / "s.jsonl"),
            "--prompt-format chat needs a model's chat template", "pass --tokenizer MODEL_DIR",
            "or give a wrapper holding {task_template}")  # fmt: skip
    hf = tmp_path / "config.json"
    hf.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}))
    refused(invoke("plan", "--config", hf), f"{hf}: a Hugging Face config.json (model_type 'llama')",
            "not a headprobe model config", "give one of ours")  # fmt: skip
    explore = ["explore", byte_model, "--ruler", "niah_single_9", "--length", "512", "--export", tmp_path / "e.html"]
    refused(invoke(*explore), "--ruler niah_single_9 is not a RULER-style task; choose one of niah_single_1, ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]
