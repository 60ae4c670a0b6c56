"""Hardening, third round (issue 37): one rule for everything a command writes (headprobe/core/outputs.py).
A target that is, holds or lies inside an input is refused, ``--overwrite`` or not; one that holds
anything the command did not write is refused unless it is the command's own kind and ``--overwrite``
says so; a rerun into a results folder adds to it and its tables and ``run.json`` describe all it holds;
a refusal writes nothing. Each case checks the exit code, the one message (the problem and the fix) and
that every earlier file is byte for byte as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from cli_checks import invoke, refused, snapshot

from headprobe.core.outputs import (
    CHECKPOINT,
    DATA,
    FIGURES,
    PAGE,
    RUN,
    OutputRefused,
    claim,
    found_at,
    job_results,
)
from headprobe.testing import tiny_checkpoint


# ---------------------------------------------------------------------------------------------
# The rule itself, on hand-built folders
# ---------------------------------------------------------------------------------------------
def _folder(path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return path


@pytest.mark.parametrize(
    ("files", "kind", "job"),
    [
        ({}, "nothing", None),
        ({".headprobe.lock": "1", ".x.tmp-0123abcd": ""}, "nothing", None),
        ({"run.json": '{"job": "ruler eval"}', "m/x.parquet": ""}, "results", "ruler eval"),
        ({"config.json": "{}", "model.safetensors": ""}, "checkpoint", None),
        ({"config.json": '{"model_type": "llama"}', "model.safetensors": ""}, "hf_other", None),
        ({"config.json": '{"model_type": "headshape", "headprobe": {}}', "model.safetensors": ""}, "hf_model", None),
        ({"run.json": "{not json", "m/x.parquet": ""}, "results", None),
        ({"state.json": "{}", "dcp/0.distcp": ""}, "step", None),
        ({"metrics.jsonl": "", "final/config.json": "{}"}, "run", None),
        ({"manifest.json": '{"runs": []}'}, "grid", None),
        ({"manifest.json": '{"shards": []}'}, "data", None),
        ({"runs/manifest.json": '{"runs": []}', "tables/x": ""}, "results", "study"),
        ({"figures.json": "{}", "retrieval_heads.png": ""}, "figures", None),
        ({"retrieval_heads.png": "", "holiday.png": ""}, "folder", None),
        ({"thesis.tex": "precious"}, "folder", None),
        ({"notes.txt": "x", "data/": ""}, "folder", None),
    ],
)
def test_found_at_names_what_a_folder_holds_by_its_files(tmp_path, files, kind, job):
    folder = tmp_path / "f"
    folder.mkdir()
    _folder(folder, {k: v for k, v in files.items() if not k.endswith("/")})
    for name in (k for k in files if k.endswith("/")):
        (folder / name).mkdir()
    found = found_at(folder)
    assert (found.kind, found.job) == (kind, job), found


def test_found_at_tells_files_pages_and_links(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "page.html").write_text('<html><head><meta name="generator" content="headprobe report"></head>')
    (tmp_path / "other.html").write_text("<html>someone else's</html>")
    (tmp_path / "link").symlink_to(tmp_path / "notes.txt")
    assert found_at(tmp_path / "notes.txt").kind == "file"
    assert found_at(tmp_path / "page.html").kind == "page"
    assert found_at(tmp_path / "other.html").kind == "file"
    assert found_at(tmp_path / "link").kind == "link" and found_at(tmp_path / "link").words == "a link to a file"
    assert found_at(tmp_path / "missing").kind == "nothing"


def test_claim_never_writes_an_input_or_around_one(tmp_path):
    ckpt = _folder(tmp_path / "run" / "final", {"config.json": "{}", "model.safetensors": ""})
    for target, says in [
        (ckpt, "is the input"),
        (tmp_path / "run", "holds the input"),
        (ckpt / "sub", "lies inside the input"),
    ]:
        with pytest.raises(OutputRefused, match=says):
            claim(target, CHECKPOINT, inputs=[ckpt], overwrite=True)
    # a page may sit beside the results it shows (a new file, or its own page), never over one of them
    results = _folder(tmp_path / "results", {"run.json": '{"job": "analyze"}', "m/entropy.parquet": "x"})
    assert claim(results / "report.html", PAGE, inputs=[results]).empty
    with pytest.raises(OutputRefused, match="inside the input"):
        claim(results / "m" / "entropy.parquet", PAGE, inputs=[results], overwrite=True)


def test_claim_replaces_only_its_own_kind_and_only_when_asked(tmp_path):
    ckpt = _folder(tmp_path / "ckpt", {"config.json": "{}", "model.safetensors": ""})
    with pytest.raises(OutputRefused, match=r"exists \(a headprobe checkpoint\).*`overwrite` to replace it"):
        claim(ckpt, CHECKPOINT)
    assert claim(ckpt, CHECKPOINT, overwrite=True).kind == "checkpoint"
    with pytest.raises(OutputRefused, match=r"holds a headprobe checkpoint, not a data folder.*never anything else"):
        claim(ckpt, DATA, overwrite=True)
    analyzed = _folder(tmp_path / "a", {"run.json": '{"job": "analyze"}'})
    assert claim(analyzed, job_results("analyze")).job == "analyze"  # its own results: added to
    with pytest.raises(OutputRefused, match="holds the results of `headprobe analyze`, not a training run"):
        claim(analyzed, RUN)
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    with pytest.raises(OutputRefused, match=r"a file headprobe did not write.*`overwrite` to replace it"):
        claim(notes, PAGE)
    assert claim(notes, PAGE, overwrite=True).kind == "file"
    with pytest.raises(OutputRefused, match="is a file, not a folder"):
        claim(notes, FIGURES)


# ---------------------------------------------------------------------------------------------
# The commands
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A six-step toy run with step checkpoints at 3 and 6."""
    run = tmp_path_factory.mktemp("t") / "RUN"
    res = invoke("train", "--preset", "toy-d32", "--steps", "6", "--save-every", "3", "--keep", "5", "--out", run,
                 "--no-progress", "--threads", "1", "--batch-size", "2", "--seq-len", "64")  # fmt: skip
    assert res.exit_code == 0, res.output
    return run


