"""``headprobe show``: a results folder printed as tables; the numbers are the fixture's, computed by hand."""

from __future__ import annotations

import dataclasses
import shutil

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from headprobe.cli import app
from headprobe.model.checkpoint import save_checkpoint
from headprobe.model.tokenizer import ByteTokenizer
from headprobe.model.transformer import Transformer
from headprobe.results import TableMeta, read_table, write_table
from headprobe.study import StudySettings, run_study
from headprobe.testing import random_grid, tiny_config


def _write(folder, table: str, model: str, rows: list[dict]) -> None:
    frame = pd.DataFrame(rows).assign(model=model)
    write_table(folder / model / f"{table}.parquet", frame, TableMeta(table=table, model=model, checkpoint=model))


@pytest.fixture
def results(tmp_path):
    heads = [(1, 0, "full"), (1, 1, "full"), (0, 0, "sliding"), (0, 1, "sliding")]
    # model a: lengths 100 and 200; mean scores by head: 0.5, 0.05, 0.0, 0.3
    values_a = {100: [0.6, 0.1, 0.0, 0.2], 200: [0.4, 0.0, 0.0, 0.4]}
    _write(tmp_path, "retrieval", "a", [
        {"layer": l, "head": h, "layer_type": t, "value": values_a[n][i], "length": n}
        for n in values_a for i, (l, h, t) in enumerate(heads)
    ])  # fmt: skip
    _write(tmp_path, "retrieval", "b", [
        {"layer": l, "head": h, "layer_type": t, "value": v, "length": 100}
        for (l, h, t), v in zip(heads, [0.9, 0.8, float("nan"), 0.0], strict=True)
    ])  # fmt: skip
    _write(tmp_path, "entropy", "a", [
        {"layer": l, "head": h, "layer_type": t, "value": v, "length": 100}
        for (l, h, t), v in zip(heads, [1, 3, 0.5, 1.5], strict=True)
    ])  # fmt: skip
    _write(tmp_path, "ruler_scores", "a", [
        {"scope": "task", "task": "niah", "length": 1024, "score": 50.0},
        {"scope": "length", "length": 1024, "score": 12.5},
        {"scope": "length", "length": 2048, "score": 7.5},
        {"scope": "overall", "score": 10.0},
    ])  # fmt: skip
    return tmp_path


def show(*args: str):
    return CliRunner().invoke(app, ["show", *args], env={"COLUMNS": "200"})


