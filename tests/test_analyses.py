"""The analyses/ scripts on a grid's layout of random tiny models: each measures what it says on the runs it
says, into tables the figures draw; a rerun measures nothing again; bad input is refused with a message."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import figures
from headprobe.results import collect, read_table
from headprobe.testing import random_grid

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.stem for p in (ROOT / "analyses").glob("*.py") if not p.name.startswith("_"))
SMALL = ["--lengths", "256", "--samples", "1"]  # analysis: 256 tokens; RULER-style needs 512 (below)


def script(name: str, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "analyses"))
    return importlib.import_module(name)


def options(name: str, module) -> list[str]:
    """Small settings for the script's measurements (with RULER-style and analysis together, --lengths and
    --samples set both: 512 tokens, one sample)."""
    parts = module.EXPERIMENT.parts
    if "ruler" in parts:
        return ["--tasks", "niah_single_1", "--samples", "1", "--lengths", "512"]
    if "heads" in parts:
        return SMALL
    return ["--samples", "1"] if "probes" in parts else []


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    runs = tmp_path_factory.mktemp("grid") / "runs"
    random_grid(runs, members=("toy-a", "toy-b"), seeds=(0,))
    return runs


def test_every_experiment_of_the_issue_has_its_script():
    assert set(SCRIPTS) >= {
        "ruler_grid", "short_context", "retrieval_heads", "frozen_cpt", "attention_entropy", "token_reordering",
        "effective_rank", "qk_vs_v", "loss_vs_retrieval",
    }  # fmt: skip


@pytest.mark.parametrize(
    "name, table, runs",
    [
        ("ruler_grid", "study_ruler", {"cpt"}),  # cpt and sft; the random grid has no sft
        ("frozen_cpt", "study_ruler", {"pt", "cpt", "cpt-frozen"}),
        ("retrieval_heads", "study_heads", {"pt", "cpt", "cpt-frozen"}),
        ("qk_vs_v", "study_heads", {"cpt"}),
        ("short_context", "study_shortctx", {"pt"}),  # pt and sft
        ("task_probes", "study_probes", {"pt", "cpt", "cpt-frozen"}),
    ],
)
def test_each_script_measures_its_runs(name, table, runs, grid, tmp_path, monkeypatch, capsys):
    module = script(name, monkeypatch)
    out = tmp_path / "results"
    assert module.main(module.EXPERIMENT, [str(grid), "--out", str(out), *options(name, module)]) == 0
    frame = read_table(out / "tables" / f"{table}.parquet").frame
    assert set(frame.run) == runs and set(frame.member) == {"toy-a", "toy-b"}
    assert f"results: {out}" in capsys.readouterr().out
    assert read_table(out / "tables" / "study_runs.parquet").frame.shape[0] == 6  # every run of the grid


@pytest.mark.parametrize("name, table", [("attention_entropy", "entropy"), ("token_reordering", "reordering"),
                                         ("effective_rank", "erank")])  # fmt: skip
def test_per_head_and_per_layer_scripts_write_their_metric_for_pt_cpt_and_frozen_cpt(name, table, grid, tmp_path,
                                                                                     monkeypatch):  # fmt: skip
    module = script(name, monkeypatch)
    out = tmp_path / "results"
    assert module.main(module.EXPERIMENT, [str(grid), "--out", str(out), *SMALL]) == 0
    models = set(collect(out / "analysis", table).model)
    assert models == {f"toy-{m}-s0-{r}-final" for m in "ab" for r in ("pt", "cpt", "cpt-frozen")}
    other = {"entropy", "reordering", "erank"} - {table}
    assert all(collect(out / "analysis", t).empty for t in other)  # only what the script is for


def test_scripts_share_one_results_folder_resume_and_feed_every_figure(grid, tmp_path, monkeypatch):
    out = tmp_path / "results"
    for name in SCRIPTS:
        module = script(name, monkeypatch)
        assert module.main(module.EXPERIMENT, [str(grid), "--out", str(out), *options(name, module)]) == 0
    # the measurements themselves: finished parts of analyze, probes and shortctx, RULER's predictions
    parts = sorted(p for p in out.rglob("*") if p.is_file() and {"parts", "predictions"} & set(p.parts))
    assert {p.parts[len(out.parts)] for p in parts} == {"analysis", "probes", "ruler", "shortctx"}
    stamps = {p: p.stat().st_mtime_ns for p in parts}
    for name in SCRIPTS:  # everything is there: a rerun rewrites no measurement
        module = script(name, monkeypatch)
        assert module.main(module.EXPERIMENT, [str(grid), "--out", str(out), *options(name, module)]) == 0
    assert {p: p.stat().st_mtime_ns for p in parts} == stamps
    drawn = figures.draw(out, tmp_path / "figs", figures.SPECS)
    assert not drawn.skipped, drawn.skipped
    report = (out / "report.md").read_text()
    assert "## RULER-style score" in report and "## Retrieval heads" in report and "## Short-context" in report


def test_bad_input_is_named(grid, tmp_path, monkeypatch, capsys):
    module = script("ruler_grid", monkeypatch)
    assert module.main(module.EXPERIMENT, [str(tmp_path / "nowhere")]) == 2
    assert "manifest.json does not exist" in capsys.readouterr().err
    assert module.main(module.EXPERIMENT, [str(grid), "--out", str(tmp_path / "r"), "--samples", "0"]) == 2
    assert "ruler_samples" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # options of other experiments are refused by argparse
        module.main(module.EXPERIMENT, [str(grid), "--metrics", "entropy"])


def test_short_context_reads_task_files_given_on_the_command_line(grid, tmp_path, monkeypatch, capsys):
    import json

    items = tmp_path / "mine.jsonl"  # headprobe's JSONL: a context, its choices, the right one
    items.write_text("".join(json.dumps({"context": f"Question {i}:", "choices": [" yes", " no"], "label": i % 2})
                             + "\n" for i in range(3)))  # fmt: skip
    arc = tmp_path / "arc.jsonl"  # ARC's own format
    arc.write_text(json.dumps({"question": {"stem": "Sky?", "choices": [{"label": "A", "text": "blue"},
                                                                        {"label": "B", "text": "green"}]},
                               "answerKey": "A"}) + "\n")  # fmt: skip
    module = script("short_context", monkeypatch)
    out = tmp_path / "results"
    argv = [str(grid), "--out", str(out), "--runs", "pt", "--task-files", f"jsonl={items},arc={arc}"]
    assert module.main(module.EXPERIMENT, argv) == 0
    frame = read_table(out / "tables" / "study_shortctx.parquet").frame
    assert set(frame.task) == {"jsonl", "arc"} and set(frame.metric) == {"acc", "acc_norm"}
    assert len(frame) == 2 * 2 * 2  # 2 models x 2 tasks x 2 metrics
    assert module.main(module.EXPERIMENT, [str(grid), "--out", str(out), "--task-files", "mmlu=x.json"]) == 2
    assert "unknown task 'mmlu'" in capsys.readouterr().err


def test_external_eval_hands_each_exported_run_to_the_command_by_path(grid, tmp_path, monkeypatch, capsys):
    import json
    import sys

    module = script("external_eval", monkeypatch)
    out = tmp_path / "results"
    # the "evaluator": loads the folder it is handed with transformers, as any outside tool would
    evaluator = (
        "import sys, pathlib; from transformers import AutoModelForCausalLM; "
        "m = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True); "
        "pathlib.Path(sys.argv[3], 'seen.txt').write_text(sys.argv[2] + ' ' + type(m).__name__)"
    )
    argv = [
        str(grid),
        "--out",
        str(out),
        "--runs",
        "pt",
        "--",
        sys.executable,
        "-c",
        evaluator,
        "{path}",
        "{name}",
        "{out}",
    ]
    assert module.main(module.EXPERIMENT, argv) == 0
    table = read_table(out / "tables" / "study_exports.parquet").frame
    assert set(table.run) == {"pt"} and set(table.member) == {"toy-a", "toy-b"} and (table.exit_code == 0).all()
    for row in table.itertuples():
        assert Path(row.path) == out / "hf" / row.model
        assert json.loads((Path(row.path) / "config.json").read_text())["headprobe"]["exported_from"] == row.checkpoint
        assert (out / "external" / row.model / "seen.txt").read_text() == f"{row.model} HeadShapeForCausalLM"
    assert "exports:" in capsys.readouterr().out
    weights = {p: p.stat().st_mtime_ns for p in (out / "hf").rglob("model.safetensors")}
    assert module.main(module.EXPERIMENT, [str(grid), "--out", str(out)]) == 0  # every run, no command
    table = read_table(out / "tables" / "study_exports.parquet").frame
    assert len(table) == 6 and table.exit_code.isna().all()
    assert {p: p.stat().st_mtime_ns for p in weights} == weights  # current exports are kept, not redone
    failing = [
        str(grid),
        "--out",
        str(out),
        "--runs",
        "cpt",
        "--",
        sys.executable,
        "-c",
        "raise SystemExit(3)",
        "{path}",
    ]
    assert module.main(module.EXPERIMENT, failing) == 1
    assert set(read_table(out / "tables" / "study_exports.parquet").frame.exit_code) == {3.0}
    capsys.readouterr()
    assert module.main(module.EXPERIMENT, [str(grid), "--out", str(out), "--", "lm_eval", "--tasks", "x"]) == 2
    assert "put {path} where its folder goes" in capsys.readouterr().err
    assert module.main(module.EXPERIMENT, [str(grid), "--out", str(out), "--runs", "sft"]) == 2
    assert "no finished run among sft" in capsys.readouterr().err