def test_train_export_never_replaces_the_run_it_reads(trained, tmp_path):
    run = tmp_path / "RUN"
    shutil.copytree(trained, run)
    before = snapshot(run)
    refused(invoke("train", "export", run / "step_000006", run),
            f"OUT {run} holds the input {run / 'step_000006'}", "give another OUT")  # fmt: skip
    refused(invoke("train", "export", run / "step_000006", run, "--overwrite"), "holds the input")
    refused(invoke("train", "export", run / "step_000006", run / "step_000006" / "x"), "lies inside the input")
    assert snapshot(run) == before


def test_train_export_replaces_another_checkpoint_only_with_overwrite(trained, tmp_path):
    other = tiny_checkpoint(tmp_path / "other", seed=3)
    before = snapshot(other)
    refused(invoke("train", "export", trained / "step_000006", other), f"OUT {other} exists (a headprobe checkpoint)",
            "give another OUT, or add --overwrite")  # fmt: skip
    assert snapshot(other) == before
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.txt").write_text("mine")
    refused(invoke("train", "export", trained / "step_000006", notes, "--overwrite"),
            "holds a folder of other files (a.txt), not a checkpoint", "never anything else")  # fmt: skip
    assert (notes / "a.txt").read_text() == "mine"
    res = invoke("train", "export", trained / "step_000006", other, "--overwrite")
    assert res.exit_code == 0, res.output
    assert snapshot(other) != before and (other / "model.safetensors").is_file()
    assert sorted(p.name for p in (trained / "step_000006").iterdir()) == ["dcp", "rng", "state.json"]  # read only


