"""Hardening of the evaluation commands (``ruler generate``, ``ruler eval``, ``shortctx eval``, ``plan``):
each refusal exits 2 before any work, names the problem and the fix, and leaves no output behind."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

import headprobe.evals.ruler.job as evaluate_mod
from headprobe.cli import app
from headprobe.evals.ruler import RulerGenerator
from headprobe.evals.ruler.tasks import GROUPS, TASKS
from headprobe.model.tokenizer import ByteTokenizer
from headprobe.results import read_table

WIDE = {"COLUMNS": "300"}  # rich wraps help and errors to the terminal's width


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args], env=WIDE)


def flat(res: Result) -> str:
    """The command's output with rich's line wrapping undone."""
    return " ".join(res.output.split())


def refused(res: Result, *says: str) -> str:
    """Assert ``res`` exited 2 with a message (no traceback) saying each of ``says``; returns the output."""
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    text = flat(res)
    for part in says:
        assert part in text, (part, text)
    return text


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Tiny byte-level checkpoints "trained" on 4,096 and on 512 positions."""
    import torch

    from headprobe.model.checkpoint import save_checkpoint
    from headprobe.model.transformer import Transformer
    from headprobe.testing import tiny_config

    root = tmp_path_factory.mktemp("ckpts")
    out = {}
    for name, trained in (("long", 4096), ("short", 512)):
        torch.manual_seed(trained)
        save_checkpoint(Transformer(tiny_config(vocab_size=264, max_seq_len=trained)), root / name)
        out[name] = root / name
    return out


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if any model is loaded."""

    def load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(evaluate_mod, "load_model", load)


def length_rows(out: Path):
    scores = read_table(out / "ruler_scores.parquet")
    return scores, scores.frame[scores.frame.scope == "length"].set_index("length")


# 1 ------------------------------------------------------------------------------------------------
def test_eval_of_a_data_file_takes_its_lengths_and_refuses_a_filter_that_leaves_nothing(
    tmp_path, checkpoints, monkeypatch
):
    data = tmp_path / "s.jsonl"
    res = invoke(
        "ruler", "generate", "--out", data, "--lengths", "2048", "--samples", "2", "--tasks", "niah_single_1,qa_1"
    )
    assert res.exit_code == 0, res.output
    loads = []
    real_load = evaluate_mod.load_model
    monkeypatch.setattr(evaluate_mod, "load_model", lambda *a, **k: loads.append(a) or real_load(*a, **k))

    out = tmp_path / "r"
    base = ["ruler", "eval", checkpoints["long"], "--data", data, "--out", out, "--no-progress"]
    text = refused(invoke(*base, "--lengths", "4096"), "--lengths 4,096", "2,048", "niah_single_1, qa_1", "choose")
    assert "--data" in text
    refused(invoke(*base, "--tasks", "vt"), "--tasks vt", "lengths 2,048", "niah_single_1, qa_1")
    assert not loads and not out.exists()  # refused before any model work, nothing written

    res = invoke(*base)  # no --lengths: the file's
    assert res.exit_code == 0, res.output
    assert len(loads) == 1
    scores, per_length = length_rows(out / "long")
    assert scores.meta.settings["lengths"] == [2048] and scores.meta.settings["tasks"] == ["niah_single_1", "qa_1"]
    assert list(per_length.index) == [2048] and per_length.loc[2048, "n"] == 2 == per_length.loc[2048, "n_tasks"]
    samples = read_table(out / "long" / "ruler_samples.parquet").frame
    assert len(samples) == 4 and set(samples.length) == {2048}
    assert "2,048" in res.output and "tasks in mean" not in res.output  # every task scored: nothing to say


# 2 ------------------------------------------------------------------------------------------------
def test_generate_refuses_zero_samples_and_writes_nothing(tmp_path):
    kept = tmp_path / "kept.jsonl"
    kept.write_text("earlier\n")
    for out in (tmp_path / "new.jsonl", kept):
        refused(invoke("ruler", "generate", "--out", out, "--samples", "0"), "--samples", "at least 1", "got 0")
    assert not (tmp_path / "new.jsonl").exists() and kept.read_text() == "earlier\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.jsonl"]  # no temporary file left either


# 3 ------------------------------------------------------------------------------------------------
def test_generate_skips_tasks_too_long_for_a_length_and_eval_says_so(tmp_path, checkpoints):
    data = tmp_path / "s.jsonl"
    res = invoke(
        "ruler", "generate", "--out", data, "--lengths", "1024", "--samples", "2", "--tasks", "niah_single_1,vt,cwe"
    )
    assert res.exit_code == 0, res.output
    warning = re.search(
        r"skipped at length 1,024.*?: vt \(needs about ([\d,]+)\), cwe \(needs about ([\d,]+)\)", flat(res)
    )
    assert warning, res.output
    rows = [json.loads(x) for x in data.read_text().splitlines()]
    assert [(r["task"], r["index"]) for r in rows] == [("niah_single_1", 0), ("niah_single_1", 1)]
    skipped = rows[0]["skipped_tasks"]
    assert all(r["skipped_tasks"] == skipped for r in rows) and list(skipped) == ["vt", "cwe"]
    assert [f"{n:,}" for n in skipped.values()] == list(warning.groups())  # the warning's numbers are recorded
    gen = RulerGenerator(ByteTokenizer())
    for task, needed in skipped.items():
        assert needed > 1024
        assert gen.sample(task, needed, 0)["token_count"] <= needed  # the recorded minimum really fits

    out = tmp_path / "r"
    res = invoke("ruler", "eval", checkpoints["long"], "--data", data, "--out", out, "--no-progress")
    assert res.exit_code == 0, res.output
    scores, per_length = length_rows(out / "long")
    assert (per_length.loc[1024, "n"], per_length.loc[1024, "n_tasks"]) == (1, 3)
    assert per_length.loc[1024, "skipped"] == "vt,cwe"
    task_rows = scores.frame[scores.frame.scope == "task"]
    assert set(task_rows.task) == {"niah_single_1"}
    assert per_length.loc[1024, "score"] == task_rows.score.iloc[0]  # the mean leaves the skipped tasks out
    text = flat(res)
    assert "tasks in mean │ 1 of 3" in text and "vt │ skipped" in text and "cwe │ skipped" in text


def test_eval_generating_its_samples_skips_the_same_way(tmp_path, checkpoints):
    out = tmp_path / "r"
    args = ["ruler", "eval", checkpoints["long"], checkpoints["short"], "--out", out, "--no-progress"]
    res = invoke(*args, "--tasks", "niah_single_1,vt", "--lengths", "512", "--samples", "1")
    assert res.exit_code == 0, res.output
    assert re.search(r"long: warning: skipped at length 512, .*: vt \(needs about 1,297\)", flat(res))
    assert re.search(r"│ long │ \d+\.\d\d \(1/2\) │", flat(res)), res.output  # the comparison says so too
    for name in ("long", "short"):
        _, per_length = length_rows(out / name)
        assert (per_length.loc[512, "n"], per_length.loc[512, "n_tasks"], per_length.loc[512, "skipped"]) == (
            1,
            2,
            "vt",
        )


def test_generate_refuses_a_length_no_task_fits(tmp_path):
    out = tmp_path / "s.jsonl"
    refused(
        invoke("ruler", "generate", "--out", out, "--lengths", "100,2048", "--tasks", "niah_single_1,vt"),
        "no task fits length 100",
        "niah_single_1 about",
        "vt about 1,297",
        "use longer --lengths",
    )
    assert not out.exists()


def test_eval_refuses_a_length_no_task_fits_and_leaves_nothing(tmp_path, checkpoints):
    out = tmp_path / "r"
    res = invoke(
        "ruler", "eval", checkpoints["long"], "--out", out, "--no-progress", "--tasks", "vt", "--lengths", "512"
    )
    refused(res, "no task fits length 512", "vt about 1,297", "use longer --lengths")
    leftovers = sorted(str(p.relative_to(out)) for p in out.rglob("*")) if out.exists() else []
    assert leftovers == [], leftovers  # no predictions/run.json claiming the folder for settings that never ran


@pytest.mark.parametrize("command", ["ruler", "shortctx"])
def test_eval_holds_its_output_folder_and_sweeps_what_a_killed_run_left(tmp_path, checkpoints, command):
    from headprobe.core.atomic import LOCK_FILE, folder_lock

    out = tmp_path / "r"
    args = ["ruler", "eval", "--tasks", "niah_single_1", "--lengths", "512", "--samples", "1"]
    if command == "shortctx":
        args = ["shortctx", "eval", "--task", "builtin", "--limit", "2"]
    with folder_lock(out):
        res = invoke(*args[:2], checkpoints["long"], *args[2:], "--out", out, "--no-progress")
        refused(res, "being written by another headprobe run", f"pid {os.getpid()}", "another --out")
        assert [p.name for p in out.iterdir()] == [LOCK_FILE]
    out.mkdir()
    (out / ".ruler_scores.parquet.tmp-0123abcd").write_text("a killed run's half-written table")
    res = invoke(*args[:2], checkpoints["long"], *args[2:], "--out", out, "--no-progress")
    assert res.exit_code == 0, res.output
    assert not any(p.name.startswith(".") for p in out.rglob("*")), sorted(out.rglob("*"))


# 4 ------------------------------------------------------------------------------------------------
def test_eval_refuses_lengths_beyond_training_before_loading_unless_allowed(tmp_path, checkpoints, no_model):
    out = tmp_path / "r"
    opts = ["--tasks", "niah_single_1", "--lengths", "1k", "--samples", "1", "--out", out, "--no-progress"]
    for ckpts in ([checkpoints["short"]], [checkpoints["long"], checkpoints["short"]]):
        refused(
            invoke("ruler", "eval", *ckpts, *opts),
            f"{checkpoints['short']}: 1,024 tokens exceed the 512 positions",
            "use --lengths up to 512",
            "--allow-beyond-trained",
        )
        assert not out.exists()


def test_allow_beyond_trained_warns_and_is_recorded(tmp_path, checkpoints):
    out = tmp_path / "r"
    opts = ["--tasks", "niah_single_1", "--lengths", "1k", "--samples", "1", "--out", out, "--no-progress"]
    res = invoke("ruler", "eval", checkpoints["short"], *opts, "--allow-beyond-trained")
    assert res.exit_code == 0, res.output
    assert "warning:" in res.output and "exceed the 512 positions" in flat(res)
    scores = read_table(out / "short" / "ruler_scores.parquet")
    assert scores.meta.settings["allow_beyond_trained"] is True and scores.meta.settings["lengths"] == [1024]
    assert json.loads((out / "run.json").read_text())["settings"]["allow_beyond_trained"] is True


# 5 ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["generate", "eval"])
@pytest.mark.parametrize("bad", ["abc", "4096,x", "0"])
def test_lengths_are_token_counts(tmp_path, checkpoints, command, bad, no_model):
    target = (
        ["--out", tmp_path / "o.jsonl"] if command == "generate" else [checkpoints["long"], "--out", tmp_path / "r"]
    )
    text = refused(invoke("ruler", command, *target, "--lengths", bad), "--lengths", "not a positive token count")
    assert "4096,16k,128K" in text
    assert list(tmp_path.iterdir()) == []


def test_lengths_accept_k_suffixes(tmp_path):
    out = tmp_path / "s.jsonl"
    res = invoke("ruler", "generate", "--out", out, "--lengths", "1k,2K", "--samples", "1", "--tasks", "niah_single_1")
    assert res.exit_code == 0, res.output
    assert [json.loads(x)["length"] for x in out.read_text().splitlines()] == [1024, 2048]


# 6 ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["generate", "eval"])
def test_tasks_help_lists_every_task_and_group(command):
    res = invoke("ruler", command, "--help")
    assert res.exit_code == 0, res.output
    line = re.search(r"--tasks\s.*?\[default: all\]", flat(res))
    assert line, res.output
    words = set(re.findall(r"[a-z_0-9]+", line.group(0)))
    assert set(TASKS) | set(GROUPS) <= words


# 7 ------------------------------------------------------------------------------------------------
def test_shortctx_names_an_unknown_task_before_asking_for_its_file(tmp_path, checkpoints):
    out = tmp_path / "r"
    text = refused(
        invoke("shortctx", "eval", checkpoints["long"], "--task", "mmlu", "--out", out),
        "unknown --task 'mmlu'",
        "choose builtin or one of jsonl, arc,",
    )
    assert "--file" not in text
    refused(invoke("shortctx", "eval", checkpoints["long"], "--task", "arc", "--out", out), "--task arc needs --file")
    assert not out.exists()


# 8 ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("content", ["[]", '"toy"', "3", "null", "[{}]"])
def test_plan_refuses_a_config_that_is_not_a_json_object(tmp_path, content):
    path = tmp_path / "c.json"
    path.write_text(content)
    text = refused(invoke("plan", "--config", path), str(path), "expected a JSON object")
    assert "missing the" not in text


def test_eval_checks_haystack_files_before_loading_a_model(tmp_path, checkpoints, no_model):
    binary = tmp_path / "hay.bin"
    binary.write_bytes(b"\x00\xff\xfe\x89 not text")
    opts = ["--tasks", "niah_single_3", "--lengths", "1k", "--samples", "1", "--out", tmp_path / "r"]
    refused(invoke("ruler", "eval", checkpoints["long"], *opts, "--haystack-file", binary),
            f"--haystack-file {binary} is not UTF-8 text", "convert it to UTF-8")  # fmt: skip
    refused(invoke("ruler", "eval", checkpoints["long"], *opts, "--haystack-file", tmp_path / "gone.txt"),
            f"--haystack-file {tmp_path / 'gone.txt'} does not exist")  # fmt: skip
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("command", [["ruler", "eval"], ["shortctx", "eval", "--task", "builtin"]])
def test_an_output_path_that_is_a_file_is_refused_before_any_work(tmp_path, checkpoints, no_model, command):
    target = tmp_path / "afile"
    target.write_text("keep me")
    refused(invoke(*command, checkpoints["long"], "--out", target), f"--out {target} is a file; give a folder")
    assert target.read_text() == "keep me"
