"""The study's verdicts (headprobe.study.verdicts) from synthetic study tables built here: each verdict kind
(holds, opposite, inconclusive for every reason) for several findings, the values worked by hand, and the
bootstrap interval against an enumeration of every resample."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")
import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr
from typer.testing import CliRunner

from headprobe.cli import app
from headprobe.results import ResultsError, TableMeta, read_table, write_table
from headprobe.show import show_tables
from headprobe.study.verdicts import VERDICTS, bootstrap, difference, intermediate_layers, verdict_markdown, verdicts

MEMBERS = ("toy-d16", "toy-d32", "toy-d64", "toy-k64v16", "toy-k16v64")
RUNS = ("pt", "cpt", "cpt-frozen")
# a member's place in the textbook study: the symmetric members by width, the wide query/key member above
# the wide value member
RANK = {"toy-d16": 0.0, "toy-d32": 1.0, "toy-d64": 2.0, "toy-k64v16": 1.5, "toy-k16v64": 0.5}
# held-out loss ranks chosen against the accuracy ranks (d16 1, k16v64 2, d32 3, k64v16 4, d64 5) so that
# the sum of squared rank differences is 1 + 9 + 0 + 9 + 1 = 20: Spearman's rho = 1 - 6 * 20 / (5 * 24) = 0
LOSS_RANK = {"toy-d16": 2, "toy-k16v64": 5, "toy-d32": 3, "toy-k64v16": 1, "toy-d64": 4}


def model(member: str, seed: int, run: str) -> str:
    return f"{member}-s{seed}-{run}-final"


@dataclass
class Study:
    """A synthetic study: each quantity a function of (member, seed, run); by default every finding holds."""

    members: tuple[str, ...] = MEMBERS
    seeds: tuple[int, ...] = (0, 1, 2)
    accuracy: Callable = lambda m, s, r: 0.2 * RANK[m] + 0.05 * s  # needle accuracy at the longest distance
    eval_loss: Callable = lambda m, s, r: 2.0 + 0.1 * LOSS_RANK[m]
    fraction: Callable = lambda m, s, r: 0.1 * RANK[m] + 0.01 * s
    forced: Callable = lambda m, s, r: 0.05 * RANK[m]
    reading: Callable = lambda m, s, r: 0.15 * RANK[m]  # needle-reading heads' fraction
    mass: Callable = lambda m, s, r: 0.3  # teacher-forced attention mass on the needle at the answer steps
    entropy: Callable = lambda m, s, r: 0.6 - (0.0 if r == "pt" else 0.1) + 0.01 * s
    reordering: Callable = lambda m, s, r: 0.3 + (0.1 if r == "cpt" else 0.0) + 0.01 * s
    erank: Callable = lambda m, s, r, layer: 10 + RANK[m] + 0.1 * s if layer in (1, 2) else 50 - 10 * RANK[m]
    status: Callable = lambda m, s, r: "trained"
    drop: dict[str, list[str]] = field(default_factory=dict)  # table -> columns left out

    def who(self):
        return [(m, s, r) for m in self.members for s in self.seeds for r in RUNS]

    def tables(self) -> dict[str, pd.DataFrame]:
        runs = pd.DataFrame([
            {"model": model(m, s, r), "member": m, "seed": s, "run": r, "stage": r.split("-")[0],
             "freeze": "attention" if r == "cpt-frozen" else None, "steps": 10, "tokens": 100,
             "final_curriculum_loss": 0.5, "eval_loss": self.eval_loss(m, s, r), "status": self.status(m, s, r)}
            for m, s, r in self.who()
        ])  # fmt: skip
        # the shorter distance holds the opposite ranking: a statistic read there would say so
        probes = pd.DataFrame([
            {"model": model(m, s, r), "member": m, "seed": s, "run": r, "task": "needle", "distance": d,
             "samples": 8, "accuracy": self.accuracy(m, s, r) if d == 3000 else 1 - self.accuracy(m, s, r)}
            for m, s, r in self.who() for d in (500, 3000)
        ])  # fmt: skip
        heads = pd.DataFrame([
            {"model": model(m, s, r), "member": m, "seed": s, "run": r, "length": n, "layer_type": lt,
             "heads": 4.0, "fraction": self.fraction(m, s, r) if lt == "full" else 0.9,
             "forced_fraction": self.forced(m, s, r) if lt == "full" else 0.9, "n_kept": 4.0,
             "forced_mass": self.mass(m, s, r), "reading_fraction": self.reading(m, s, r) if lt == "full" else 0.9}
            for m, s, r in self.who() for n in (512, 1024) for lt in ("full", "sliding", "all")
        ])  # fmt: skip
        out = {"study_runs": runs, "study_probes": probes, "study_heads": heads}
        return {name: frame.drop(columns=self.drop.get(name, [])) for name, frame in out.items()}

    def analysis(self) -> dict[str, pd.DataFrame]:
        """The analyze tables as analyze writes them: rows named by ``model`` only; sliding heads hold values
        that would reverse every finding if they were read."""
        heads = [(layer, h, "full" if layer % 2 else "sliding") for layer in range(4) for h in range(2)]
        entropy = pd.DataFrame([
            {"model": model(m, s, r), "layer": layer, "head": h, "layer_type": lt, "length": 512, "value": 1.0,
             "norm_value": self.entropy(m, s, r) if lt == "full" else 0.9 - self.entropy(m, s, r)}
            for m, s, r in self.who() for layer, h, lt in heads
        ])  # fmt: skip
        reordering = pd.DataFrame([
            {"model": model(m, s, r), "layer": layer, "head": h, "layer_type": lt, "length": 512,
             "value": self.reordering(m, s, r) if lt == "full" else 1 - self.reordering(m, s, r)}
            for m, s, r in self.who() for layer, h, lt in heads
        ])  # fmt: skip
        erank = pd.DataFrame([
            {"model": model(m, s, r), "layer": layer, "site": "embed" if layer < 0 else "block_out",
             "layer_type": "embedding" if layer < 0 else "full" if layer % 2 else "sliding", "length": 512,
             "value": self.erank(m, s, r, layer), "centered": 1.0, "tokens": 10}
            for m, s, r in self.who() for layer in range(-1, 4)
        ])  # fmt: skip
        return {"entropy": entropy, "reordering": reordering, "erank": erank}

    def verdicts(self) -> pd.DataFrame:
        return verdicts(self.tables(), self.analysis()).set_index("finding")


def test_the_textbook_study_holds_every_finding_with_the_values_worked_by_hand():
    frame = Study().verdicts()
    assert list(frame.index) == list(range(1, 9))
    assert (frame.verdict == "holds").all(), frame.reason.to_dict()
    # 1, 4: at 3,000 characters toy-d64 answers 40, 45, 50 points and toy-d16 0, 5, 10; 5: toy-k64v16 30-40
    # against toy-k16v64 10-20
    for finding, value, members in ((1, 40.0, "toy-d16, toy-d64"), (4, 40.0, "toy-d16, toy-d64"),
                                    (5, 20.0, "toy-k16v64, toy-k64v16")):  # fmt: skip
        assert frame.loc[finding, "value"] == pytest.approx(value) and frame.loc[finding, "members"] == members
    assert "3,000 characters" in frame.loc[1, "statistic"] and frame.loc[1, "seeds"] == 3
    assert frame.loc[2, "value"] == pytest.approx(0.0, abs=1e-12)  # the ranks chosen for rho = 0
    assert frame.loc[3, "value"] == pytest.approx(0.2) and frame.loc[3, "inputs"].startswith("study_heads.fraction")
    assert (
        frame.loc[6, "value"] == pytest.approx(-0.1) and "similar between toy-d32 and toy-d64" in frame.loc[6, "reason"]
    )
    assert frame.loc[7, "value"] == pytest.approx(0.1)
    # 8: blocks 1 and 2 of the toys' 4: 10 + rank + seed/10, so toy-d64 minus toy-d16 is 2 (blocks 0 and 3,
    # which fall with width, are not read)
    assert frame.loc[8, "value"] == pytest.approx(2.0) and "blocks 1-2" in frame.loc[8, "statistic"]
    # an interval of a constant difference is that difference
    assert frame.loc[7, "ci_low"] == pytest.approx(0.1) and frame.loc[7, "ci_high"] == pytest.approx(0.1)


def test_published_values_are_the_studys_at_its_nearest_scale():
    frame = Study().verdicts()
    assert frame.loc[1, "published"] == 9.96 and frame.loc[1, "published_scale"] == "0.6b"
    assert frame.loc[3, "published"] == pytest.approx(0.25 - 0.073, abs=1e-9)
    assert frame.loc[5, "published"] == pytest.approx(37.78 - 31.28, abs=1e-9)
    assert "toy scale" in frame.loc[1, "published_note"] and "RULER" in frame.loc[1, "reason"]
    for finding in (2, 4, 6, 7, 8):
        assert (
            math.isnan(frame.loc[finding, "published"]) and "without a number" in frame.loc[finding, "published_note"]
        )


def test_reversed_effects_are_opposite():
    study = Study(
        accuracy=lambda m, s, r: 0.5 - 0.2 * (RANK[m] - 1) + 0.05 * s,  # narrower retrieves better
        eval_loss=lambda m, s, r: 3.0 - 0.2 * RANK[m],  # lower loss exactly where retrieval is higher
        entropy=lambda m, s, r: 0.4 + (0.0 if r == "pt" else 0.1) + 0.01 * s,  # higher after cpt
        reordering=lambda m, s, r: 0.3 - (0.1 if r == "cpt" else 0.0) + 0.01 * s,  # frozen reorders more
    )
    frame = study.verdicts()
    for finding in (1, 2, 4, 5, 6, 7):
        assert frame.loc[finding, "verdict"] == "opposite", (finding, frame.loc[finding, "reason"])
    assert frame.loc[1, "value"] == pytest.approx(-40.0) and "lies below 0" in frame.loc[1, "reason"]
    # accuracy falls with rank and so does the loss: the members rank alike, rho = +1
    assert frame.loc[2, "value"] == pytest.approx(1.0) and "higher loss" in frame.loc[2, "reason"]
    assert frame.loc[6, "value"] == pytest.approx(0.1) and frame.loc[7, "value"] == pytest.approx(-0.1)


def test_loss_ranking_retrieval_is_opposite_and_rho_is_spearmans():
    study = Study(eval_loss=lambda m, s, r: 3.0 - 0.2 * RANK[m] + 0.01 * s * (m == "toy-d32"))
    frame = study.verdicts()
    tables = study.tables()
    loss = tables["study_runs"].query("run == 'cpt'").groupby("member").eval_loss.mean()
    probes = tables["study_probes"].query("run == 'cpt' and distance == 3000").groupby("member").accuracy.mean()
    assert frame.loc[2, "value"] == pytest.approx(spearmanr(loss, probes[loss.index]).statistic) == -1.0
    assert frame.loc[2, "verdict"] == "opposite" and "lower loss" in frame.loc[2, "reason"]


def test_an_interval_spanning_zero_is_inconclusive():
    spread = {0: 0.0, 1: 0.5, 2: 1.0}
    frame = Study(accuracy=lambda m, s, r: spread[s]).verdicts()  # every member alike, seeds far apart
    for finding in (1, 4, 5):
        assert frame.loc[finding, "verdict"] == "inconclusive"
        assert frame.loc[finding, "value"] == 0.0 and frame.loc[finding, "ci_low"] < 0 < frame.loc[finding, "ci_high"]
        assert "includes 0 (no effect)" in frame.loc[finding, "reason"]
    # every member answers alike on average: there is no retrieval to predict
    assert frame.loc[2, "verdict"] == "inconclusive" and "same for every member" in frame.loc[2, "reason"]


def test_one_seed_gives_a_value_but_no_interval():
    frame = Study(seeds=(0,)).verdicts()
    assert (frame.verdict == "inconclusive").all()
    assert frame.loc[1, "value"] == pytest.approx(40.0) and math.isnan(frame.loc[1, "ci_low"])
    assert frame.loc[1, "seeds"] == 1 and "one seed of toy-d16, toy-d64: no interval" in frame.loc[1, "reason"]
    assert frame.loc[7, "value"] == pytest.approx(0.1) and "one seed" in frame.loc[7, "reason"]


def test_a_diverged_member_is_left_out_and_named():
    diverged = Study(status=lambda m, s, r: "diverged" if m == "toy-k64v16" and r == "pt" else "trained")
    frame = diverged.verdicts()
    assert frame.loc[5, "verdict"] == "inconclusive" and math.isnan(frame.loc[5, "value"])
    assert "no trained, measured a wide query/key member" in frame.loc[5, "reason"]
    assert "diverged, left out: toy-k64v16 pt of seeds 0, 1, 2" in frame.loc[5, "reason"]
    assert frame.loc[1, "verdict"] == "holds" and "k64v16" not in frame.loc[1, "reason"]  # not compared there
    # finding 2 still has four members; its cpt rows of toy-k64v16 (trained from the diverged pt) are left out
    assert frame.loc[2, "verdict"] != "inconclusive" and "toy-k64v16" not in frame.loc[2, "members"]
    assert "toy-k64v16 pt of seeds 0, 1, 2" in frame.loc[2, "reason"]
    assert "toy-k64v16" not in frame.loc[7, "members"] and "toy-k64v16 pt" in frame.loc[7, "reason"]


def test_a_diverged_member_that_leaves_too_few_is_inconclusive():
    study = Study(members=("toy-d16", "toy-d64"), status=lambda m, s, r: "diverged" if m == "toy-d64" else "trained")
    frame = study.verdicts()
    for finding in (1, 3, 4, 8):
        assert frame.loc[finding, "verdict"] == "inconclusive"
        assert "too few symmetric members trained and measured: toy-d16" in frame.loc[finding, "reason"]
        assert "toy-d64 pt of seeds 0, 1, 2" in frame.loc[finding, "reason"]


def test_one_diverged_run_leaves_its_seed_out_of_that_run_only():
    study = Study(status=lambda m, s, r: "diverged" if (m, s, r) == ("toy-d64", 2, "cpt") else "trained")
    frame = study.verdicts()
    # toy-d64 after cpt: seeds 0 and 1 (40, 45); toy-d16 0, 5, 10: 42.5 - 5
    assert frame.loc[1, "value"] == pytest.approx(37.5) and frame.loc[1, "seeds"] == 2
    assert "toy-d64 cpt of seed 2" in frame.loc[1, "reason"] and frame.loc[1, "verdict"] == "holds"
    assert frame.loc[4, "value"] == pytest.approx(40.0) and "diverged" not in frame.loc[4, "reason"]  # frozen cpt


@pytest.mark.parametrize(
    ("drop", "findings", "said"),
    [
        ({"study_runs": ["eval_loss"]}, (2,), "study_runs lacks `eval_loss`"),
        ({"study_runs": ["status"]}, tuple(range(1, 9)), "study_runs lacks `status`"),
        ({"study_probes": ["accuracy"]}, (1, 2, 4, 5), "study_probes lacks `accuracy`"),
        ({"study_heads": ["layer_type"]}, (3,), "study_heads lacks `layer_type`"),
    ],
)
def test_a_missing_column_is_inconclusive_and_named(drop, findings, said):
    frame = Study(drop=drop).verdicts()
    for finding in findings:
        assert frame.loc[finding, "verdict"] == "inconclusive" and said in frame.loc[finding, "reason"]
        assert "rerun the study with a headprobe that records it" in frame.loc[finding, "reason"]
    assert (frame.drop(index=list(findings)).verdict == "holds").all()


def test_missing_tables_are_inconclusive_and_named():
    study = Study()
    frame = verdicts({"study_runs": study.tables()["study_runs"]}).set_index("finding")
    assert (frame.verdict == "inconclusive").all()
    assert "no 'study_probes' table" in frame.loc[1, "reason"] and "no 'study_heads' table" in frame.loc[3, "reason"]
    assert "no 'entropy' table" in frame.loc[6, "reason"] and "no 'erank' table" in frame.loc[8, "reason"]
    frame = verdicts({}).set_index("finding")  # nothing at all: still one row per finding
    assert len(frame) == 8 and (frame.verdict == "inconclusive").all()


def test_a_run_without_a_status_is_unknown_not_trained():
    study = Study(status=lambda m, s, r: None if (m, s) == ("toy-d64", 1) else "trained")
    frame = study.verdicts()
    assert frame.loc[1, "verdict"] == "inconclusive"
    assert "no `status` for toy-d64 s1 cpt" in frame.loc[1, "reason"]
    assert frame.loc[5, "verdict"] == "holds"  # toy-d64 is not compared there


def test_the_retrieval_head_fraction_falls_back_to_the_needle_reading_heads():
    study = Study(fraction=lambda m, s, r: math.nan if m == "toy-d16" else 0.5)  # toy-d16 copied no needle
    frame = study.verdicts()
    assert frame.loc[3, "verdict"] == "holds" and frame.loc[3, "value"] == pytest.approx(0.3)  # 0.15 x rank 2
    assert frame.loc[3, "inputs"].startswith("study_heads.reading_fraction")
    assert (
        "needle-reading heads (teacher-forced mass >= 0.1) (Wu's needs a copied needle: none from toy-d16)"
        in (frame.loc[3, "reason"])
    )
    study.drop = {"study_heads": ["reading_fraction"]}  # a study_heads made before needle-reading heads
    frame = study.verdicts()
    assert frame.loc[3, "verdict"] == "holds" and frame.loc[3, "value"] == pytest.approx(0.1)  # 0.05 x rank 2
    assert frame.loc[3, "inputs"].startswith("study_heads.forced_fraction")
    assert "teacher-forced score (Wu's needs a copied needle: none from toy-d16)" in frame.loc[3, "reason"]
    study.drop = {"study_heads": ["reading_fraction", "forced_fraction"]}
    frame = study.verdicts()
    assert frame.loc[3, "verdict"] == "inconclusive" and "`reading_fraction`" in frame.loc[3, "reason"]


def test_a_head_fraction_of_runs_that_never_look_at_the_needle_decides_nothing():
    """The toys' 3-seed study (docs/study.md): no head attends to the needle of the analysis prompts (mass on it
    at most 0.007), so every forced fraction is 0 and "no effect" would be read from an instrument that measured
    nothing. Below a mass of 0.02 in every compared run the finding is inconclusive and says why; one run of
    a compared member that looks at the needle (0.03) is enough for the fraction to count."""
    blind = Study(fraction=lambda m, s, r: math.nan, forced=lambda m, s, r: 0.0, mass=lambda m, s, r: 0.007,
                  reading=lambda m, s, r: 0.0)  # fmt: skip
    frame = blind.verdicts()
    assert frame.loc[3, "verdict"] == "inconclusive" and math.isnan(frame.loc[3, "value"])
    assert "no compared run attends to the needle" in frame.loc[3, "reason"] and "0.0070" in frame.loc[3, "reason"]
    seeing = Study(fraction=lambda m, s, r: math.nan, reading=lambda m, s, r: 0.05 * RANK[m],
                   mass=lambda m, s, r: 0.03 if (m, s, r) == ("toy-d64", 0, "cpt") else 0.007)  # fmt: skip
    frame = seeing.verdicts()
    assert frame.loc[3, "verdict"] == "holds" and frame.loc[3, "value"] == pytest.approx(0.1)


def test_members_that_are_no_preset_have_no_shape_to_compare():
    rank = {"toy-a": 0.0, "toy-b": 1.0}  # no preset: their head shapes are unknown
    study = Study(members=tuple(rank), accuracy=lambda m, s, r: 0.5, eval_loss=lambda m, s, r: 2.0,
                  fraction=lambda m, s, r: rank[m],
                  forced=lambda m, s, r: rank[m], reading=lambda m, s, r: rank[m],
                  erank=lambda m, s, r, layer: 10 + rank[m])  # fmt: skip
    frame = study.verdicts()
    for finding in (1, 3, 4, 8):
        assert frame.loc[finding, "verdict"] == "inconclusive"
        assert (
            "too few symmetric members trained and measured: none (of none in the study)"
            in frame.loc[finding, "reason"]
        )
    assert "no trained, measured a wide query/key member" in frame.loc[5, "reason"]
    assert frame.loc[7, "verdict"] == "holds"  # a change after cpt needs no head shape


def test_the_bootstrap_interval_is_the_enumerated_resamples_percentiles():
    """Two members of 3 seeds: every resample (27 per member, 729 pairs, equally likely) enumerated here. The
    values are chosen so the 2.5th and 97.5th percentiles fall inside atoms of the distribution with room on
    both sides (cumulative probability below each atom at most 1.2%, through it at least 9%): Monte Carlo
    resampling lands on the same atom."""
    points = {"toy-d16": (0.0, 0.0, 25.0), "toy-d64": (75.0, 75.0, 100.0)}
    study = Study(members=tuple(points), accuracy=lambda m, s, r: points[m][s] / 100)
    diffs = np.array([np.mean(b) - np.mean(a) for a in itertools.product(points["toy-d16"], repeat=3)
                      for b in itertools.product(points["toy-d64"], repeat=3)])  # fmt: skip
    values, counts = np.unique(np.round(diffs, 9), return_counts=True)
    cdf = np.cumsum(counts) / counts.sum()
    i, j = np.searchsorted(cdf, 0.025), np.searchsorted(cdf, 0.975)  # the first atoms whose cdf reach 2.5%, 97.5%
    low, high = values[i], values[j]
    assert cdf[i - 1] <= 0.012 and cdf[i] >= 0.09  # 8/729 below the low atom, 68/729 through it
    assert cdf[j - 1] <= 0.91 and cdf[j] >= 0.988  # and the mirror image at the top
    assert (low, high) == pytest.approx((175 / 3, 275 / 3))  # 58.33 and 91.67 by hand: 75 - 50/3, 100 - 25/3
    row = study.verdicts().loc[1]
    assert row.value == pytest.approx(75.0)
    assert (row.ci_low, row.ci_high) == pytest.approx((low, high), abs=1e-9)
    assert row.verdict == "holds" and verdicts(study.tables(), study.analysis()).equals(
        verdicts(study.tables(), study.analysis())
    )  # a fixed generator seed: the same tables give the same table


def test_the_bootstrap_percentiles_are_the_95_percent_ones():
    """Two members of 5 whole-number seeds: the exact distribution of the difference of resampled means (each
    member's 3,125 resamples enumerated, the two convolved) has atoms 0.2 apart; the interval lies within one
    atom of its exact 2.5th and 97.5th percentiles, which are at least two atoms from the 5th and 95th."""
    a, b = np.array([0.0, 1, 2, 3, 4]), np.array([3.0, 5, 6, 8, 13])

    def sum_counts(seeds: np.ndarray) -> np.ndarray:
        counts = np.zeros(int(seeds.max()) * 5 + 1)
        for draw in itertools.product(seeds, repeat=5):
            counts[int(sum(draw))] += 1
        return counts

    counts = np.convolve(sum_counts(b), sum_counts(a)[::-1])  # index k: sum(b draws) - sum(a draws) = k - 20
    values = (np.arange(len(counts)) - 20) / 5
    cdf = np.cumsum(counts) / counts.sum()

    def exact(p: float) -> float:
        return values[np.searchsorted(cdf, p)]

    assert exact(0.05) - exact(0.025) >= 0.4 - 1e-9 and exact(0.975) - exact(0.95) >= 0.4 - 1e-9
    est = bootstrap({"a": a[:, None], "b": b[:, None]}, difference("a", "b"))
    assert est.value == pytest.approx(5.0) and est.seeds == 5
    assert est.low == pytest.approx(exact(0.025), abs=0.2 + 1e-9) and est.high == pytest.approx(
        exact(0.975), abs=0.2 + 1e-9
    )


def test_the_intermediate_blocks_scale_the_studys_7_to_19_of_28():
    assert list(intermediate_layers(28)) == list(range(7, 20))
    assert list(intermediate_layers(4)) == [1, 2]
    assert list(intermediate_layers(36)) == list(range(9, 25))  # 19 * 36 // 28 = 24


def test_the_verdicts_of_a_study_folder_are_those_of_its_frames(tmp_path):
    study = Study()
    for name, frame in study.tables().items():
        write_table(tmp_path / "tables" / f"{name}.parquet", frame, TableMeta(table=name))
    for name, frame in study.analysis().items():
        for name_of, rows in frame.groupby("model"):
            write_table(tmp_path / "analysis" / name_of / f"{name}.parquet", rows, TableMeta(table=name, model=name_of))
    from_folder = verdicts(tmp_path)
    pd.testing.assert_frame_equal(from_folder, verdicts(study.tables(), study.analysis()))
    write_table(tmp_path / "v.parquet", from_folder, TableMeta(table="study_verdicts"), VERDICTS)
    pd.testing.assert_frame_equal(read_table(tmp_path / "v.parquet").frame, from_folder)
    with pytest.raises(ResultsError, match="is not a folder; give the study's folder"):
        verdicts(tmp_path / "nowhere")


def test_the_markdown_table_has_a_row_per_finding_with_its_interval_and_verdict():
    points = {"toy-d16": (0.0, 0.0, 25.0), "toy-d64": (75.0, 75.0, 100.0)}
    study = Study(members=tuple(points), accuracy=lambda m, s, r: points[m][s] / 100)
    text = verdict_markdown(verdicts(study.tables(), study.analysis()))
    lines = text.splitlines()
    assert lines[0] == "| # | finding | statistic | ours [95% interval] | published | verdict | reason |"
    assert len(lines) == 2 + 8
    first = lines[2].split(" | ")
    assert first[3] == "+75.0 [58.3, 91.7]" and first[4].startswith("+9.96 (RULER-100") and first[5] == "**holds**"
    assert "| 5 | query/key width matters more than value width |" in text and "**inconclusive**" in lines[6]


def _study_folder(tmp_path, study: Study, with_verdicts: bool = True):
    for name, frame in study.tables().items():
        write_table(tmp_path / "tables" / f"{name}.parquet", frame, TableMeta(table=name))
    if with_verdicts:
        frame = verdicts(study.tables(), study.analysis())
        write_table(tmp_path / "tables" / "study_verdicts.parquet", frame, TableMeta(table="study_verdicts"), VERDICTS)
    return tmp_path


def test_show_prints_the_verdict_table_of_a_study_folder(tmp_path):
    points = {"toy-d16": (0.0, 0.0, 25.0), "toy-d64": (75.0, 75.0, 100.0)}
    folder = _study_folder(tmp_path, Study(members=tuple(points), accuracy=lambda m, s, r: points[m][s] / 100))
    (shown,) = show_tables(folder, ["verdicts"])
    assert shown.title == "study verdicts" and list(shown.frame.index) == list(range(1, 9))
    assert shown.frame.loc[1, "ours [95% interval]"] == "+75.0 [58.3, 91.7]"  # points: one decimal
    assert shown.frame.loc[1, "published"].startswith("+9.96 (") and shown.frame.loc[1, "verdict"] == "holds"
    assert not shown.frame.loc[2, "published"].startswith(("+", "-"))  # no published number: what it lacks
    out = CliRunner().invoke(app, ["show", str(folder), "--metric", "verdicts"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "study verdicts" in out.output and "+75.0 [58.3, 91.7]" in out.output and "inconclusive" in out.output


def test_show_says_how_to_get_the_verdicts_of_a_study_measured_before_them(tmp_path):
    folder = _study_folder(tmp_path, Study(), with_verdicts=False)
    (shown,) = show_tables(folder, ["verdicts"])
    assert "rerun the same `headprobe study` command" in shown.frame.iloc[0, 0]
    with pytest.raises(ResultsError, match="study_verdicts"):
        show_tables(_empty(tmp_path), ["verdicts"])


def _empty(tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    return folder


def test_the_figure_has_a_panel_per_finding_with_our_value_the_published_one_and_the_verdict(tmp_path):
    from matplotlib.collections import PathCollection

    from figures import verdicts as figure
    from figures.data import MissingInput, Results

    points = {"toy-d16": (0.0, 0.0, 25.0), "toy-d64": (75.0, 75.0, 100.0)}
    folder = _study_folder(tmp_path, Study(members=tuple(points), accuracy=lambda m, s, r: points[m][s] / 100))
    fig = figure.build(Results(folder))
    axes = fig.axes
    assert [ax.get_title().split(".")[0] for ax in axes] == [str(n) for n in range(1, 9)]
    texts = [[t.get_text() for t in ax.texts] for ax in axes]
    assert "HOLDS" in texts[0] and "INCONCLUSIVE" in texts[4]  # finding 5: no asymmetric member here
    ours = [line.get_xydata().tolist() for line in axes[0].lines if line.get_marker() == "o"]
    assert ours == [[[0.0, 75.0]]]
    caps = sorted(y for line in axes[0].lines if line.get_marker() == "_" for y in line.get_ydata())
    assert caps == pytest.approx([175 / 3, 275 / 3])
    stars = [c for c in axes[0].collections if isinstance(c, PathCollection) and c.get_label().startswith("published")]
    assert stars[0].get_offsets().tolist() == [[1.0, 9.96]]
    assert "no number" in texts[1]  # finding 2: the study gives none
    with pytest.raises(MissingInput, match="study_runs"):
        figure.build(Results(_empty(tmp_path)))