def table_rows(text: str, title: str) -> list[list[str]]:
    """The body rows of the printed table titled ``title``, as stripped cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(title))
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("└"):
            break
        if line.startswith("│"):
            rows.append([cell.strip() for cell in line.strip().strip("│").split("│")])
    return rows


def test_top_heads_counts_means_and_scores_come_out_as_computed_by_hand(results):
    out = show(str(results), "--top", "2")
    assert out.exit_code == 0, out.output
    text = out.output
    # a: head (1,0) mean 0.5, then (0,1) 0.3; b: (1,0) 0.9, (1,1) 0.8 (heads that never copied are left out)
    assert table_rows(text, "retrieval: top 2 heads") == [
        ["a", "1", "0", "full", "0.500"], ["a", "0", "1", "sliding", "0.300"],
        ["b", "1", "0", "full", "0.900"], ["b", "1", "1", "full", "0.800"],
    ]  # fmt: skip
    # retrieval heads (> 0.1): a full 1 of 2 (0.05 is not), sliding 1 of 2; b full 2 of 2, sliding 0 of 2
    assert table_rows(text, "retrieval heads") == [["a", "1 of 2", "1 of 2"], ["b", "2 of 2", "0 of 2"]]
    # entropy means per layer type: full (1 + 3) / 2 = 2, sliding (0.5 + 1.5) / 2 = 1
    assert table_rows(text, "entropy: mean per layer type") == [["a", "2.000", "1.000"]]
    # RULER-style: the per-length rows and the overall one
    assert table_rows(text, "RULER-style score by length") == [["a", "12.500", "7.500", "10.000"]]


def test_teacher_forced_scores_rank_the_heads_of_a_model_without_wu_scores_and_are_counted_by_hand(tmp_path):
    heads = [(1, 0, "full"), (1, 1, "full"), (0, 0, "sliding"), (0, 1, "sliding")]
    forced, mass = [0.75, 0.05, 0.0, 0.25], [0.6, 0.1, 0.0, 0.2]  # a model that answered no needle: Wu's NaN
    _write(tmp_path, "retrieval", "c", [
        {"layer": l, "head": h, "layer_type": t, "value": float("nan"), "set_value": float("nan"),
         "forced_value": f, "forced_set_value": f, "forced_mass": m, "length": 100}
        for (l, h, t), f, m in zip(heads, forced, mass, strict=True)
    ])  # fmt: skip
    text = show(str(tmp_path), "--top", "2").output
    assert table_header(text, "retrieval: top 2 heads") == [
        "model", "layer", "head", "layer_type", "copies/span", "set (0-1)", "forced (0-1)", "forced mass"
    ]  # fmt: skip
    assert table_rows(text, "retrieval: top 2 heads") == [  # ranked by the forced score; a missing Wu score is blank
        ["c", "1", "0", "full", "", "", "0.750", "0.600"], ["c", "0", "1", "sliding", "", "", "0.250", "0.200"],
    ]  # fmt: skip
    assert table_rows(text, "retrieval heads") == [["c", "0 of 2", "0 of 2"]]  # Wu's: no score, no head
    # forced >= 0.1: full 1 of 2 (0.05 is not), mass (0.6 + 0.1) / 2; sliding 1 of 2, mass (0 + 0.2) / 2
    assert table_rows(text, "teacher-forced retrieval heads") == [["c", "1 of 2, mass 0.350", "1 of 2, mass 0.100"]]


def test_a_run_its_study_marks_diverged_is_shown_as_diverged(results):
    runs = pd.DataFrame({"model": ["a", "b"], "member": ["toy-d16", "toy-k64v16"], "seed": 0, "run": "pt",
                         "status": ["trained", "diverged"]})  # fmt: skip
    write_table(results / "tables" / "study_runs.parquet", runs, TableMeta(table="study_runs"))
    res = show(str(results), "--metric", "retrieval,entropy,ruler")
    assert res.exit_code == 0, res.output
    counts = {row[0]: row for row in table_rows(res.output, "retrieval heads (copies/span >= 0.1)")}
    assert set(counts) == {"a", "b (diverged)"}  # its numbers stay, as that checkpoint's, named diverged
    assert [row[0] for row in table_rows(res.output, "entropy: mean per layer type")] == ["a"]
    assert [row[0] for row in table_rows(res.output, "RULER-style score by length")] == ["a"]


def test_a_folder_without_results_or_an_unknown_metric_is_a_clear_error(results, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = show(str(empty))
    assert out.exit_code == 2 and "holds none of the tables" in out.output and "headprobe analyze" in out.output
    out = show(str(results), "--metric", "loss")
    assert out.exit_code == 2 and "unknown --metric loss; choose from retrieval, needle_margin, entropy" in out.output
    out = show(str(tmp_path / "nowhere"))
    assert out.exit_code == 2 and "is not a folder" in out.output


# ---------------------------------------------------------------------------------------------
# `show` on what every results-producing command wrote (a random tiny checkpoint, 1 sample, short lengths)
# ---------------------------------------------------------------------------------------------
NAME = "probe-me"  # the checkpoint's folder name: the model name every table and every printed row carries
CONFIG = tiny_config(vocab_size=264, max_seq_len=1024)


def run(*args: str):
    out = CliRunner().invoke(app, [*args, "--no-progress"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    return out


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """``analyze`` (every metric), ``ruler eval`` and ``shortctx eval`` of one random tiny checkpoint, through
    the command line, and a one-seed study of random tiny runs (:func:`headprobe.testing.random_grid`)."""
    root = tmp_path_factory.mktemp("outputs")
    torch.manual_seed(0)
    ckpt = save_checkpoint(Transformer(CONFIG), root / NAME, ByteTokenizer())
    run("analyze", str(ckpt), "--lengths", "256", "--samples", "1", "--max-new-tokens", "8", "--out", str(root / "a"))
    run("ruler", "eval", str(ckpt), "--tasks", "niah_single_1", "--lengths", "512", "--samples", "1",
        "--out", str(root / "r"))  # fmt: skip
    run("shortctx", "eval", str(ckpt), "--limit", "12", "--out", str(root / "s"))
    settings = StudySettings(
        probes=["needle@60"], probe_samples=1, analysis_runs=["pt"], analysis_metrics=["retrieval"],
        analysis_lengths=[256], analysis_samples=1, ruler_runs=[], shortctx_runs=["pt"],
    )  # fmt: skip
    run_study(root / "study", lambda runs: random_grid(runs, ["toy-a"], [0]), settings)
    return root


def heads_per_layer_type() -> dict[str, int]:
    """The tiny model's heads per layer type, from its config."""
    counts: dict[str, int] = {}
    for layer, kind in enumerate(CONFIG.layer_types()):
        counts[str(kind)] = counts.get(str(kind), 0) + CONFIG.attention(layer).n_heads
    return counts


