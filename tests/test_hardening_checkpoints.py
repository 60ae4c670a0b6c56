"""Hardening (issue 28), two "silently wrong" cases made loud. A checkpoint records its tokenizer (the byte
tokenizer, or the SHA-256 and size of its tokenizer.json as written) and refuses to load with a missing, a
different or an added tokenizer.json, where it was read with the byte tokenizer or the wrong ids before;
checkpoints from before the record load as they did. ``train --resume`` refuses another model than the run's
(it continued toy-d16's weights and saved them as toy-d32), naming the differing fields, before anything in
the run's folder changes."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from cli_checks import invoke, one_error
from safetensors import safe_open
from safetensors.torch import save_file

from headprobe.core.steps import list_steps
from headprobe.model.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from headprobe.model.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer
from headprobe.model.transformer import Transformer
from headprobe.testing import build_toy_bpe, tiny_config
from trainer.config import Stage, TrainConfig, TrainError
from trainer.train import train
from trainer.train_state import export_step


def sha(file: Path) -> str:
    return hashlib.sha256(file.read_bytes()).hexdigest()


def record(folder: Path) -> dict | None:
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        raw = (f.metadata() or {}).get("tokenizer")
    return None if raw is None else json.loads(raw)


def strip_record(folder: Path) -> None:
    """Make ``folder`` a checkpoint as written before the tokenizer record existed."""
    file = folder / "model.safetensors"
    with safe_open(str(file), framework="pt") as f:
        metadata = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
    del metadata["tokenizer"]
    save_file(tensors, str(file), metadata=metadata)


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``folder`` (hidden ones included): its SHA-256 and modification time."""
    return {str(p.relative_to(folder)): (sha(p), p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def quick(out: Path, config: Path | None, **kw) -> TrainConfig:
    """A run of 2 steps of 2 sequences of 32 tokens (a pt run of the model config file ``config``)."""
    base = dict(config=config and str(config), out=str(out), steps=2, batch_size=2, seq_len=32, progress=False)
    return TrainConfig(**{**base, "threads": 1, **kw})


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> HFTokenizer:
    return load_tokenizer(build_toy_bpe(tmp_path_factory.mktemp("tok") / "bpe.json", vocab_size=300))


@pytest.fixture(scope="module")
def bpe_ckpt(tmp_path_factory, bpe) -> Path:
    """A tiny model saved with a 300-id BPE tokenizer (read only: tests copy it)."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ck") / "bpe"
    return save_checkpoint(Transformer(tiny_config(vocab_size=304, max_seq_len=1024)), path, bpe)


def byte_ckpt(path: Path) -> Path:
    return save_checkpoint(Transformer(tiny_config(vocab_size=264, max_seq_len=1024)), path, ByteTokenizer())


# ---------------------------------------------------------------------------------------------
# The record
# ---------------------------------------------------------------------------------------------
def test_a_checkpoint_records_its_tokenizer(tmp_path, bpe_ckpt, bpe):
    want = {"kind": "tokenizer.json", "sha256": sha(bpe_ckpt / "tokenizer.json"), "vocab_size": 300}
    assert record(bpe_ckpt) == want and bpe.vocab_size == 300
    assert record(byte_ckpt(tmp_path / "byte")) == {"kind": "byte", "vocab_size": 264}
    save_checkpoint(Transformer(tiny_config(vocab_size=264)), tmp_path / "none")  # no tokenizer: the byte one
    assert record(tmp_path / "none") == {"kind": "byte", "vocab_size": 264}
    _, tok = load_checkpoint(bpe_ckpt)  # the recorded file loads
    assert isinstance(tok, HFTokenizer) and tok.encode("the north door") == bpe.encode("the north door")


# ---------------------------------------------------------------------------------------------
# Load refuses another tokenizer than the recorded one
# ---------------------------------------------------------------------------------------------
def test_load_refuses_a_missing_tokenizer_json(tmp_path, bpe_ckpt):
    x = Path(shutil.copytree(bpe_ckpt, tmp_path / "x"))
    (x / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(x)
    message = str(err.value)
    assert message.startswith(f"{x / 'tokenizer.json'} is missing: ")
    assert f"a tokenizer.json of 300 ids (SHA-256 {record(x)['sha256'][:12]})" in message  # what was recorded
    assert "read with the byte tokenizer (264 ids)" in message  # what it would have been read with
    assert message.endswith("Restore the tokenizer.json the checkpoint was saved with.")


@pytest.mark.parametrize("how", ["another BPE", "same BPE, other bytes"])
def test_load_refuses_a_different_tokenizer_json(tmp_path, bpe_ckpt, how):
    x = Path(shutil.copytree(bpe_ckpt, tmp_path / "x"))
    file = x / "tokenizer.json"
    if how == "another BPE":
        build_toy_bpe(file, vocab_size=290)
        found = "290 ids"
    else:  # the same vocabulary written compactly: one byte differing is enough to be refused
        file.write_text(json.dumps(json.loads(file.read_text())))
        found = "300 ids"
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(x)
    message = str(err.value)
    assert message.startswith(f"{file} is not the tokenizer the checkpoint was saved with: ")
    assert f"300 ids (SHA-256 {record(x)['sha256'][:12]})" in message
    assert f"this file has SHA-256 {sha(file)[:12]} ({found})" in message
    assert message.endswith("Restore the tokenizer.json the checkpoint was saved with.")


def test_load_refuses_a_tokenizer_json_added_to_a_byte_checkpoint(tmp_path, bpe_ckpt):
    x = byte_ckpt(tmp_path / "x")
    load_checkpoint(x)  # loads before
    shutil.copy(bpe_ckpt / "tokenizer.json", x / "tokenizer.json")
    with pytest.raises(
        CheckpointError, match=r"saved with the byte tokenizer \(264 ids\), but the folder holds a"
    ) as e:
        load_checkpoint(x)
    assert str(e.value).endswith("this checkpoint's tokenizer is the byte tokenizer.")
    assert f"Remove {x / 'tokenizer.json'}" in str(e.value)


def test_a_damaged_record_is_one_error(tmp_path, bpe_ckpt):
    x = Path(shutil.copytree(bpe_ckpt, tmp_path / "x"))
    file = x / "model.safetensors"
    with safe_open(str(file), framework="pt") as f:
        metadata, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    save_file(tensors, str(file), metadata={**metadata, "tokenizer": '{"kind": "sentencepiece"}'})
    with pytest.raises(CheckpointError, match=r"model\.safetensors: its tokenizer record is damaged"):
        load_checkpoint(x)


def test_a_checkpoint_without_a_record_loads_as_before(tmp_path, bpe_ckpt, bpe):
    """Written before the record: the folder's tokenizer.json if any, else the byte tokenizer, unchecked."""
    legacy = Path(shutil.copytree(bpe_ckpt, tmp_path / "legacy"))
    strip_record(legacy)
    assert record(legacy) is None
    _, tok = load_checkpoint(legacy)
    assert isinstance(tok, HFTokenizer) and tok.vocab_size == 300
    build_toy_bpe(legacy / "tokenizer.json", vocab_size=290)  # another file: not known to be wrong
    assert load_checkpoint(legacy)[1].vocab_size == 290
    (legacy / "tokenizer.json").unlink()
    assert isinstance(load_checkpoint(legacy)[1], ByteTokenizer)


# ---------------------------------------------------------------------------------------------
# analyze shows the refusal as one line and writes nothing
# ---------------------------------------------------------------------------------------------
def test_analyze_refuses_a_checkpoint_without_its_tokenizer_json(tmp_path, bpe_ckpt):
    x = Path(shutil.copytree(bpe_ckpt, tmp_path / "x"))
    out = tmp_path / "res"
    args = ("analyze", x, "--metrics", "entropy", "--lengths", "512", "--samples", "1", "--out", out)
    assert invoke(*args).exit_code == 0  # with its tokenizer: measured
    before = snapshot(out)
    (x / "tokenizer.json").unlink()
    line = one_error(invoke(*args), 2, "x/tokenizer.json is missing", "300 ids", "Restore the tokenizer.json")
    assert "\n" not in line
    assert snapshot(out) == before  # the earlier results neither replaced nor joined by partial ones
    one_error(invoke(*args[:-1], tmp_path / "fresh"), 2, "x/tokenizer.json is missing")  # one checkpoint: its error
    assert not (tmp_path / "fresh").exists()


def test_train_refuses_an_init_without_its_tokenizer_json(tmp_path, bpe_ckpt):
    x = Path(shutil.copytree(bpe_ckpt, tmp_path / "x"))
    (x / "tokenizer.json").unlink()
    args = ("--stage", "cpt", "--init", x, "--steps", "1", "--batch-size", "2", "--seq-len", "32", "--no-progress")
    line = one_error(invoke("train", *args, "--out", tmp_path / "run"), 2, "--init: ", "x/tokenizer.json is missing")
    assert line.endswith("Restore the tokenizer.json the checkpoint was saved with.")  # its fix, not "give a folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x"]  # no run folder made


# ---------------------------------------------------------------------------------------------
# The trainer's checkpoints record the tokenizer too
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory, bpe) -> tuple[Path, Path]:
    """A pt run of 2 steps with a BPE tokenizer file (its own copy, so a test can change it) on prepared data."""
    from trainer.data import prepare

    root = tmp_path_factory.mktemp("bperun")
    tok = root / "tok.json"
    shutil.copy(bpe.path, tok)
    (root / "doc.txt").write_text("the north door is quiet and the key is under the mat " * 200)
    prepare([root / "doc.txt"], load_tokenizer(tok), root / "data")
    (root / "model.json").write_text(tiny_config(vocab_size=304, max_seq_len=32).to_json())
    train(quick(root / "run", root / "model.json", data=str(root / "data"), tokenizer=str(tok)))
    return root / "run", tok


def test_trained_final_exported_and_continued_checkpoints_record_the_tokenizer(tmp_path, bpe_run):
    run, _ = bpe_run
    final = run / "final"
    assert record(final) == {"kind": "tokenizer.json", "sha256": sha(final / "tokenizer.json"), "vocab_size": 300}
    exported = export_step(list_steps(run)[-1][1], tmp_path / "exported")
    assert record(exported) == record(final)
    data = str(run.parent / "data")
    train(quick(tmp_path / "cpt", None, stage=Stage.CPT, init=str(final), data=data, steps=1))
    assert record(tmp_path / "cpt" / "final")["sha256"] == record(final)["sha256"]
    (tmp_path / "cpt" / "final" / "tokenizer.json").unlink()  # the continued checkpoint is guarded too
    with pytest.raises(CheckpointError, match="is missing"):
        load_checkpoint(tmp_path / "cpt" / "final")


def test_export_refuses_a_tokenizer_changed_since_the_step(tmp_path, bpe_run):
    run, tok = bpe_run
    step = list_steps(run)[-1][1]
    original = tok.read_bytes()
    try:
        build_toy_bpe(tok, vocab_size=290)
        res = invoke("train", "export", step, tmp_path / "exported")
        one_error(res, 2, f"{tok} is not the tokenizer {step} was trained with", "Restore that tokenizer.json")
        assert not (tmp_path / "exported").exists()
    finally:
        tok.write_bytes(original)


# ---------------------------------------------------------------------------------------------
# Resume refuses another model
# ---------------------------------------------------------------------------------------------
def test_train_resume_with_another_preset_is_refused_and_changes_nothing(tmp_path):
    run = tmp_path / "RUN"
    common = ("--batch-size", "2", "--seq-len", "32", "--threads", "1", "--no-progress", "--out", run)
    assert invoke("train", "--preset", "toy-d16", "--steps", "2", *common).exit_code == 0
    before = snapshot(run)
    res = invoke("train", "--preset", "toy-d32", "--steps", "2", "--resume", *common)
    line = one_error(
        res,
        2,
        f"cannot resume from {run / 'step_000002'}: model settings differ (saved vs now: preset toy-d16 vs toy-d32; ",
        "full.n_heads 8 vs 4",
        "full.qk_head_dim 16 vs 32",
        "Give the same --preset/--config as that run, or another --out",
    )
    assert "swa." not in line  # only what differs: the sliding layers are alike
    assert snapshot(run) == before  # no checkpoint, log, config or result touched, nothing added
    res = invoke("train", "--preset", "toy-d16", "--steps", "2", "--resume", *common)
    assert res.exit_code == 0 and "done: 2 steps" in res.output, res.output  # the run's own model is taken


def test_resume_compares_the_whole_model_config(tmp_path):
    small, other, renamed = (tmp_path / f"{n}.json" for n in ("small", "other", "renamed"))
    small.write_text(tiny_config(vocab_size=264, max_seq_len=32).to_json())
    other.write_text(tiny_config(vocab_size=264, max_seq_len=32, norm_eps=1e-5).to_json())  # same shapes
    renamed.write_text(tiny_config(vocab_size=264, max_seq_len=32, name="mine").to_json())
    train(quick(tmp_path / "run", small))
    with pytest.raises(TrainError, match=r"model settings differ \(saved vs now: norm_eps 1e-06 vs 1e-05\)") as err:
        train(quick(tmp_path / "run", other, resume=True))
    assert "`preset`/`config`" in str(err.value) and "another `out`" in str(err.value)
    result = train(quick(tmp_path / "run", renamed, resume=True))  # a name alone is the same model
    assert result.steps == 2 and not result.interrupted


def test_resume_of_a_continued_stage_names_init(tmp_path):
    config = tmp_path / "model.json"
    config.write_text(tiny_config(vocab_size=264, max_seq_len=32).to_json())
    train(quick(tmp_path / "pt", config))
    cpt = dict(stage=Stage.CPT, init=str(tmp_path / "pt" / "final"))
    train(quick(tmp_path / "cpt", None, **cpt))
    with pytest.raises(TrainError, match=r"max_seq_len 32 vs 64") as err:
        train(quick(tmp_path / "cpt", None, **cpt, seq_len=64, steps=3, resume=True))
    assert "Give the same `init`, `seq_len` and `rope_theta_full` as that run" in str(err.value)
