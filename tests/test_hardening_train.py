"""Hardening of the trainer's commands and of atomic writes: outputs follow the umask, `data prepare` / `data
synth` refuse to replace what is at --out unless --overwrite (and then leave no hidden leftovers), and bad
train inputs end in one clear message (exit code 2), never a traceback."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

import headprobe.core.atomic as atomic_mod
from headprobe.cli import app
from headprobe.core.atomic import atomic_directory, atomic_write_bytes, atomic_write_text
from headprobe.model.checkpoint import save_checkpoint
from headprobe.model.transformer import Transformer
from headprobe.results import TableMeta, write_table
from headprobe.testing import tiny_config
from trainer.data import MANIFEST, TokenData

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "300"})


def assert_clean_error(res, *words: str) -> None:
    """Exit code 2, one ``error:`` line naming every one of ``words``, no traceback."""
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    errors = [line for line in res.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, res.output
    for word in words:
        assert word in errors[0], (word, errors[0])


def hidden(folder: Path) -> list[str]:
    """Hidden entries (temporary or moved-aside leftovers) in ``folder``."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask(request):
    """Set the process umask to the test's parameter; the previous one is restored afterwards."""
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


# ---------------------------------------------------------------------------------------------
# Atomic writes follow the umask
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002], indirect=True)
def test_atomic_writes_follow_the_umask(tmp_path, umask):
    file_mode, dir_mode = 0o666 & ~umask, 0o777 & ~umask
    atomic_write_text(tmp_path / "a.txt", "text")
    atomic_write_bytes(tmp_path / "b.bin", b"\x00\x01")
    replaced = tmp_path / "c.txt"
    replaced.write_text("old")
    replaced.chmod(0o600)
    atomic_write_text(replaced, "new")
    with atomic_directory(tmp_path / "folder") as tmp:
        (tmp / "inside.txt").write_text("x")
    write_table(tmp_path / "t.parquet", pd.DataFrame({"x": [1]}), TableMeta(table="t"))

    for name in ("a.txt", "b.bin", "c.txt", "folder/inside.txt", "t.parquet"):
        assert mode(tmp_path / name) == file_mode, (name, oct(mode(tmp_path / name)))
    assert mode(tmp_path / "folder") == dir_mode
    assert replaced.read_text() == "new"
    assert hidden(tmp_path) == []


@pytest.mark.parametrize("umask", [0o022, 0o002], indirect=True)
def test_checkpoints_follow_the_umask(tmp_path, umask):
    path = save_checkpoint(Transformer(tiny_config(vocab_size=264)), tmp_path / "ck")
    assert mode(path) == 0o777 & ~umask
    files = list(path.iterdir())
    assert files and all(mode(f) == 0o666 & ~umask for f in files), [(f.name, oct(mode(f))) for f in files]
    assert hidden(tmp_path) == []


@pytest.mark.parametrize("umask", [0o027], indirect=True)
@pytest.mark.parametrize("proc", [True, False], ids=["proc", "no-proc"])
def test_current_umask_reads_without_changing_it(umask, proc, monkeypatch):
    if not proc:  # a system without /proc/self/status: the set-and-restore fallback

        def no_proc(*args, **kwargs):
            raise OSError("no /proc here")

        monkeypatch.setattr(atomic_mod, "open", no_proc, raising=False)
    assert atomic_mod.current_umask() == 0o027
    assert os.umask(0o027) == 0o027  # still the test's umask afterwards


# ---------------------------------------------------------------------------------------------
# atomic_directory's cleanup paths
# ---------------------------------------------------------------------------------------------
def test_atomic_directory_replaces_a_file_without_leftovers(tmp_path):
    (tmp_path / "out").write_text("a file")
    with atomic_directory(tmp_path / "out") as tmp:
        (tmp / "new.txt").write_text("new")
    assert (tmp_path / "out" / "new.txt").read_text() == "new"
    assert hidden(tmp_path) == []


def test_sweep_removes_what_killed_writers_left_and_nothing_else(tmp_path):
    from headprobe.core.atomic import sweep_temporaries

    (tmp_path / "a" / "b").mkdir(parents=True)
    stale = [tmp_path / ".scores.json.tmp-0123abcd", tmp_path / "a" / ".x.parquet.old-89abcdef"]
    for path in stale:
        path.write_text("half written")
    (tmp_path / "a" / ".final.tmp-deadbeef").mkdir()  # a checkpoint folder midway
    (tmp_path / "a" / ".final.tmp-deadbeef" / "model.safetensors").write_text("part")
    keep = [tmp_path / ".notes", tmp_path / "a" / ".x.tmp-not-hex", tmp_path / "a" / "b" / "y.tmp-0123abcd"]
    for path in keep:  # a user's hidden file, other names that merely look alike
        path.write_text("mine")
    gone = sweep_temporaries(tmp_path)
    assert sorted(gone) == sorted([*stale, tmp_path / "a" / ".final.tmp-deadbeef"])
    assert all(not p.exists() for p in gone) and all(p.read_text() == "mine" for p in keep)


