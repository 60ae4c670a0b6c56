"""Hardening, second round (issue 28): a results folder is never silently taken over. ``analyze`` refuses a
folder holding another checkpoint's results or results made with other settings (as ``ruler eval``
does), and no command writes into a folder whose run record is another command's. Each refusal is one
``error:`` line naming the folder, the conflict and the fix, and leaves every earlier file as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_checks import invoke, one_error, refused, snapshot
from click.testing import Result

from headprobe.testing import tiny_checkpoint


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    """Two different tiny models saved under the same folder name, ``tiny``."""
    first, second = (
        tiny_checkpoint(tmp_path_factory.mktemp(f"m{seed}") / "tiny", seed=seed, vocab_size=264, max_seq_len=1024)
        for seed in (0, 1)
    )
    return first, second


def analyze(ckpt: Path, out: Path, *extra: str) -> Result:
    return invoke("analyze", ckpt, "--metrics", "entropy", "--lengths", "128", "--samples", "1", "--out", out,
                  "--no-progress", *extra)  # fmt: skip


@pytest.fixture(scope="module")
def analysed(models, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("a") / "out"
    res = analyze(models[0], out)
    assert res.exit_code == 0, res.output
    return out


def test_analyze_refuses_a_folder_with_another_checkpoints_results(analysed, models, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(analysed, out)
    before = snapshot(out)
    message = one_error(analyze(models[1], out), 2, f"{out / 'tiny'} holds the results of another checkpoint",
                        str(models[0].resolve()), "another --out", "delete")  # fmt: skip
    assert "--out" in message
    assert snapshot(out) == before


def test_analyze_refuses_a_rerun_with_other_settings_and_names_them(analysed, models, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(analysed, out)
    before = snapshot(out)
    one_error(analyze(models[0], out, "--seed", "7"), 2, "holds results made with other settings",
              "--seed 0 there, 7 now", "rerun with the same settings")  # fmt: skip
    assert snapshot(out) == before


def test_analyze_adds_lengths_and_metrics_to_its_own_folder(analysed, models, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(analysed, out)
    first = (out / "tiny" / "parts" / "entropy-128-s0.parquet").read_bytes()
    res = invoke("analyze", models[0], "--metrics", "entropy,erank", "--lengths", "128,256", "--samples", "1",
                 "--out", out, "--no-progress")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "entropy @ 128: done earlier, skipped" in res.output
    assert (out / "tiny" / "parts" / "entropy-128-s0.parquet").read_bytes() == first  # not redone
    assert (out / "tiny" / "parts" / "erank-256.parquet").is_file()


@pytest.mark.parametrize("first", ["analyze", "ruler eval"])
def test_no_command_takes_over_another_commands_folder(models, tmp_path, first):
    out = tmp_path / "out"
    out.mkdir()
    other = {"analyze": "ruler eval", "ruler eval": "analyze"}[first]
    (out / "run.json").write_text(json.dumps({"job": first, "settings": {}}) + "\n")
    before = snapshot(out)
    if other == "analyze":
        res = analyze(models[0], out)
    else:
        res = invoke("ruler", "eval", models[0], "--tasks", "niah_single_1", "--lengths", "256", "--samples", "1",
                     "--out", out, "--no-progress")  # fmt: skip
    refused(res, f"{out} holds the results of `headprobe {first}`", f"give `headprobe {other}` another --out")
    assert snapshot(out) == before


def test_ablate_refuses_an_analyze_folder(models, analysed, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(analysed, out)
    before = snapshot(out)
    res = invoke("ablate", models[0], "--heads", "0.0", "--tasks", "needle", "--lengths", "256", "--samples", "1",
                 "--out", out, "--no-progress")  # fmt: skip
    refused(res, "holds the results of `headprobe analyze`", "give `headprobe ablate` another --out")
    assert snapshot(out) == before
