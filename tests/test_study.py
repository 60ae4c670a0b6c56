"""The study job: its tables join every measurement to its member, seed and run; the comparisons average
over seeds as a hand computation does; a rerun measures nothing twice; an interrupted grid stops it."""

from __future__ import annotations

import pandas as pd
import pytest
from scipy.stats import binomtest

import headprobe.study.job as job
from headprobe.results import read_table
from headprobe.study import StudyError, StudySettings, run_study
from headprobe.study.tables import comparisons, markdown, spread
from headprobe.testing import GRID_RUNS as RUNS
from headprobe.testing import random_grid, tiny_config

SETTINGS = StudySettings(
    probes=["needle@60", "copy@40"],
    probe_samples=2,
    analysis_runs=["pt", "cpt-frozen"],
    analysis_metrics=["retrieval", "entropy"],
    analysis_lengths=[256],
    analysis_samples=1,
    ruler_runs=["cpt"],
    ruler_tasks=["niah_single_1"],
    ruler_lengths=[512],
    ruler_samples=1,
    shortctx_runs=[],
)


def fake_grid(members=("toy-a",), seeds=(0, 1)):
    """A stand-in for the trainer: random tiny byte models in the grid's layout, and their manifest."""
    return lambda runs: random_grid(runs, members, seeds)


def test_every_measurement_lands_on_its_member_seed_and_run_and_a_rerun_measures_nothing_again(tmp_path, monkeypatch):
    report = run_study(tmp_path, fake_grid(), SETTINGS)
    runs = report.tables["study_runs"]
    assert len(runs) == 2 * 3 and set(runs.model) == {f"toy-a-s{s}-{r}-final" for s in (0, 1) for r, _, _ in RUNS}
    probes = report.tables["study_probes"]
    assert len(probes) == 6 * 2 and set(probes.task) == {"needle", "copy"} and probes.accuracy.between(0, 1).all()
    for row in probes.itertuples():  # the model name encodes member, seed and run: they must agree
        assert row.model == f"{row.member}-s{row.seed}-{row.run}-final"
    heads = report.tables["study_heads"]
    assert set(heads.run) == {"pt", "cpt-frozen"} and set(heads.layer_type) == {"full", "sliding", "all"}
    full = heads[heads.layer_type == "full"]
    assert (full.heads == tiny_config().full.n_heads).all()  # 1 full layer x 2 heads
    unkept = heads[heads.n_kept == 0]  # random models copy no needle: no evidence, not "no retrieval heads"
    assert len(unkept) and unkept.retrieval_heads.isna().all() and unkept.fraction.isna().all()
    # the teacher-forced columns are there for every member, those that copy no needle included
    assert unkept.forced_retrieval_heads.between(0, unkept.heads).all()
    assert (unkept.forced_fraction == unkept.forced_retrieval_heads / unkept.heads).all()
    assert unkept.forced_mass.between(0, 1).all() and (unkept[unkept.layer_type == "full"].forced_mass > 0).all()
    row = heads[(heads.layer_type == "full")].iloc[0]  # the analysis' head table, averaged by hand
    scored = read_table(tmp_path / "analysis" / row.model / "retrieval.parquet").frame
    full = scored[(scored.layer_type == "full") & (scored.length == row.length)]
    assert row.forced_mass == pytest.approx(full.forced_mass.mean())
    assert row.forced_retrieval_heads == (full.forced_value >= 0.1).sum()
    assert set(report.tables["study_ruler"].run) == {"cpt"} and report.tables["study_shortctx"].empty
    stored = read_table(tmp_path / "tables" / "study_probes.parquet").frame
    pd.testing.assert_frame_equal(stored, probes.reset_index(drop=True), check_dtype=False)
    report_md = (tmp_path / "report.md").read_text()
    assert "## Held-out needle retrieval" in report_md and "## Teacher-forced retrieval heads" in report_md

    calls = []
    monkeypatch.setattr(job, "exact_answers", lambda *a: calls.append(a) or [True])
    again = run_study(tmp_path, fake_grid(), SETTINGS)
    assert calls == [] and again.tables["study_probes"].equals(report.tables["study_probes"])


def test_an_interrupted_grid_stops_the_study_before_any_measurement(tmp_path):
    report = run_study(tmp_path, lambda runs: {"runs": [], "interrupted": True}, SETTINGS)
    assert report.interrupted and not report.tables and not (tmp_path / "report.md").exists()