def test_a_training_run_holds_its_folder(tmp_path):
    """A second run into a folder being trained is refused naming the holder (a lock, as analyze takes)."""
    from headprobe.core.atomic import folder_lock

    cfg = tmp_path / "model.json"
    cfg.write_text(tiny_config(vocab_size=264, max_seq_len=64).to_json())
    with folder_lock(tmp_path / "r"):
        res = invoke("train", "--config", str(cfg), "--steps", "1", "--out", str(tmp_path / "r"))
        assert_clean_error(res, "being written by another headprobe run", f"pid {os.getpid()}", "another --out")
        assert [p.name for p in (tmp_path / "r").iterdir()] == [".headprobe.lock"]


def test_atomic_directory_failure_keeps_the_old_folder(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old.txt").write_text("old")
    with pytest.raises(RuntimeError, match="midway"), atomic_directory(tmp_path / "out") as tmp:
        (tmp / "new.txt").write_text("new")
        raise RuntimeError("midway")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["old.txt"]
    assert hidden(tmp_path) == []


def test_atomic_directory_puts_the_old_content_back_when_the_last_rename_fails(tmp_path, monkeypatch):
    (tmp_path / "out").write_text("old")
    real_replace = os.replace

    def replace(src, dst):
        if ".tmp-" in Path(src).name:
            raise OSError("disk trouble")
        real_replace(src, dst)

    monkeypatch.setattr(atomic_mod.os, "replace", replace)
    with pytest.raises(OSError, match="disk trouble"), atomic_directory(tmp_path / "out") as tmp:
        (tmp / "new.txt").write_text("new")
    assert (tmp_path / "out").read_text() == "old"
    assert hidden(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# data prepare / synth: --out that exists
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def source(tmp_path) -> Path:
    src = tmp_path / "x.txt"
    src.write_text("A small document about keys and doors. " * 20)
    return src


def test_prepare_refuses_an_existing_file(tmp_path, source):
    out = tmp_path / "existing"
    out.write_text("keep me")
    res = invoke("data", "prepare", str(source), "--out", str(out))
    assert_clean_error(res, str(out), "is a file", "--overwrite")
    assert out.is_file() and out.read_text() == "keep me"
    assert hidden(tmp_path) == []


def test_prepare_refuses_an_existing_data_folder(tmp_path, source):
    out = tmp_path / "data"
    assert invoke("data", "prepare", str(source), "--out", str(out)).exit_code == 0
    before = (out / MANIFEST).read_bytes()
    other = tmp_path / "other.txt"
    other.write_text("different text")
    res = invoke("data", "prepare", str(other), "--out", str(out))
    assert_clean_error(res, str(out), "exists (a data folder)", "--overwrite")
    assert (out / MANIFEST).read_bytes() == before
    res = invoke("data", "synth", "--tokens", "100", "--out", str(out))
    assert_clean_error(res, str(out), "exists (a data folder)", "--overwrite")
    assert (out / MANIFEST).read_bytes() == before
    assert hidden(tmp_path) == []


def test_overwrite_never_replaces_a_folder_that_is_not_data(tmp_path, source):
    out = tmp_path / "notes"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    res = invoke("data", "prepare", str(source), "--out", str(out), "--overwrite")
    assert_clean_error(res, str(out), "not a data folder", "new or empty folder", "never anything else")
    assert [p.name for p in out.iterdir()] == ["thesis.tex"]


def test_prepare_overwrite_replaces_a_file_without_leftovers(tmp_path, source):
    out = tmp_path / "existing"
    out.write_text("old")
    res = invoke("data", "prepare", str(source), "--out", str(out), "--overwrite")
    assert res.exit_code == 0, res.output
    assert len(TokenData(out)) == 39 * 20 + 1
    assert hidden(tmp_path) == []


def test_prepare_overwrite_that_fails_midway_keeps_the_old_data(tmp_path, source):
    out = tmp_path / "data"
    assert invoke("data", "prepare", str(source), "--out", str(out)).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe not utf-8")
    res = invoke("data", "prepare", str(source), str(bad), "--out", str(out), "--overwrite")
    assert_clean_error(res, str(bad), "UTF-8")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert hidden(tmp_path) == []


def test_synth_overwrite_replaces_a_data_folder(tmp_path):
    out = tmp_path / "s"
    assert invoke("data", "synth", "--tokens", "100", "--out", str(out), "--seed", "1").exit_code == 0
    res = invoke("data", "synth", "--tokens", "3000", "--out", str(out), "--overwrite")
    assert res.exit_code == 0, res.output
    assert json.loads((out / MANIFEST).read_text())["total_tokens"] >= 3000
    assert hidden(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# train: bad inputs are one message
# ---------------------------------------------------------------------------------------------
def test_unknown_preset_is_a_message(tmp_path):
    res = invoke("train", "--preset", "toy-d999", "--steps", "1", "--out", str(tmp_path / "r"))
    assert_clean_error(res, "--preset", "toy-d999", "toy-d32")
    assert not (tmp_path / "r").exists()


def test_missing_config_file_is_a_message(tmp_path):
    res = invoke("train", "--config", str(tmp_path / "nope.json"), "--steps", "1", "--out", str(tmp_path / "r"))
    assert_clean_error(res, "--config", "nope.json", "does not exist")
    assert not (tmp_path / "r").exists()


def test_init_that_is_not_a_checkpoint_is_a_message(tmp_path):
    missing = tmp_path / "NOT_A_CKPT"
    res = invoke("train", "--stage", "sft", "--init", str(missing), "--steps", "1", "--out", str(tmp_path / "r"))
    assert_clean_error(res, "--init", str(missing), "does not exist", "config.json", "model.safetensors")
    assert not missing.exists() and not (tmp_path / "r").exists()

    incomplete = tmp_path / "half"
    incomplete.mkdir()
    (incomplete / "config.json").write_text(tiny_config(vocab_size=264).to_json())
    res = invoke("train", "--stage", "cpt", "--init", str(incomplete), "--steps", "1", "--out", str(tmp_path / "r"))
    assert_clean_error(res, "--init", "model.safetensors", "is missing", "checkpoint folder")
    assert not (tmp_path / "r").exists()


def test_attention_backend_that_cannot_run_is_a_message(tmp_path):
    res = invoke(
        "train", "--preset", "toy-d16", "--steps", "1", "--batch-size", "2", "--seq-len", "32",
        "--attention-backend", "flash", "--device", "cpu", "--dtype", "float32", "--out", str(tmp_path / "r"),
    )  # fmt: skip
    assert_clean_error(res, "flash")
    assert not (tmp_path / "r").exists()


def test_a_run_that_fails_at_its_first_step_leaves_no_folder(tmp_path):
    """The error comes from the first batch (after the run's config was written): nothing is left at --out."""
    far = tmp_path / "far.json"
    far.write_text(json.dumps({"tasks": {"needle": 1}, "levels": [{"distance": [900, 1000]}]}))
    cfg = tmp_path / "model.json"
    cfg.write_text(tiny_config(vocab_size=264, max_seq_len=256).to_json())
    res = invoke(
        "train", "--config", str(cfg), "--curriculum", str(far), "--tokenizer", "byte", "--steps", "2",
        "--batch-size", "2", "--seq-len", "256", "--out", str(tmp_path / "r"),
    )  # fmt: skip
    assert_clean_error(res, "longer than --seq-len 256", "raise --seq-len")
    assert not (tmp_path / "r").exists()


def test_plugin_errors_do_not_import_torch():
    """The trainer's commands catch every error of headprobe's own through one base, importable without torch
    (before: a list of names looked up in whichever torch-importing modules were loaded)."""
    code = (
        "import sys; from trainer.plugin import PLUGIN; assert 'torch' not in sys.modules, 'torch imported'; "
        "from headprobe.model.checkpoint import CheckpointError; from headprobe.model.attention import "
        "AttentionBackendError; from headprobe.model.config import ConfigError; from headprobe.core.atomic import "
        "FolderBusy; from trainer.config import TrainError; from trainer.data import DataError; "
        "errors = (CheckpointError, AttentionBackendError, ConfigError, FolderBusy, TrainError, DataError); "
        "assert all(issubclass(e, PLUGIN.errors) for e in errors), PLUGIN.errors; "
        "assert not issubclass(ValueError, PLUGIN.errors) and not issubclass(KeyError, PLUGIN.errors)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_training_without_a_terminal_logs_progress_lines(tmp_path):
    """As in ``headprobe train ... > log 2>&1`` on a cluster (CliRunner's stderr is no terminal)."""
    from typer.testing import CliRunner

    from headprobe.cli import app
    from headprobe.testing import tiny_config

    src = tmp_path / "doc.txt"
    src.write_text("A small document about keys and doors. " * 100)
    runner = CliRunner()
    assert runner.invoke(app, ["data", "prepare", str(src), "--out", str(tmp_path / "data")]).exit_code == 0
    cfg = tmp_path / "model.json"
    cfg.write_text(tiny_config(vocab_size=264, max_seq_len=64).to_json())
    args = ["train", "--config", str(cfg), "--data", str(tmp_path / "data"), "--steps", "4", "--batch-size", "2",
            "--seq-len", "32", "--out", str(tmp_path / "run")]  # fmt: skip
    res = runner.invoke(app, args, env={"HEADPROBE_PROGRESS_EVERY": "0"})
    assert res.exit_code == 0, res.output
    lines = [line for line in res.output.splitlines() if line.startswith("[train]")]
    assert [line.split()[1] for line in lines] == ["1/4", "2/4", "3/4", "4/4"]
    assert all("loss " in line and "tok/s" in line and "elapsed" in line for line in lines)
    assert "ETA" in lines[0]
