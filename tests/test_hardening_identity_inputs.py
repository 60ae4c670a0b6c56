"""Hardening, third round (issue 37): results keyed by everything that made them, and no silent resume of a
training run with other settings.

* A checkpoint's identity covers its config and tokenizer files, not only its weights: a ``config.json``
  edited in place (same weights, another window and RoPE base) is another model, so a rerun into its
  results folder is refused, and results of the two are read apart.
* Every input file a job reads is keyed by its content (SHA-256), besides its path: a haystack, a
  short-context task file, RULER-style samples, a needles file edited or made anew is refused by name on a
  rerun ("F changed since these results were made"), and results of two contents are read apart by ``show``.
  Runs without files keep their keys (results made before still resume).
* A training run resumes only with the settings it trained with (optimizer, schedule, steps, batch, seed
  ...); ``train_config.json`` is never rewritten to settings the run did not train with; a grid or study
  refuses, before any run trains, a recipe whose settings differ from the runs already in its folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from cli_checks import invoke, one_error, refused, snapshot

from headprobe.core.identity import checkpoint_identity, identity_changes
from headprobe.core.paths import changed_files, content_keys, file_sha256
from headprobe.results import read_meta, read_table, write_table
from headprobe.testing import tiny_checkpoint, tiny_config
from trainer.train_state import training_differences

TINY = dict(vocab_size=264, max_seq_len=1024)


@pytest.fixture
def tiny(tmp_path) -> Path:
    return tiny_checkpoint(tmp_path / "tiny", seed=0, **TINY)


def analyze(ckpt: Path, out: Path, length: str, *extra: str):
    return invoke("analyze", ckpt, "--metrics", "entropy", "--lengths", length, "--samples", "1", "--out", out,
                  "--no-progress", *extra)  # fmt: skip


def edit_config(ckpt: Path, **swa) -> None:
    """Edit ``config.json`` in place as a user would: the same weights, another model."""
    config = json.loads((ckpt / "config.json").read_text())
    config["swa"] |= swa
    config["full"]["rope_theta"] = 50000.0
    (ckpt / "config.json").write_text(json.dumps(config, indent=2))


def part_keys(folder: Path) -> list[dict]:
    return [read_meta(p).key for p in sorted((folder / "parts").glob("*.parquet"))]


# ---------------------------------------------------------------------------------------------
# the checkpoint: weights and config
# ---------------------------------------------------------------------------------------------
def test_the_identity_records_config_and_tokenizer_files_by_content(tmp_path):
    from headprobe.testing import build_toy_bpe

    bpe = tiny_checkpoint(tmp_path / "bpe", tokenizer=_tokenizer(build_toy_bpe(tmp_path / "tok.json", vocab_size=260)),
                          **TINY)  # fmt: skip
    before = checkpoint_identity(bpe)
    assert sorted(before["config"]) == ["config.json", "tokenizer.json"]
    assert before["config"]["config.json"] == file_sha256(bpe / "config.json")[:16]
    tokenizer = json.loads((bpe / "tokenizer.json").read_text())
    tokenizer["added_tokens"] = [*tokenizer.get("added_tokens", []), {"id": 259, "content": "<x>", "special": True}]
    (bpe / "tokenizer.json").write_text(json.dumps(tokenizer))
    after = checkpoint_identity(bpe)
    assert after["weights"] == before["weights"] and identity_changes(before, after) == ["tokenizer.json"]
    assert identity_changes(before, before) == []
    old = {k: v for k, v in before.items() if k != "config"}  # recorded before the config files were
    assert identity_changes(old, after) == []  # tells nothing of them: such results still resume


def _tokenizer(path: Path):
    from headprobe.model.tokenizer import load_tokenizer

    return load_tokenizer(path)


def test_a_config_edited_in_place_is_another_model_refused_on_rerun_and_read_apart(tiny, tmp_path):
    out = tmp_path / "both" / "out"
    assert analyze(tiny, out, "128").exit_code == 0
    before = snapshot(out)
    edit_config(tiny, window=64)  # the trial: window 5 -> 64, rope_theta 500 -> 50000, the same weights
    res = analyze(tiny, out, "256")
    refused(res, f"{out / 'tiny'} holds results of {tiny} as it was on ",
            "its weights or config changed since (config.json differs), so they are no longer its results",
            "give another --out, or delete")  # fmt: skip
    assert snapshot(out) == before  # nothing computed with the new config beside the old results
    # the edited model's results in a folder of their own: read apart from the first, not pooled
    assert analyze(tiny, tmp_path / "both" / "edited", "128").exit_code == 0
    res = invoke("show", tmp_path / "both")
    assert res.exit_code == 0, res.output
    assert "were made from other config files at one path" in res.output
    assert res.output.count("tiny (config of ") >= 2, res.output


def test_ruler_predictions_of_a_config_edited_since_are_not_reused(tiny, tmp_path):
    args = ("ruler", "eval", tiny, "--out", tmp_path / "r", "--tasks", "niah_single_1", "--lengths", "600",
            "--samples", "1", "--no-progress")  # fmt: skip
    assert invoke(*args).exit_code == 0
    before = snapshot(tmp_path / "r")
    edit_config(tiny, window=32)
    refused(invoke(*args), "holds predictions of", "its weights or config changed since (config.json differs)",
            "use another --out")  # fmt: skip
    assert snapshot(tmp_path / "r") == before


def test_results_recorded_without_config_files_still_resume(tiny, tmp_path):
    out = tmp_path / "out"
    assert analyze(tiny, out, "128").exit_code == 0
    for path in (out / "tiny" / "parts").glob("*.parquet"):  # as an earlier headprobe wrote them
        table = read_table(path)
        table.meta.identity.pop("config")
        write_table(path, table.frame, table.meta)
    res = analyze(tiny, out, "128")
    assert res.exit_code == 0 and "tiny entropy @ 128: done earlier, skipped" in res.output, res.output


# ---------------------------------------------------------------------------------------------
# input files: keyed by content
# ---------------------------------------------------------------------------------------------
def test_content_keys_name_only_files_given_and_changed_files_compares_one_path(tmp_path):
    a = tmp_path / "a.txt"
    a.write_text("one")
    assert content_keys(haystack=None, needles="builtin") == {}  # no file: the keys stay as they were
    keys = content_keys(haystack=[str(a)], data=str(a))
    assert keys == {"haystack_sha256": {str(a): file_sha256(a)}, "data_sha256": {str(a): file_sha256(a)}}
    a.write_text("two")
    assert changed_files(keys, content_keys(haystack=[str(a)])) == [str(a)]
    assert changed_files(keys, content_keys(haystack=[str(tmp_path / "b.txt")])) == []  # another path: its setting


def test_analyze_with_an_edited_haystack_is_refused_naming_it(tiny, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("hay.txt").write_text("The quick brown fox jumps over the lazy dog. " * 60)
    out = tmp_path / "out"
    assert analyze(tiny, out, "128", "--haystack-file", "hay.txt").exit_code == 0
    settings = json.loads((out / "run.json").read_text())["settings"]
    assert settings["haystack_files"] == ["hay.txt"]
    assert settings["haystack_sha256"] == {"hay.txt": file_sha256("hay.txt")}  # run.json: the content too
    assert all(k["haystack_sha256"] == {"hay.txt": file_sha256("hay.txt")} for k in part_keys(out / "tiny"))
    before = snapshot(out)
    with open("hay.txt", "a") as f:
        f.write("A new closing sentence. " * 20)
    refused(analyze(tiny, out, "256", "--haystack-file", "hay.txt"),
            f"hay.txt changed since these results were made ({out / 'tiny'} holds results of its earlier content); "
            f"restore it, give another --out for the new content, or delete {out / 'tiny'} to redo them")  # fmt: skip
    assert snapshot(out) == before


def test_a_needles_file_keys_retrieval_by_content_and_not_the_metrics_that_never_read_it(tmp_path):
    from headprobe.analysis import AnalyzeSettings
    from headprobe.metrics import get_metrics

    needles = tmp_path / "n.jsonl"
    needles.write_text('{"before": "The code is ", "answer": "4821", "after": ".", "question": "What is the code?"}\n')
    s = AnalyzeSettings(needles=str(needles))
    retrieval, entropy = get_metrics(["retrieval", "entropy"])
    assert s.key(retrieval, 128, tmp_path, [])["needles_sha256"] == {str(needles): file_sha256(needles)}
    assert "needles_sha256" not in s.key(entropy, 128, tmp_path, [])  # entropy reads no needle
    assert "needles_sha256" not in AnalyzeSettings(needles="codes").key(retrieval, 128, tmp_path, [])


def test_a_needle_reach_keys_retrieval_only_when_given_so_earlier_results_keep_their_keys(tmp_path):
    from headprobe.analysis import AnalyzeSettings
    from headprobe.metrics import get_metrics

    retrieval, entropy = get_metrics(["retrieval", "entropy"])
    earlier = {
        "metric",
        "revision",
        "length",
        "checkpoint",
        "prompt_start",
        "samples",
        "seed",
        "haystack",
        "dtype",
        "max_new_tokens",
        "needles",
        "retrieval_span",
        "prompt_format",
    }  # a retrieval key before the reach
    assert set(AnalyzeSettings().key(retrieval, 128, tmp_path, [])) == earlier
    assert AnalyzeSettings(needle_reach=7).key(retrieval, 128, tmp_path, [])["needle_reach"] == 7
    assert "needle_reach" not in AnalyzeSettings(needle_reach=7).key(entropy, 128, tmp_path, [])


def test_runs_without_files_keep_their_keys(tiny, tmp_path):
    assert analyze(tiny, tmp_path / "out", "128").exit_code == 0
    (key,) = part_keys(tmp_path / "out" / "tiny")
    assert not [k for k in key if k.endswith("_sha256")]  # the key results made before this round carry


def mc_items(path: Path, label: int) -> Path:
    rows = [{"context": "The sky is", "choices": [" blue", " green", " red"], "label": label}] * 6
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def shortctx(ckpt: Path, out: Path):
    return invoke("shortctx", "eval", ckpt, "--task", "jsonl", "--file", "mc.jsonl", "--out", out, "--no-progress")


def test_shortctx_with_edited_labels_is_refused_and_show_keeps_both_contents_apart(tiny, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mc_items(Path("mc.jsonl"), label=0)
    first = tmp_path / "all" / "first"
    assert shortctx(tiny, first).exit_code == 0
    before = snapshot(first)
    (pred,) = set(pd.read_parquet(first / "tiny" / "shortctx_items.parquet")["pred"])  # six items alike
    mc_items(Path("mc.jsonl"), label=1 if pred == 0 else pred)  # the same path, other labels: other accuracy
    refused(shortctx(tiny, first), "mc.jsonl changed since these results were made", "give another --out", "delete")
    assert snapshot(first) == before  # the old score is not reported as this file's
    second = tmp_path / "all" / "second"
    assert shortctx(tiny, second).exit_code == 0
    accs = {f: pd.read_parquet(tmp_path / "all" / f / "tiny" / "shortctx_scores.parquet").set_index("metric")
            ["value"]["acc"] for f in ("first", "second")}  # fmt: skip
    assert {accs["first"], accs["second"]} == {0.0, 1.0}  # its one choice is right by one file, wrong by the other
    res = invoke("show", tmp_path / "all")
    assert res.exit_code == 0, res.output
    assert "results named tiny were made from other contents of mc.jsonl" in res.output
    rows = [line for line in res.output.splitlines() if line.startswith("│ tiny (mc.jsonl ")]
    assert len(rows) == 2, res.output  # both rows: the pivot keeps them apart, none dropped
    digests = {f: json.loads((tmp_path / "all" / f / "run.json").read_text())["settings"]["file_sha256"]["mc.jsonl"]
               for f in ("first", "second")}  # fmt: skip
    for f in ("first", "second"):  # each row labelled by its file's content, with that content's score
        (row,) = [r for r in rows if f"tiny (mc.jsonl {digests[f][:8]})" in r]
        assert f"{accs[f]:.3f}" in row


def test_ruler_eval_of_regenerated_samples_is_refused_naming_the_file(tiny, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    generate = ("ruler", "generate", "--out", "d.jsonl", "--tasks", "niah_single_1", "--lengths", "600",
                "--samples", "2")  # fmt: skip
    assert invoke(*generate).exit_code == 0
    evaluate = ("ruler", "eval", tiny, "--data", "d.jsonl", "--out", tmp_path / "r", "--no-progress")
    assert invoke(*evaluate).exit_code == 0
    before = snapshot(tmp_path / "r")
    assert invoke(*generate, "--seed", "7", "--overwrite").exit_code == 0  # other samples, the same file name
    refused(invoke(*evaluate), "d.jsonl changed since these results were made", "give another --out", "delete")
    assert snapshot(tmp_path / "r") == before


def test_ablate_with_an_edited_needles_file_is_refused_naming_it(tiny, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    needle = {"before": "The secret code is ", "answer": "4821", "after": ".", "question": "What is the secret code?"}
    Path("n.jsonl").write_text(json.dumps(needle) + "\n")
    args = ("ablate", tiny, "--needles", "n.jsonl", "--lengths", "256", "--samples", "1", "--depths", "50",
            "--out", tmp_path / "a", "--no-progress")  # fmt: skip
    assert invoke(*args, "--heads", "0.0").exit_code == 0
    before = snapshot(tmp_path / "a")
    Path("n.jsonl").write_text(json.dumps(needle | {"answer": "9999"}) + "\n")
    refused(invoke(*args, "--heads", "0.1"), "n.jsonl changed since these results were made", "--out", "delete")
    assert snapshot(tmp_path / "a") == before


# ---------------------------------------------------------------------------------------------
# training: a resume only with the settings the run trained with
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def finished(tmp_path) -> tuple[Path, tuple[str, ...]]:
    """A finished 6-step run and the command that made it."""
    config = tmp_path / "model.json"
    config.write_text(tiny_config(vocab_size=264, max_seq_len=64).to_json())
    args = ("train", "--config", config, "--batch-size", "2", "--seq-len", "64", "--out", tmp_path / "run",
            "--no-progress")  # fmt: skip
    res = invoke(*args, "--steps", "6")
    assert res.exit_code == 0, res.output
    return tmp_path / "run", args


@pytest.mark.parametrize(
    ("change", "differ"),
    [(("--steps", "2"), "steps 6 vs 2"), (("--lr", "0.1", "--steps", "50"), "steps 6 vs 50; lr 0.003 vs 0.1")],
)
def test_a_resume_with_other_training_settings_is_refused_and_changes_nothing(finished, change, differ):
    run, args = finished
    before = snapshot(run)
    refused(invoke(*args, "--resume", *change),
            f"cannot resume from {run / 'step_000006'}: training settings differ (saved vs now: {differ}); the run "
            f"would go on with other settings than its first 6 steps trained with. Give the same settings as that run "
            f"({run / 'train_config.json'} lists them), or another --out to train with these from scratch")  # fmt: skip
    assert snapshot(run) == before  # train_config.json still says what the run trained with


def test_a_resume_with_the_same_settings_keeps_the_runs_record(finished):
    run, args = finished
    record = (run / "train_config.json").read_bytes()
    res = invoke(*args, "--steps", "6", "--resume", "--threads", "1", "--log-every", "2")  # how, not what
    assert res.exit_code == 0, res.output
    assert (run / "train_config.json").read_bytes() == record
    assert json.loads(record)["resume"] is False and json.loads(record)["threads"] is None


def test_only_the_settings_that_decide_the_numbers_differ():
    saved = {"steps": 6, "lr": 0.003, "seed": 0, "micro_batch_size": None, "threads": None, "device": "auto"}
    assert training_differences(saved, saved | {"micro_batch_size": 1, "threads": 2, "device": "cpu"}) == []
    assert training_differences(saved, saved | {"seed": 1, "lr": 0.02}) == ["lr 0.003 vs 0.02", "seed 0 vs 1"]
    assert training_differences(None, saved) == []  # a step saved before the settings were: nothing to compare


RECIPE = {
    "scale": "toy",
    "seeds": [0],
    "runs": {"pt": {"stage": "pt", "steps": 3, "batch_size": 2, "seq_len": 64, "lr": 0.003, "threads": 1}},
    "profiles": {"quick": {"runs": {"pt": {"steps": 2}}}},
    "study": {"probes": ["copy@40"], "probe_samples": 1, "analysis_runs": [], "ruler_runs": [], "shortctx_runs": []},
}


def recipe(path: Path, **pt) -> Path:
    raw = json.loads(json.dumps(RECIPE))
    raw["runs"]["pt"] |= pt
    path.write_text(json.dumps(raw))
    return path


def test_a_grid_refuses_another_recipe_before_any_run_trains(tmp_path):
    mine, other = recipe(tmp_path / "mine.json"), recipe(tmp_path / "other.json", lr=0.02)
    grid = ("train", "grid", "--members", "d16", "--out", tmp_path / "g")
    assert invoke(*grid, "--recipe", mine).exit_code == 0
    pt = tmp_path / "g" / "toy-d16" / "s0" / "pt"
    (pt / "result.json").unlink()  # stopped before it finished: a resume would continue it
    before = snapshot(tmp_path / "g")
    refused(invoke(*grid, "--recipe", other),
            f"{pt} was trained with other settings than recipe {other} asks (saved vs now: lr 0.003 vs 0.02); the "
            f"grid in {tmp_path / 'g'} was made with recipe {mine}. Give that recipe to continue it, or give the grid "
            "another --out")  # fmt: skip
    refused(invoke(*grid, "--recipe", mine, "--profile", "quick"), "(saved vs now: steps 3 vs 2)",
            f"recipe {mine}, profile quick asks", f"was made with recipe {mine}. Give that recipe to")  # fmt: skip
    assert snapshot(tmp_path / "g") == before  # the manifest still names the recipe its runs followed


def test_a_study_refuses_another_recipe_into_its_folder(tmp_path):
    mine, other = recipe(tmp_path / "mine.json"), recipe(tmp_path / "other.json", lr=0.02)
    study = ("study", "--members", "d16", "--out", tmp_path / "s", "--no-progress")
    assert invoke(*study, "--recipe", mine).exit_code == 0
    before = snapshot(tmp_path / "s")
    res = invoke(*study, "--recipe", other)
    one_error(res, 2, "(saved vs now: lr 0.003 vs 0.02)", f"made with recipe {mine}. Give that recipe")
    assert snapshot(tmp_path / "s") == before