def table_header(text: str, title: str) -> list[str]:
    """The column names of the printed table titled ``title``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(title))
    header = next(line for line in lines[start + 1 :] if line.startswith("┃"))
    return [cell.strip() for cell in header.strip().strip("┃").split("┃")]


def test_every_table_of_every_command_names_its_model(outputs):
    """The contract of ``headprobe.results.collect``: every table written per model has a ``model`` column
    holding that model's name (retrieval's head table, combined from per-sample parts, once had none)."""
    found = {}
    for path in sorted(outputs.rglob("*.parquet")):
        if "parts" in path.parts or "tables" in path.parts:
            continue  # resume parts; the study's own joined tables
        frame = read_table(path).frame
        assert "model" in frame.columns, path
        found.setdefault(path.stem, set()).update(frame["model"])
    assert found == {
        "retrieval": {NAME, "toy-a-s0-pt-final"},
        "retrieval_samples": {NAME, "toy-a-s0-pt-final"},
        "retrieval_copies": {NAME, "toy-a-s0-pt-final"},
        "analysis_summary": {NAME, "toy-a-s0-pt-final"},
        "entropy": {NAME},
        "reordering": {NAME},
        "erank": {NAME},
        "ruler_samples": {NAME},
        "ruler_scores": {NAME},
        "shortctx_items": {NAME, "toy-a-s0-pt-final"},
        "shortctx_scores": {NAME, "toy-a-s0-pt-final"},
    }


def test_show_on_analyze_output_prints_every_metric_for_the_model(outputs):
    text = show(str(outputs / "a")).output
    heads = heads_per_layer_type()
    assert heads == {"full": 2, "sliding": 12}  # 3 sliding layers x 4 heads, 1 full layer x 2
    # a random model answers no needle: no head has a score, so none is a retrieval head
    assert not read_table(outputs / "a" / NAME / "retrieval_samples.parquet").frame["kept"].any()
    assert table_header(text, "retrieval heads") == ["model", "full", "sliding"]
    assert table_rows(text, "retrieval heads") == [[NAME, f"0 of {heads['full']}", f"0 of {heads['sliding']}"]]
    scored = pd.read_parquet(outputs / "a" / NAME / "retrieval.parquet")  # one length: the means are its values
    forced = (scored["forced_value"] > 0).sum()  # no Wu score, so the top heads are those the forced score ranks
    assert len(table_rows(text, "retrieval: top 10 heads")) == min(10, forced)
    cells = [f"{int((g.forced_value >= 0.1).sum())} of {len(g)}, mass {g.forced_mass.mean():.3f}"
             for _, g in scored.groupby("layer_type")]  # fmt: skip
    assert table_rows(text, "teacher-forced retrieval heads") == [[NAME, *cells]]
    for metric in ("entropy", "reordering", "erank"):
        frame = pd.read_parquet(outputs / "a" / NAME / f"{metric}.parquet")
        means = frame.groupby("layer_type")["value"].mean()
        title = f"{metric}: mean per layer type"
        assert table_header(text, title) == ["model", *means.index]
        assert table_rows(text, title) == [[NAME, *(f"{v:.3f}" for v in means)]]
    assert "RULER-style" not in text and "short-context" not in text


def test_show_on_ruler_and_shortctx_output_prints_their_scores(outputs):
    text = show(str(outputs / "r")).output
    samples = pd.read_parquet(outputs / "r" / NAME / "ruler_samples.parquet")
    assert len(samples) == 1 and samples["length"].tolist() == [512]
    score = f"{samples['score'].mean():.3f}"  # one task at one length: the length's and the overall score
    assert table_header(text, "RULER-style score by length") == ["model", "512", "overall"]
    assert table_rows(text, "RULER-style score by length") == [[NAME, score, score]]
    assert "retrieval heads" not in text

    text = show(str(outputs / "s")).output
    items = pd.read_parquet(outputs / "s" / NAME / "shortctx_items.parquet")
    assert len(items) == 12
    acc = (items["pred"] == items["label"]).mean()
    acc_norm = (items["pred_norm"] == items["label"]).mean()
    assert table_header(text, "short-context accuracy by task") == ["model", "builtin acc", "builtin acc_norm"]
    assert table_rows(text, "short-context accuracy by task") == [[NAME, f"{acc:.3f}", f"{acc_norm:.3f}"]]


def test_show_on_a_study_folder_finds_the_tables_below_it(outputs):
    out = show(str(outputs / "study"))
    assert out.exit_code == 0, out.output
    heads = heads_per_layer_type()
    model = "toy-a-s0-pt-final"  # the run analysed, named by member, seed and run
    assert table_rows(out.output, "retrieval heads") == [[model, f"0 of {heads['full']}", f"0 of {heads['sliding']}"]]
    assert [row[0] for row in table_rows(out.output, "short-context accuracy by task")] == [model]
    assert "entropy: mean per layer type" not in out.output and "RULER-style" not in out.output  # not measured here


def test_a_table_written_without_a_model_column_takes_its_metadatas_model(outputs, tmp_path):
    """Results folders written before every table had a ``model`` column (analyze's retrieval table) still
    show; a table whose metadata names no model either takes its folder's name (``OUT/<model>/``), as every
    reader of :func:`headprobe.results.collect` does."""
    old = tmp_path / "old"
    shutil.copytree(outputs / "a", old)
    path = old / NAME / "retrieval.parquet"
    table = read_table(path)
    write_table(path, table.frame.drop(columns="model"), table.meta)
    assert "model" not in pd.read_parquet(path).columns
    out = show(str(old), "--metric", "retrieval")
    assert out.exit_code == 0, out.output
    assert table_rows(out.output, "retrieval heads") == [[NAME, "0 of 2", "0 of 12"]]
    write_table(path, table.frame.drop(columns="model"), dataclasses.replace(table.meta, model=None))
    out = show(str(old), "--metric", "retrieval")
    assert out.exit_code == 0, out.output
    assert table_rows(out.output, "retrieval heads") == [[NAME, "0 of 2", "0 of 12"]]