def test_spread_is_the_mean_over_seeds_with_its_95_percent_interval():
    accuracy = [0.5, 0.7, 1.0, 0.4, 0.25]
    frame = pd.DataFrame(
        dict(member=["a"] * 4 + ["b"], seed=[0, 0, 1, 2, 0], run="pt", distance=100, accuracy=accuracy, samples=8)
    )
    wide = spread(frame, ["member"], ["distance"], "accuracy", 100.0, trials="samples")
    # seed 0 averages its two rows first: seeds 60, 100, 40. Resampling 3 of them, a mean of 40 (all three the
    # 40) and of 100 each have probability 1/27 = 3.7% > 2.5%, so the 95% percentile interval is [40, 100]
    assert wide.set_index("member").loc["a", "100"] == "66.7 [40.0, 100.0]"
    # one seed of 8 trials, 2 right: Wilson's interval, as scipy computes it
    low, high = binomtest(2, 8).proportion_ci(confidence_level=0.95, method="wilson")
    assert wide.set_index("member").loc["b", "100"] == f"25.0 [{100 * low:.1f}, {100 * high:.1f}]" == "25.0 [7.1, 59.1]"
    assert spread(frame, ["member"], ["distance"], "accuracy", 100.0).set_index("member").loc["b", "100"] == "25.0"
    missing = frame.assign(accuracy=float("nan"))
    assert spread(missing, ["member"], ["distance"], "accuracy").iloc[0, 1] == "n/a"
    assert markdown(wide).splitlines()[2] == "| a | 66.7 [40.0, 100.0] |"


def test_comparisons_skip_missing_tables_and_bad_settings_are_named():
    assert comparisons({}) == {}
    with pytest.raises(StudyError, match="`probes`"):
        StudySettings.from_dict({"probes": ["needle"]})
    with pytest.raises(StudyError, match="unknown study settings"):
        StudySettings.from_dict({"probe": ["needle@10"]})


def test_comparisons_list_runs_in_the_recipes_order():
    """pt, cpt, cpt-frozen, sft as the runs table has them (alphabetical would put cpt before pt)."""
    order = ["pt", "cpt", "cpt-frozen", "sft"]
    runs = pd.DataFrame(dict(member="m", seed=0, run=order, stage="pt", freeze=None, steps=1, tokens=1,
                             final_curriculum_loss=9.0, eval_loss=[4.0, 3.0, 2.0, 1.0], status="trained"))  # fmt: skip
    probes = pd.DataFrame(dict(member="m", seed=0, run=order[::-1], task="needle", distance=100, samples=4,
                               accuracy=[0.0, 0.25, 0.5, 1.0]))  # fmt: skip
    views = comparisons({"study_runs": runs, "study_probes": probes})
    loss = next(v for title, v in views.items() if title.startswith("Held-out evaluation loss (every target"))
    assert list(loss.columns) == ["member", *order]
    assert loss.iloc[0, 1:].tolist() == ["4.000", "3.000", "2.000", "1.000"]
    assert not any("Diverged" in title for title in views)
    # a diverged run is left out of every comparison (never an architecture's 0) and listed on its own
    status = ["trained", "diverged", "trained", "trained"]
    apart = comparisons({"study_runs": runs.assign(status=status), "study_probes": probes})
    loss = next(v for title, v in apart.items() if title.startswith("Held-out evaluation loss (every target"))
    assert list(loss.columns) == ["member", "pt", "cpt-frozen", "sft"]
    assert loss.iloc[0, 1:].tolist() == ["4.000", "2.000", "1.000"]
    needle = next(v for title, v in apart.items() if title.startswith("Held-out needle"))
    assert needle["run"].astype(str).tolist() == ["pt", "cpt-frozen", "sft"]  # cpt (its 50.0) is gone
    assert [cell.split(" [")[0] for cell in needle["100"]] == ["100.0", "25.0", "0.0"]
    diverged = next(v for title, v in apart.items() if title.startswith("Diverged runs"))
    assert diverged[["member", "seed", "run"]].astype(str).values.tolist() == [["m", "0", "cpt"]]
    assert list(apart)[-1].startswith("Diverged runs (left out of every table above)")
    needle = next(v for title, v in views.items() if title.startswith("Held-out needle"))
    assert needle["run"].astype(str).tolist() == order
    assert [cell.split(" [")[0] for cell in needle["100"]] == ["100.0", "50.0", "25.0", "0.0"]  # [Wilson interval]
