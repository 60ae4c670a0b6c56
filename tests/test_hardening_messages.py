"""Hardening, second round (issue 28): inputs whose message was vague or missing. A ``ruler eval --data``
file fitted to another tokenizer is refused with its lengths measured for the model (a file that records
no tokenizer is measured and said so); each refusal is one ``error:`` line naming the problem and the
fix, and writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_checks import invoke, refused
from tokenizers import Tokenizer

from headprobe.model.tokenizer import ByteTokenizer, HFTokenizer
from headprobe.testing import build_toy_bpe


@pytest.fixture(scope="module")
def bpe_model(tmp_path_factory) -> Path:
    """A tiny model of ours with a 300-id BPE tokenizer."""
    from headprobe.model.checkpoint import save_checkpoint
    from headprobe.model.transformer import Transformer
    from headprobe.testing import tiny_config

    root = tmp_path_factory.mktemp("bpe")
    tok = HFTokenizer(build_toy_bpe(root / "tok.json"))
    torch.manual_seed(0)
    path = root / "tiny-bpe"
    save_checkpoint(Transformer(tiny_config(vocab_size=304, max_seq_len=2048)), path, tok)
    return path


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
    assert (tmp_path / "out" / "ruler_scores.parquet").is_file()  # and evaluated them