def test_export_hf_never_deletes_the_checkpoint_it_exports(tmp_path):
    par = tmp_path / "par"
    tiny_checkpoint(par / "final", seed=0, vocab_size=264)
    (par / "notes.txt").write_text("a sibling")
    before = snapshot(par)
    refused(invoke("export", "hf", par / "final", par, "--overwrite"), f"OUT {par} holds the input {par / 'final'}")
    refused(invoke("export", "hf", par / "final", par / "final", "--overwrite"), "is the input")
    assert snapshot(par) == before


def _analyze(ckpt: Path, out: Path, metrics: str, lengths: str):
    return invoke("analyze", ckpt, "--metrics", metrics, "--lengths", lengths, "--samples", "2", "--out", out,
                  "--no-progress")  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("m") / "tiny", seed=0, vocab_size=264, max_seq_len=1024)


@pytest.fixture(scope="module")
def analyzed(tiny, tmp_path_factory) -> Path:
    """entropy and erank at 128 and 256 tokens."""
    out = tmp_path_factory.mktemp("a") / "out"
    res = _analyze(tiny, out, "entropy,erank", "128,256")
    assert res.exit_code == 0, res.output
    return out


def test_an_analyze_rerun_with_fewer_settings_keeps_what_the_folder_holds(tiny, analyzed, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(analyzed, out)
    first = {t: pd.read_parquet(out / "tiny" / f"{t}.parquet") for t in ("entropy", "erank", "analysis_summary")}
    res = _analyze(tiny, out, "entropy", "128")  # a subset of what the folder holds
    assert res.exit_code == 0, res.output
    assert "entropy @ 128: done earlier, skipped" in res.output
    for table, frame in first.items():  # every row of the first run is still there, as it was
        pd.testing.assert_frame_equal(pd.read_parquet(out / "tiny" / f"{table}.parquet"), frame)
    record = json.loads((out / "run.json").read_text())
    assert record["settings"]["metrics"] == ["entropy", "erank"] and record["settings"]["lengths"] == [128, 256]
    assert [r["settings"]["lengths"] for r in record["runs"]] == [[128, 256], [128]]
    res = _analyze(tiny, out, "reordering", "192")  # a new metric at a new length is added beside them
    assert res.exit_code == 0, res.output
    lengths = {t: sorted(pd.read_parquet(out / "tiny" / f"{t}.parquet")["length"].unique()) for t in first}
    assert lengths == {"entropy": [128, 256], "erank": [128, 256], "analysis_summary": [128, 192, 256]}
    assert sorted(pd.read_parquet(out / "tiny" / "reordering.parquet")["length"].unique()) == [192]
    record = json.loads((out / "run.json").read_text())
    assert record["settings"]["metrics"] == ["entropy", "erank", "reordering"]
    assert sorted(record["settings"]["lengths"]) == [128, 192, 256]


def test_an_ablate_rerun_with_other_heads_adds_its_condition(tiny, tmp_path):
    out = tmp_path / "out"
    args = ("--lengths", "300", "--samples", "1", "--depths", "50", "--out", out, "--no-progress")
    assert invoke("ablate", tiny, "--heads", "0.1", *args).exit_code == 0
    first = pd.read_parquet(out / "tiny" / "ablation.parquet")
    res = invoke("ablate", tiny, "--heads", "1.0", *args)
    assert res.exit_code == 0, res.output
    table = pd.read_parquet(out / "tiny" / "ablation.parquet")
    assert sorted(table["heads"].fillna("")) == ["", "0.1", "1.0"]  # baseline, the first set, the second
    kept = table[table["heads"] == "0.1"].reset_index(drop=True)
    pd.testing.assert_frame_equal(kept, first[first["heads"] == "0.1"].reset_index(drop=True))
    assert json.loads((out / "run.json").read_text())["settings"]["heads"] == ["0.1", "1.0"]
    res = invoke("ablate", tiny, "--heads", "1.0", "--lengths", "300", "--samples", "2", "--depths", "50",
                 "--out", out, "--no-progress")  # fmt: skip
    refused(res, "holds results made with other settings", "--samples 1 there, 2 now")


def test_a_refusal_leaves_no_folder_behind(tiny, tmp_path):
    refused(invoke("analyze", tiny, "--metrics", "retrieval", "--lengths", "64", "--out", tmp_path / "a" / "b" / "c",
                   "--no-progress"), "too short")  # fmt: skip
    refused(invoke("ablate", tiny, "--heads", "40.2", "--lengths", "64", "--out", tmp_path / "d" / "e",
                   "--no-progress"), "has no head 40.2")  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_study_refuses_another_commands_folder_before_training(analyzed, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(analyzed, out)
    before = snapshot(out)
    refused(invoke("study", "--out", out, "--no-progress"), f"--out {out} holds the results of `headprobe analyze`",
            "give `headprobe study` another --out")  # fmt: skip
    assert snapshot(out) == before
    refused(invoke("analyze", "x", "--out", tmp_path / "none", "--no-progress"), "does not exist")


def test_train_refuses_a_folder_that_is_not_a_run(analyzed, tiny, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(analyzed, out)
    before = snapshot(out)
    refused(invoke("train", "--preset", "toy-d32", "--steps", "1", "--out", out, "--no-progress"),
            "holds the results of `headprobe analyze`, not a training run", "choose another --out")  # fmt: skip
    assert snapshot(out) == before
    refused(invoke("train", "--stage", "cpt", "--init", tiny, "--steps", "1", "--out", tiny, "--no-progress"),
            "is the input")  # fmt: skip


def test_report_keeps_a_file_it_did_not_write(analyzed, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    refused(invoke("report", analyzed, "--out", notes), f"--out {notes} is a file headprobe did not write",
            "add --overwrite")  # fmt: skip
    assert notes.read_text() == "my notes"
    page = tmp_path / "report.html"
    assert invoke("report", analyzed, "--out", page).exit_code == 0
    first = page.read_text()
    assert 'content="headprobe report"' in first
    res = invoke("report", analyzed, "--out", page)  # its own page is made anew without asking
    assert res.exit_code == 0, res.output
    assert invoke("report", analyzed, "--out", notes, "--overwrite").exit_code == 0
    assert notes.read_text().startswith("<!DOCTYPE html>")


def test_figures_add_only_to_a_folder_of_figures(analyzed, tmp_path):
    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "thesis.tex").write_text("precious")
    refused(invoke("figures", analyzed, "--out", thesis), "holds a folder of other files (thesis.tex)")
    assert [p.name for p in thesis.iterdir()] == ["thesis.tex"]
    out = tmp_path / "fig"
    assert invoke("figures", analyzed, "--out", out).exit_code == 0
    assert invoke("figures", analyzed, "--out", out).exit_code == 0  # its own folder: drawn again
    assert "drawn" in json.loads((out / "figures.json").read_text())


def test_data_prepare_never_writes_over_its_source(tmp_path):
    source = tmp_path / "corpus.txt"
    source.write_text("some text " * 50)
    refused(invoke("data", "prepare", source, "--out", source, "--overwrite"), "is the input")
    assert source.read_text() == "some text " * 50


def test_a_ruler_rerun_with_fewer_tasks_is_refused_not_shrunk(tiny, tmp_path):
    out = tmp_path / "out"
    both = ("--tasks", "niah_single_1,niah_single_2", "--lengths", "600,700", "--samples", "1")
    assert invoke("ruler", "eval", tiny, "--out", out, "--no-progress", *both).exit_code == 0
    before = snapshot(out)
    res = invoke("ruler", "eval", tiny, "--out", out, "--no-progress", "--tasks", "niah_single_1", "--lengths", "600",
                 "--samples", "1")  # fmt: skip
    refused(res, "holds predictions made with other settings", "--lengths 600,700 there, 600 now",
            "--tasks niah_single_1,niah_single_2 there, niah_single_1 now", "another --out")  # fmt: skip
    assert snapshot(out) == before
    res = invoke("ruler", "eval", tiny, "--out", out, "--no-progress", *both)  # the same settings resume
    assert res.exit_code == 0 and "niah_single_2 @ 700: done earlier, skipped" in res.output


def test_a_shortctx_rerun_with_another_task_adds_it(tiny, tmp_path):
    out = tmp_path / "out"
    assert invoke("shortctx", "eval", tiny, "--out", out, "--no-progress", "--limit", "5").exit_code == 0
    first = pd.read_parquet(out / "tiny" / "shortctx_items.parquet")
    arc = tmp_path / "arc.jsonl"
    arc.write_text(json.dumps({"question": {"stem": "q?", "choices": [{"text": "a", "label": "A"},
                   {"text": "b", "label": "B"}]}, "answerKey": "A"}) + "\n")  # fmt: skip
    res = invoke("shortctx", "eval", tiny, "--out", out, "--no-progress", "--task", "arc", "--file", arc)
    assert res.exit_code == 0, res.output
    items = pd.read_parquet(out / "tiny" / "shortctx_items.parquet")
    assert sorted(items["task"].unique()) == ["arc", "builtin"] and (items["task"] == "arc").sum() == 1
    pd.testing.assert_frame_equal(items[items["task"] == "builtin"].reset_index(drop=True), first)
    assert json.loads((out / "run.json").read_text())["settings"]["task"] == ["builtin", "arc"]
    res = invoke("shortctx", "eval", tiny, "--out", out, "--no-progress", "--limit", "6")
    refused(res, "holds results made with other settings", "--limit 5 there, 6 now")


def test_results_of_a_checkpoint_retrained_at_its_path_are_not_reused(tmp_path):
    ckpt = tiny_checkpoint(tmp_path / "tiny", seed=0, vocab_size=264, max_seq_len=1024)
    out = tmp_path / "out"
    assert _analyze(ckpt, out, "entropy", "128").exit_code == 0
    ruler = ("ruler", "eval", ckpt, "--out", tmp_path / "r", "--tasks", "niah_single_1", "--lengths", "600",
             "--samples", "1", "--no-progress")  # fmt: skip
    assert invoke(*ruler).exit_code == 0
    before = snapshot(out)
    tiny_checkpoint(ckpt, seed=1, vocab_size=264, max_seq_len=1024)  # retrained: other weights, the same path
    refused(_analyze(ckpt, out, "entropy", "128"), "changed since", "delete")
    assert snapshot(out) == before
    refused(invoke(*ruler), "changed since")


def test_explore_export_keeps_a_file_it_did_not_write(tiny, tmp_path):
    notes = tmp_path / "notes.html"
    notes.write_text("<html>my notes</html>")
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 8)
    args = ("explore", tiny, "--text", text, "--no-open")
    refused(invoke(*args, "--export", notes), f"--export {notes} is a file headprobe did not write", "--overwrite")
    assert notes.read_text() == "<html>my notes</html>"
    refused(invoke(*args, "--export", tiny / "config.json", "--overwrite"), "inside the input")
    page = tmp_path / "page.html"
    assert invoke(*args, "--export", page).exit_code == 0
    assert '<meta name="generator" content="headprobe explore">' in page.read_text()
    res = invoke(*args, "--export", page)  # its own page is made anew
    assert res.exit_code == 0, res.output
    assert invoke(*args, "--export", notes, "--overwrite").exit_code == 0 and "my notes" not in notes.read_text()


def test_overwrite_never_reaches_into_a_checkpoint_a_run_or_results(trained, analyzed, tiny, tmp_path):
    run = tmp_path / "RUN"
    shutil.copytree(trained, run)
    results = tmp_path / "R"
    shutil.copytree(analyzed, results)
    ckpt = tmp_path / "a"
    shutil.copytree(tiny, ckpt)
    before = {p: snapshot(p) for p in (run, results, ckpt)}
    refused(invoke("report", results, "--out", ckpt / "model.safetensors", "--overwrite"),
            f"is part of a headprobe checkpoint ({ckpt})")  # fmt: skip
    refused(invoke("report", results, "--out", run / "metrics.jsonl", "--overwrite"), "is part of a training run")
    refused(invoke("ruler", "generate", "--out", ckpt / "config.json", "--tasks", "niah_single_1", "--lengths", "600",
                   "--samples", "1", "--overwrite"), "is part of a headprobe checkpoint")  # fmt: skip
    refused(invoke("train", "export", run / "step_000003", run / "final", "--overwrite"),
            f"is part of a training run ({run})")  # fmt: skip
    assert {p: snapshot(p) for p in (run, results, ckpt)} == before
    page = results / "tiny" / "report.html"  # a new page beside the results is fine
    assert invoke("report", results, "--out", page).exit_code == 0 and page.is_file()


def test_overwrite_keeps_what_a_user_added_to_a_checkpoint_and_never_takes_a_foreign_model(trained, tiny, tmp_path):
    other = tiny_checkpoint(tmp_path / "other", seed=3)
    (other / "NOTES.md").write_text("mine")
    (other / "evals").mkdir()
    before = snapshot(other)
    refused(invoke("train", "export", trained / "step_000006", other, "--overwrite"),
            "also holds NOTES.md, evals/, which replacing it would delete", "move them out")  # fmt: skip
    assert snapshot(other) == before
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text('{"model_type": "llama"}')
    (llama / "model-00001.safetensors").write_text("weights")
    refused(
        invoke("export", "hf", tiny, llama, "--overwrite"), "holds a Hugging Face model folder headprobe did not write"
    )
    assert (llama / "model-00001.safetensors").read_text() == "weights"


def test_figures_never_replace_a_users_images_nor_another_results_figures(analyzed, tiny, tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "model_layers.png").write_bytes(b"my picture")
    (photos / "holiday.png").write_bytes(b"sea")
    refused(invoke("figures", analyzed, "--out", photos), "holds a folder of other files")
    assert (photos / "model_layers.png").read_bytes() == b"my picture"
    figs = tmp_path / "figs"
    assert invoke("figures", analyzed, "--out", figs).exit_code == 0
    other = tmp_path / "other"
    assert _analyze(tiny, other, "entropy", "128").exit_code == 0
    before = snapshot(figs)
    refused(invoke("figures", other, "--out", figs), f"holds the figures of {analyzed.resolve()}")
    assert snapshot(figs) == before


def test_results_never_go_inside_what_a_job_reads(analyzed, tiny, tmp_path):
    from headprobe.core.progress import Silent
    from headprobe.jobs.checkpoints import run_models

    def job(path: Path, folder: Path, name: str) -> str:
        raise AssertionError("no work may start")

    for reads in ([analyzed], [analyzed / "tiny"]):  # ablate's --from, analyze's --haystack-file ...
        with pytest.raises(OutputRefused, match=f"lies inside the input {analyzed}"):
            run_models([tiny], analyzed / "tiny" / "sub", job, Silent(), ("ablate", {}), reads=reads)
    assert not (analyzed / "tiny" / "sub").exists()


def test_a_refused_study_leaves_nothing_and_a_record_lists_every_run(tmp_path):
    out = tmp_path / "study"
    refused(invoke("study", "--seeds", "-1", "--out", out, "--no-progress"), "seed")
    assert not out.exists()


def test_run_json_says_which_settings_its_runs_gave_other_values(tiny, tmp_path):
    out = tmp_path / "out"
    other = tiny_checkpoint(tmp_path / "b", seed=1, vocab_size=264, max_seq_len=1024)
    assert _analyze(tiny, out, "entropy", "128").exit_code == 0
    res = invoke("analyze", other, "--metrics", "entropy", "--lengths", "128", "--samples", "1", "--out", out,
                 "--no-progress")  # fmt: skip
    assert res.exit_code == 0, res.output
    record = json.loads((out / "run.json").read_text())
    assert record["settings"]["samples"] == [2, 1] and record["varies"] == ["samples"]
    assert [r["settings"]["samples"] for r in record["runs"]] == [2, 1]
