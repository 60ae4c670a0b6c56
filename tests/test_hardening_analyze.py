"""Bad input to ``headprobe analyze`` (and the command as a whole) is refused before any work, with a
message that names the problem and the fix; nothing is left half written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version

import pytest
import torch
import typer
from typer.testing import CliRunner

from headprobe.cli import app
from headprobe.core.atomic import LOCK_FILE, folder_lock
from headprobe.model.checkpoint import save_checkpoint
from headprobe.model.transformer import Transformer
from headprobe.results import read_meta
from headprobe.testing import tiny_config


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A tiny byte-level checkpoint trained (by its config) on 64-token sequences."""
    torch.manual_seed(0)
    return save_checkpoint(
        Transformer(tiny_config(vocab_size=264, max_seq_len=64)), tmp_path_factory.mktemp("c") / "tiny"
    )


def analyze(*args: str):
    return CliRunner().invoke(app, ["analyze", *args])


def listing(folder):
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else None


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without CUDA")
def test_cuda_on_a_cpu_torch_is_refused_before_loading(ckpt, tmp_path):
    out = analyze(str(ckpt), "--device", "cuda", "--out", str(tmp_path / "r"))
    assert out.exit_code == 2 and "--device cuda" in out.output and "--device cpu" in out.output
    assert "Traceback" not in out.output and listing(tmp_path / "r") is None


def test_an_output_path_that_is_a_file_is_refused_first(ckpt, tmp_path):
    target = tmp_path / "afile"
    target.write_text("keep me")
    out = analyze(str(ckpt), "--out", str(target), "--lengths", "48")
    assert out.exit_code == 2 and "is a file; give a folder" in out.output
    assert target.read_text() == "keep me"


@pytest.mark.parametrize("text", ["abc", "1x", "0", "4k,"])
def test_lengths_that_do_not_parse_name_the_option(ckpt, tmp_path, text):
    out = analyze(str(ckpt), "--lengths", text, "--out", str(tmp_path / "r"))
    assert out.exit_code == 2 and "--lengths" in out.output and "4096,16k,128K" in out.output
    assert "invalid literal" not in out.output and listing(tmp_path / "r") is None


def test_k_suffixes_are_token_counts_and_lengths_beyond_training_are_refused(ckpt, tmp_path):
    out = analyze(str(ckpt), "--lengths", "1k", "--metrics", "entropy", "--out", str(tmp_path / "r"))
    assert out.exit_code == 2
    assert "1,024 tokens exceed the 64 positions it was trained on" in out.output
    assert "--lengths" in out.output and "--allow-beyond-trained" in out.output
    assert listing(tmp_path / "r") is None  # refused before anything was loaded or written
    ok = analyze(str(ckpt), "--lengths", "1k", "--metrics", "entropy", "--samples", "1", "--rows", "last:8",
                 "--allow-beyond-trained", "--out", str(tmp_path / "r"), "--no-progress")  # fmt: skip
    assert ok.exit_code == 0, ok.output
    assert "measuring extrapolation" in ok.output
    meta = read_meta(tmp_path / "r" / "tiny" / "entropy.parquet")
    assert meta.settings["allow_beyond_trained"] is True and meta.settings["lengths"] == [1024]


def test_haystack_files_are_checked_before_any_model_loads(tmp_path):
    binary = tmp_path / "hay.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")
    missing = tmp_path / "nothing.txt"
    for path, message in ((binary, "is not UTF-8 text"), (missing, "does not exist")):
        # the checkpoint does not exist either: the haystack's error comes first, so it was checked first
        out = analyze(str(tmp_path / "no-ckpt"), "--haystack-file", str(path), "--out", str(tmp_path / "r"))
        assert out.exit_code == 2 and f"--haystack-file {path} {message}" in out.output, out.output
    assert listing(tmp_path / "r") is None


def test_a_second_run_on_a_busy_output_folder_is_refused_naming_the_holder(ckpt, tmp_path):
    out_dir = tmp_path / "r"
    with folder_lock(out_dir):
        out = analyze(str(ckpt), "--lengths", "48", "--metrics", "entropy", "--out", str(out_dir))
        assert out.exit_code == 2
        assert f"being written by another headprobe run (pid {os.getpid()})" in out.output
        assert listing(out_dir) == [LOCK_FILE]  # nothing written by the refused run
    assert listing(out_dir) is None  # released: the lock file and the folder it made are gone
    # released with the block: the next run takes the folder
    ok = analyze(str(ckpt), "--lengths", "48", "--metrics", "entropy", "--samples", "1", "--out", str(out_dir),
                 "--no-progress")  # fmt: skip
    assert ok.exit_code == 0, ok.output
    assert json.loads((out_dir / "run.json").read_text())["checkpoints"] == {"tiny": str(ckpt)}


def test_a_lock_is_released_when_its_holder_dies(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", f"from pathlib import Path; from headprobe.core.atomic import folder_lock\n"
         f"with folder_lock(Path({str(tmp_path)!r})):\n    import os; os._exit(3)"],
    )  # fmt: skip
    assert holder.wait(timeout=60) == 3
    with folder_lock(tmp_path):  # taken at once
        pass


def test_errors_of_headprobe_show_one_line_and_debug_shows_the_traceback(capsys, own_signals):
    from headprobe.cli import _App
    from headprobe.model.config import ConfigError

    demo = _App(pretty_exceptions_enable=False)

    @demo.callback()
    def root(debug: bool = False) -> None:
        demo.session.debug = debug

    @demo.command()
    def boom() -> None:
        raise ConfigError("width 100 does not divide 128; choose a width that does")

    @demo.command()
    def bug() -> None:
        raise KeyError("a real bug keeps its traceback")

    with pytest.raises(SystemExit) as stop:
        demo(["boom"], prog_name="demo")
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "error: width 100 does not divide 128; choose a width that does" in err and "Traceback" not in err
    with pytest.raises(ConfigError):
        demo(["--debug", "boom"], prog_name="demo")
    demo.session.debug = False
    with pytest.raises(KeyError):
        demo(["bug"], prog_name="demo")
    assert isinstance(demo, typer.Typer)


def test_version():
    out = subprocess.run([sys.executable, "-m", "headprobe", "--version"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == f"headprobe {version('headprobe')}"


def test_without_a_terminal_progress_is_plain_lines_in_the_log(ckpt, tmp_path):
    """As in a cluster job's ``> log 2>&1``: CliRunner's stderr is no terminal; one line per update here."""
    out = CliRunner().invoke(
        app,
        [
            "analyze",
            str(ckpt),
            "--lengths",
            "48,64",
            "--metrics",
            "entropy",
            "--samples",
            "1",
            "--out",
            str(tmp_path / "r"),
        ],
        env={"HEADPROBE_PROGRESS_EVERY": "0"},
    )
    assert out.exit_code == 0, out.output
    lines = [line for line in out.output.splitlines() if line.startswith("[analyze]")]
    assert lines[0].startswith("[analyze] 1/2 (50%)") and "ETA" in lines[0] and "tiny entropy @ 48" in lines[0]
    assert lines[-1].startswith("[analyze] 2/2 (100%)") and "tiny entropy @ 64" in lines[-1]
