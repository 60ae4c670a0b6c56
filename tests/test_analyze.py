"""headprobe analyze: result files, summary, resume, failure isolation and bad input."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
import torch
from reference import dense_entropy_per_head
from typer.testing import CliRunner

import headprobe.analysis.items as items_mod
import headprobe.metrics.registry as metrics_mod
from headprobe.analysis import AnalyzeSettings, analyze, statistic
from headprobe.cli import app
from headprobe.core.outputs import OutputRefused
from headprobe.hooked import load_model
from headprobe.metrics import Rows
from headprobe.model.checkpoint import load_checkpoint, save_checkpoint
from headprobe.model.tokenizer import ByteTokenizer
from headprobe.model.transformer import Transformer
from headprobe.results import read_meta, read_table
from headprobe.testing import tiny_config
from headprobe.text.haystack import text_inputs

runner = CliRunner()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, hf_models):
    root = tmp_path_factory.mktemp("ckpts")
    torch.manual_seed(0)
    ours = save_checkpoint(Transformer(tiny_config(vocab_size=264)), root / "tiny")
    hf = hf_models["qwen2"]
    return ours, hf


def settings(**kw) -> AnalyzeSettings:
    base = dict(lengths=[256, 320], samples=2, max_new_tokens=4)
    base.update(kw)
    return AnalyzeSettings(**base)


def test_results_and_summary(tmp_path, checkpoints):
    ours, hf = checkpoints
    result = analyze([ours, hf], tmp_path, settings())
    assert set(result.results) == {"tiny", "qwen2"} and not result.errors
    folder = tmp_path / "tiny"
    entropy = read_table(folder / "entropy.parquet").frame
    assert {"model", "layer", "head", "layer_type", "value", "norm_value", "length", "sample"} <= set(entropy.columns)
    assert set(entropy.model) == {"tiny"}
    assert len(entropy) == 2 * 2 * 14  # lengths x samples x heads
    net, _ = load_checkpoint(ours)
    for length in (256, 320):
        ids = text_inputs(ByteTokenizer(), length, 2)
        for sample in range(2):
            want = dense_entropy_per_head(net, ids[sample : sample + 1])
            part = entropy[(entropy["length"] == length) & (entropy["sample"] == sample)]
            for r in part.itertuples():
                assert r.value == pytest.approx(float(want[r.layer][r.head]), abs=1e-5)
    summary = read_table(folder / "analysis_summary.parquet")
    meta = summary.meta
    assert meta.settings["lengths"] == [256, 320] and "torch" in meta.versions and meta.command and meta.model == "tiny"
    summary = summary.frame
    pd.testing.assert_frame_equal(summary, result.results["tiny"])
    retrieval = read_table(folder / "retrieval.parquet").frame
    for length, part in retrieval.groupby("length"):
        counted = int((part["value"] >= 0.1).sum())
        assert statistic(summary, "retrieval", length, "retrieval_heads") == counted
        forced = int((part["forced_value"] >= 0.1).sum())  # the teacher-forced count, every sample scored
        assert statistic(summary, "retrieval", length, "forced_retrieval_heads") == forced
        mass = part[part["layer_type"] == "full"]["forced_mass"].mean()
        assert statistic(summary, "retrieval", length, "forced_mass", "full") == pytest.approx(mass) and mass > 0
    erank = read_table(folder / "erank.parquet").frame
    assert erank[erank["length"] == 320]["layer"].tolist() == [-1, 0, 1, 2, 3]
    layer0 = summary[(summary.metric == "erank") & (summary.length == 320) & (summary.layer == 0)]
    assert float(layer0[layer0.statistic == "erank"]["value"].iloc[0]) == pytest.approx(
        float(erank[(erank["length"] == 320) & (erank["layer"] == 0)]["value"].iloc[0])
    )
    mean = entropy[entropy["length"] == 320].groupby("layer_type")["value"].mean()
    assert statistic(summary, "entropy", 320, "mean", "full") == pytest.approx(mean["full"])
    assert read_meta(folder / "entropy.parquet").settings["samples"] == 2  # the settings travel with the table
    samples = read_table(folder / "retrieval_samples.parquet").frame
    assert len(samples) == 4
    # the head scores: the mean copy score over the kept samples, by an independent pandas mean
    copies = read_table(folder / "retrieval_copies.parquet").frame
    assert len(copies) == 2 * 2 * 14  # lengths x samples x heads
    kept = samples[samples["kept"]][["length", "sample"]]
    want = copies.merge(kept).groupby(["length", "layer", "head"])["value"].mean()
    got = retrieval.set_index(["length", "layer", "head"])["value"]
    for index, value in got.items():
        assert value == pytest.approx(want[index], abs=1e-12) if index in want.index else value != value  # NaN
    assert (retrieval.groupby("length")["n_kept"].first() == samples.groupby("length")["kept"].sum()).all()
    every = copies.groupby(["length", "layer", "head"])[["forced_value", "forced_mass"]].mean()  # kept or not
    pd.testing.assert_frame_equal(retrieval.set_index(["length", "layer", "head"])[every.columns], every)
    hf_heads = read_table(tmp_path / "qwen2" / "retrieval.parquet").frame  # a Hugging Face model's forced pass
    assert hf_heads["forced_mass"].between(0, 1).all() and hf_heads["forced_mass"].max() > 0
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["job"] == "analyze" and run["checkpoints"]["qwen2"] == str(hf) and run["errors"] == {}
    both = result.table("entropy")  # one table over every model of the run
    assert set(both.model) == {"tiny", "qwen2"} and len(both) == len(entropy) + 2 * 2 * 4 * 4


def test_resume_skips_finished_items_and_redoes_changed_ones(tmp_path, checkpoints, monkeypatch):
    ours, _ = checkpoints
    analyze([ours], tmp_path, settings(metrics=["entropy", "retrieval"]))
    before = pd.read_parquet(tmp_path / "tiny" / "entropy.parquet")

    def boom(*args, **kwargs):
        raise AssertionError("finished work was redone")

    monkeypatch.setattr(items_mod, "text_items", boom)
    monkeypatch.setattr(items_mod, "decode_items", boom)
    analyze([ours], tmp_path, settings(metrics=["entropy", "retrieval"]))
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "tiny" / "entropy.parquet"), before)
    # other settings would replace the results: refused, naming the setting, before any work
    for change, says in ((dict(rows="last:8"), "`rows` 'all' there, 'last:8' now"),
                         (dict(dtype="float64"), "`dtype` as saved there, 'float64' now")):  # fmt: skip
        with pytest.raises(OutputRefused, match="holds results made with other settings") as refused:
            analyze([ours], tmp_path, settings(metrics=["entropy"], **change))
        assert says in str(refused.value)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "tiny" / "entropy.parquet"), before)
    # a metric whose definition changed (a new revision) is recomputed, not read back
    revised = dataclasses.replace(metrics_mod.METRICS["entropy"], revision=99)
    monkeypatch.setitem(metrics_mod.METRICS, "entropy", revised)
    with pytest.raises(AssertionError, match="redone"):
        analyze([ours], tmp_path, settings(metrics=["entropy"]))


def test_interrupted_run_keeps_finished_parts(tmp_path, checkpoints, monkeypatch):
    ours, _ = checkpoints
    real = items_mod.decode_items
    calls = []

    def interrupt(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:  # the first needle sample decoded, then Ctrl-C during the second
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(items_mod, "decode_items", interrupt)
    with pytest.raises(KeyboardInterrupt):
        analyze([ours], tmp_path, settings(metrics=["retrieval", "entropy"]))
    parts = sorted(p.name for p in (tmp_path / "tiny" / "parts").iterdir())
    assert parts == [  # every sample's work is kept as soon as it is done
        "entropy-256-s0.parquet",
        "entropy-256-s1.parquet",
        "retrieval_copies-256-s0.parquet",
        "retrieval_samples-256-s0.parquet",
    ]
    assert not (tmp_path / "tiny" / "retrieval.parquet").exists()  # no half-assembled tables
    monkeypatch.setattr(items_mod, "decode_items", real)
    redone = []
    monkeypatch.setattr(items_mod, "decode_items", lambda *a, **k: redone.append((a[1], a[5])) or real(*a, **k))
    analyze([ours], tmp_path, settings(metrics=["retrieval", "entropy"]))
    assert redone == [(256, 1), (320, 0), (320, 1)]  # (length, sample): only what was not finished
    assert set(pd.read_parquet(tmp_path / "tiny" / "retrieval.parquet")["length"]) == {256, 320}
    fresh = tmp_path / "fresh"
    analyze([ours], fresh, settings(metrics=["retrieval", "entropy"]))
    for table in ("retrieval", "retrieval_samples", "retrieval_copies", "entropy"):
        pd.testing.assert_frame_equal(  # resumed = uninterrupted, exactly
            pd.read_parquet(tmp_path / "tiny" / f"{table}.parquet"),
            pd.read_parquet(fresh / "tiny" / f"{table}.parquet"),
        )


def test_cli_failures_are_isolated_and_bad_input_writes_nothing(tmp_path, checkpoints):
    ours, hf = checkpoints
    res = runner.invoke(
        app,
        [
            "analyze",
            str(tmp_path / "missing"),
            str(ours),
            "--lengths",
            "48",
            "--samples",
            "1",
            "--metrics",
            "entropy",
            "--out",
            str(tmp_path / "a"),
            "--no-progress",
        ],
        env={"COLUMNS": "300"},
    )
    assert res.exit_code == 1 and "does not exist" in res.output
    assert (tmp_path / "a" / "tiny" / "entropy.parquet").exists() and not (tmp_path / "a" / "missing").exists()
    res = runner.invoke(
        app,
        ["analyze", str(ours), "--lengths", "64", "--out", str(tmp_path / "d"), "--no-progress"],
        env={"COLUMNS": "300"},
    )
    # the one checkpoint's failure is the run's (exit 2, as for `ruler eval`); several: exit 1, above
    assert res.exit_code == 2 and "too short for the needle" in res.output and not (tmp_path / "d").exists()
    for args, match in [
        (["--metrics", "entropy,attention"], "unknown metric"),
        (["--rows", "last:x"], "--rows"),
        (["--lengths", "4,8"], "give a value from 16 to 16777216, got 4"),
        (["--dtype", "half-ish"], "unknown dtype"),
        (["--retrieval-span", "approx"], "unknown retrieval span 'approx'; choose one of exact, reference"),
    ]:
        res = runner.invoke(app, ["analyze", str(ours), "--out", str(tmp_path / "b"), *args], env={"COLUMNS": "300"})
        assert res.exit_code == 2 and match in res.output, res.output
        assert not (tmp_path / "b").exists()
    res = runner.invoke(
        app,
        ["analyze", str(hf), "--lengths", "300000", "--out", str(tmp_path / "c"), "--no-progress"],
        env={"COLUMNS": "300"},
    )
    # refused before the model loads (its config says how long it was trained)
    assert res.exit_code == 2 and "300,000 tokens exceed the 262,144 positions it was trained on" in res.output
    assert not (tmp_path / "c").exists()


def test_memory_estimate_refuses_with_a_hint(tmp_path, checkpoints):
    ours, _ = checkpoints
    res = runner.invoke(
        app,
        [
            "analyze",
            str(ours),
            "--lengths",
            "65536",
            "--memory-limit",
            "0.5",
            "--allow-beyond-trained",
            "--out",
            str(tmp_path / "m"),
            "--no-progress",
        ],
        env={"COLUMNS": "300"},
    )
    assert res.exit_code == 2
    assert "needs about" in res.output and "GiB" in res.output and "--rows" in res.output
    assert "but --memory-limit allows only 0.5 GiB; raise --memory-limit, or analyse fewer rows" in res.output
    assert not (tmp_path / "m").exists()
    model = load_model(ours)
    small = model.memory(4096, rows=Rows.parse("last:64").count(4096), topk=16)
    big = model.memory(4096, rows=4096, topk=16)
    assert small.statistics < big.statistics and small.activations == big.activations
