"""Figures and tables drawn from small tidy fixture tables: what each figure plots, read back from its
matplotlib artists, equals the values the fixture was built from (computed here by hand from the same
formulas), and the tables print exactly those values with the stated rounding."""

from __future__ import annotations

import json
import math
import shutil

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PathCollection
from typer.testing import CliRunner

import figures
from figures import (
    attention_entropy,
    effective_rank,
    frozen_cpt,
    loss_vs_retrieval,
    probes,
    qk_vs_v,
    retrieval_heads,
    retrieval_heads_table,
    ruler_by_length,
    ruler_table,
    short_context,
    style,
    token_reordering,
)
from figures.data import MissingInput, Results
from figures.draw import built
from figures.tables import latex, write
from headprobe.cli import app
from headprobe.results import TableMeta, read_table, write_table

MEMBERS = ("toy-d16", "toy-d64", "toy-k64v16")
SEEDS = (0, 1)
RUNS = ("pt", "cpt", "cpt-frozen")
LENGTHS = (512, 1024)
BASE = {"toy-d16": 10.0, "toy-d64": 30.0, "toy-k64v16": 40.0}
RUN_OFFSET = {"pt": -20.0, "cpt": 0.0, "cpt-frozen": -8.0}


def model(member: str, seed: int, run: str) -> str:
    return f"{member}-s{seed}-{run}"


def ruler_score(member: str, seed: int, run: str, length: int) -> float:
    return BASE[member] + 10 * seed + RUN_OFFSET[run] - (5 if length == 1024 else 0)


def eval_loss(member: str, seed: int, run: str) -> float:
    return 2.0 + BASE[member] / 100 + seed / 10 + (0.5 if run == "pt" else 0.0)


def status(member: str, seed: int) -> str:
    """toy-k64v16's seed 1 diverged."""
    return "diverged" if (member, seed) == ("toy-k64v16", 1) else "trained"


def trained(member: str) -> list[int]:
    """The seeds whose runs a figure draws: a diverged run is no architecture's number."""
    return [s for s in SEEDS if status(member, s) == "trained"]


def fraction(member: str, seed: int, run: str) -> float:
    """Retrieval-head share; toy-d16 never kept a sample (NaN)."""
    if member == "toy-d16":
        return math.nan
    return {"toy-d64": 0.25, "toy-k64v16": 0.5}[member] + (0.0 if run == "pt" else 0.25) - 0.125 * seed


def _write(folder, name, rows, sub="tables"):
    frame = pd.DataFrame(rows)
    write_table(folder / sub / f"{name}.parquet", frame, TableMeta(table=name))


@pytest.fixture()
def results(tmp_path):
    who = [(m, s, r) for m in MEMBERS for s in SEEDS for r in RUNS]
    _write(tmp_path, "study_runs", [
        {"model": model(m, s, r), "member": m, "seed": s, "run": r, "stage": r.split("-")[0], "freeze": None,
         "steps": 10, "tokens": 100, "final_curriculum_loss": 9.0 - s, "eval_loss": eval_loss(m, s, r),
         "eval_loss_local": 1.0, "eval_loss_retrieval": 5.0 - eval_loss(m, s, r), "status": status(m, s)}
        for m, s, r in who
    ])  # fmt: skip
    _write(tmp_path, "study_ruler", [
        {"model": model(m, s, r), "member": m, "seed": s, "run": r, "length": n, "score": ruler_score(m, s, r, n)}
        for m, s, r in who if r != "pt" for n in LENGTHS
    ])  # fmt: skip
    _write(tmp_path, "study_heads", [
        {"model": model(m, s, r), "member": m, "seed": s, "run": r, "length": 512, "layer_type": lt,
         "retrieval_heads": fraction(m, s, r) * 8, "heads": 8.0, "fraction": fraction(m, s, r),
         "n_kept": 0.0 if m == "toy-d16" else 4.0}
        for m, s, r in who for lt in ("full", "sliding", "all")
    ])  # fmt: skip
    _write(tmp_path, "study_probes", [
        {"model": model(m, s, "pt"), "member": m, "seed": s, "run": "pt", "task": "needle", "distance": d,
         "samples": 8, "accuracy": BASE[m] / 100 * (1 if d == 500 else 0.5)}
        for m in MEMBERS for s in SEEDS for d in (500, 1500)
    ])  # fmt: skip
    _write(tmp_path, "study_shortctx", [
        {"model": model(m, s, "pt"), "member": m, "seed": s, "run": "pt", "task": "arc", "metric": k,
         "value": 0.25 + 0.125 * s + (0.0625 if k == "acc_norm" else 0.0)}
        for m in MEMBERS for s in SEEDS for k in ("acc", "acc_norm")
    ])  # fmt: skip
    for m, s, r in who:
        name = model(m, s, r)
        heads = [(layer, h) for layer in (1, 3) for h in range(2)]
        _write(tmp_path, "entropy", [
            {"model": name, "layer": layer, "head": h, "layer_type": "full", "value": 1.0,
             "norm_value": 0.1 * (layer + h), "max_prob": 0.5, "mean_distance": 3.0, "length": 512, "sample": 0}
            for layer, h in heads
        ], f"analysis/{name}")  # fmt: skip
        _write(tmp_path, "reordering", [
            {"model": name, "layer": layer, "head": h, "layer_type": "full", "value": 0.2 + 0.05 * h, "length": 512}
            for layer, h in heads
        ], f"analysis/{name}")  # fmt: skip
        _write(tmp_path, "erank", [
            {"model": name, "layer": layer, "site": "block_out", "layer_type": "full", "value": BASE[m] + layer + s,
             "centered": 1.0, "tokens": 10, "length": 512}
            for layer in (-1, 0, 1)
        ], f"analysis/{name}")  # fmt: skip
        _write(tmp_path, "ruler_scores", [
            {"model": name, "scope": "task", "task": t, "length": n, "score": ruler_score(m, s, r, n) + k, "n": 4,
             "fit": "ruler"}
            for k, t in enumerate(("niah_single_1", "vt")) for n in LENGTHS
        ] + [
            {"model": name, "scope": "overall", "task": None, "length": None,
             "score": np.mean([ruler_score(m, s, r, n) for n in LENGTHS]) + 0.5, "n": 2, "fit": "ruler"}
        ], f"ruler/{name}")  # fmt: skip
    return tmp_path


def _lines(ax):
    return {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}


def test_member_colours_follow_the_head_shape():
    colors = style.member_colors(["toy-k16v64", "toy-d64", "toy-d16", "toy-k64v16", "mystery"])
    assert style.member_order(colors) == ["toy-d16", "toy-d64", "toy-k64v16", "toy-k16v64", "mystery"]
    r, g, b, _ = colors["toy-d64"]
    assert b > r and b > g  # blue family
    r, g, b, _ = colors["toy-k64v16"]
    assert r > b  # orange
    r, g, b, _ = colors["toy-k16v64"]
    assert g > r and g > b  # green
    assert sum(colors["toy-d64"][:3]) < sum(colors["toy-d16"][:3])  # wider is darker
    assert style.shape("0.6b-k512v128") == style.Shape(512, 128) and style.shape("mystery") is None


def test_ruler_by_length_plots_the_seed_mean_per_member_and_length(results):
    fig = ruler_by_length.build(Results(results))
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == ["after cpt", "after cpt-frozen"]
    for ax, run in zip(axes, ("cpt", "cpt-frozen"), strict=True):
        lines = _lines(ax)
        assert set(lines) == set(MEMBERS)
        for m in MEMBERS:
            x, y = lines[m].get_data()
            assert list(x) == list(LENGTHS)
            # mean over the trained seeds of BASE + 10*seed + offset - 5*(length == 1024)
            mean = BASE[m] + 10 * np.mean(trained(m)) + RUN_OFFSET[run]
            assert list(y) == pytest.approx([mean, mean - 5])
        seeds = [c for c in ax.collections if c.get_label() == "_seeds:toy-d64"]
        assert len(seeds) == 1 and len(seeds[0].get_offsets()) == len(SEEDS) * len(LENGTHS)
        colors = style.member_colors(MEMBERS)
        assert lines["toy-k64v16"].get_color() == colors["toy-k64v16"]
    plt.close(fig)


def test_retrieval_heads_bars_are_seed_means_and_say_what_is_missing(results):
    fig = retrieval_heads.build(Results(results))
    for ax in fig.axes:
        bars = {c.get_label(): c for c in ax.containers if hasattr(c, "patches")}
        assert list(bars) == list(RUNS)
        for run, container in bars.items():
            heights = [p.get_height() for p in container.patches]
            expected = [np.nanmean([fraction(m, s, run) for s in trained(m)]) if m != "toy-d16" else 0.0
                        for m in MEMBERS]  # fmt: skip
            assert heights == pytest.approx(expected)
            assert [p.get_gid() for p in container.patches] == ["missing", "value", "value"]
        texts = " ".join(t.get_text() for t in ax.texts)
        assert "no kept needle sample" in texts and "toy-d16" in texts
        assert not [c for c in ax.collections if c.get_label().startswith("published")]  # toys: none published
    plt.close(fig)


def test_published_values_are_drawn_for_members_of_the_studys_scale(results):
    frame = pd.DataFrame([
        {"model": f"{m}-{r}", "member": m, "seed": 0, "run": r, "length": 4096, "layer_type": lt,
         "retrieval_heads": 1.0, "heads": 4.0, "fraction": 0.1, "n_kept": 3.0}
        for m in ("0.6b-d128", "0.6b-d512") for r in ("pt", "cpt") for lt in ("full", "all")
    ])  # fmt: skip
    folder = results / "scale"
    write_table(folder / "tables" / "study_heads.parquet", frame, TableMeta(table="study_heads"))
    fig = retrieval_heads.build(Results(folder))
    stars = [c for c in fig.axes[1].collections if c.get_label() == "published (the study)"]
    assert len(stars) == 1
    assert sorted(stars[0].get_offsets()[:, 1]) == pytest.approx([0.073, 0.25])
    assert not [c for c in fig.axes[0].collections if c.get_label() == "published (the study)"]  # full layers
    plt.close(fig)


def test_frozen_cpt_compares_trained_and_frozen_attention(results):
    fig = frozen_cpt.build(Results(results))
    bars = {c.get_label(): [p.get_height() for p in c.patches] for c in fig.axes[0].containers if hasattr(c, "patches")}
    for run in ("cpt", "cpt-frozen"):  # mean over the trained seeds and the lengths
        assert bars[run] == pytest.approx([BASE[m] + 10 * np.mean(trained(m)) + RUN_OFFSET[run] - 2.5 for m in MEMBERS])
    plt.close(fig)


def test_frozen_cpt_draws_the_score_before_cpt_when_it_was_measured(results):
    table = results / "tables" / "study_ruler.parquet"
    frame = read_table(table).frame
    before = [{"model": model(m, s, "pt"), "member": m, "seed": s, "run": "pt", "length": n,
               "score": ruler_score(m, s, "pt", n)} for m in MEMBERS for s in SEEDS for n in LENGTHS]  # fmt: skip
    write_table(table, pd.concat([frame, pd.DataFrame(before)], ignore_index=True), TableMeta(table="study_ruler"))
    fig = frozen_cpt.build(Results(results))
    bars = {c.get_label(): [p.get_height() for p in c.patches] for c in fig.axes[0].containers if hasattr(c, "patches")}
    assert list(bars) == ["pt", "cpt", "cpt-frozen"]
    for run in bars:
        assert bars[run] == pytest.approx([BASE[m] + 10 * np.mean(trained(m)) + RUN_OFFSET[run] - 2.5 for m in MEMBERS])
    plt.close(fig)


def test_loss_vs_retrieval_pairs_the_held_out_losses_with_the_same_runs_score(results):
    fig = loss_vs_retrieval.build(Results(results))
    for ax, sign in zip(fig.axes, (1, -1), strict=True):  # eval_loss, then eval_loss_retrieval (5 - eval_loss)
        points = {c.get_label(): c.get_offsets() for c in ax.collections}
        want: dict[str, list[tuple[float, float]]] = {}
        for m in MEMBERS:
            for s in SEEDS:  # the score: the cpt run's mean over lengths
                label = m if status(m, s) == "trained" else f"{m} (diverged)"
                x = eval_loss(m, s, "cpt") if sign > 0 else 5.0 - eval_loss(m, s, "cpt")
                want.setdefault(label, []).append((x, ruler_score(m, s, "cpt", 512) - 2.5))
        assert sorted(points) == sorted(want)
        for label, xy in want.items():
            assert np.allclose(sorted(map(tuple, points[label])), sorted(xy))
        # five trained runs (the diverged one left out); loss and score both rise with BASE and seed
        assert ax.get_title() == f"Spearman rho = {sign:.2f} over 5 trained runs"
        assert "held-out eval loss" in ax.get_xlabel() and "after cpt" in ax.get_xlabel()
    plt.close(fig)
    runs = read_table(results / "tables" / "study_runs.parquet").frame.drop(columns=["eval_loss"])
    write_table(results / "tables" / "study_runs.parquet", runs, TableMeta(table="study_runs"))
    with pytest.raises(MissingInput, match="held-out evaluation loss"):  # a study measured before issue 38
        loss_vs_retrieval.build(Results(results))


def test_effective_rank_lines_per_layer(results):
    fig = effective_rank.build(Results(results))
    assert [ax.get_title() for ax in fig.axes] == list(RUNS)
    x, y = _lines(fig.axes[0])["toy-d64"].get_data()
    assert list(x) == [-1, 0, 1] and list(y) == pytest.approx([30 + layer + 0.5 for layer in (-1, 0, 1)])
    plt.close(fig)


@pytest.mark.parametrize(
    ("module", "expected"),
    [(attention_entropy, [0.1, 0.2, 0.3, 0.4]), (token_reordering, [0.2, 0.2, 0.25, 0.25])],
)
def test_per_head_figures_plot_every_full_head(results, module, expected):
    fig = module.build(Results(results))
    ax = fig.axes[0]
    for m in MEMBERS:
        for r in RUNS:
            (points,) = [c for c in ax.collections if isinstance(c, PathCollection) and c.get_label() == f"{m}:{r}"]
            # 4 heads x the trained seeds, averaged over nothing else: each head's value once per seed
            assert sorted(points.get_offsets()[:, 1]) == pytest.approx(sorted(expected * len(trained(m))))
    plt.close(fig)


def test_probes_panel_per_task(results):
    fig = probes.build(Results(results))
    (ax,) = fig.axes
    x, y = _lines(ax)["toy-k64v16"].get_data()
    assert list(x) == [500, 1500] and list(y) == pytest.approx([40.0, 20.0])
    plt.close(fig)


def test_qk_vs_v_panels(results):
    fig = qk_vs_v.build(Results(results))
    ruler_ax, heads_ax = fig.axes
    heights = [p.get_height() for p in ruler_ax.patches]
    # after cpt, mean over the trained seeds and the lengths
    assert heights == pytest.approx([BASE[m] + 10 * np.mean(trained(m)) - 2.5 for m in MEMBERS])
    assert [t.get_text() for t in ruler_ax.get_xticklabels()] == ["d16", "d64", "k64v16"]
    heads = [p.get_height() for p in heads_ax.patches]
    assert np.isnan(heads[0]) and heads[1:] == pytest.approx([0.4375, 0.75])  # toy-k64v16: its trained seed 0 alone
    plt.close(fig)


def test_ruler_table_cells_are_mean_and_sd_over_seeds(results, tmp_path):
    table = ruler_table.build(Results(results))
    cells = table.cells.set_index(["run", "member"])
    # niah_single_1 (k = 0): mean over lengths of BASE + 10s + offset - 2.5, seeds 0 and 1 -> sd of (x, x + 10)
    assert cells.loc[("cpt", "toy-d64"), "niah_single_1"] == "32.5 ± 7.1"
    assert cells.loc[("cpt", "toy-d64"), "vt"] == "33.5 ± 7.1"
    assert cells.loc[("cpt-frozen", "toy-d16"), "overall"] == "5.0 ± 7.1"  # 10 + 5 - 8 - 2.5 + 0.5
    assert list(table.cells.member[:3]) == list(MEMBERS) and "published overall" not in table.cells
    paths = write(table, tmp_path / "t2")
    md, tex, csv = (p.read_text() for p in paths)
    assert "| cpt | toy-d64 | 32.5 ± 7.1 | 33.5 ± 7.1 |" in md.replace("| toy-d64 | cpt |", "| cpt | toy-d64 |")
    assert r"32.5 $\pm$ 7.1" in tex and r"\toprule" in tex and "cpt-frozen" in tex
    assert "niah\\_single\\_1" in latex(table)
    values = pd.read_csv(tmp_path / "t2.csv")
    row = values[(values.member == "toy-d64") & (values.run == "cpt") & (values.task == "niah_single_1")]
    assert row["mean"].item() == pytest.approx(32.5) and row["std"].item() == pytest.approx(math.sqrt(50))
    assert csv.startswith("member,run,task,mean,std,count")


def test_retrieval_heads_table_counts_and_fractions(results):
    table = retrieval_heads_table.build(Results(results))
    cells = table.cells.set_index(["member", "layer_type"])
    # toy-d64 after cpt: fractions 0.5 and 0.375 -> 0.4375 (43.8%), counts 4 and 3 -> 3.5
    assert cells.loc[("toy-d64", "full"), "cpt"] == "3.5 ± 0.7 (43.8 ± 8.8%)"
    assert cells.loc[("toy-d16", "full"), "pt"] == "n/a"
    assert list(table.cells.columns) == ["member", "layer_type", *RUNS]


def test_short_context_table(results):
    table = short_context.build(Results(results))
    row = table.cells.set_index("member").loc["toy-d16"]
    assert row["arc acc"] == "31.2 ± 8.8" and row["arc acc_norm"] == "37.5 ± 8.8"  # 25 and 37.5; +6.25


MODEL_FIGURES = {
    "model_retrieval_heads", "model_layers", "needle_margin", "head_agreement", "retrieval_steps", "model_ruler",
    "ablation", "definition_ablation", "graft"
}  # fmt: skip


def test_a_missing_table_is_skipped_and_said(results, tmp_path):
    (results / "tables" / "study_heads.parquet").unlink()
    report = figures.draw(results, tmp_path / "figs", figures.SPECS)
    assert set(report.skipped) == {"retrieval_heads", "retrieval_heads_table"}
    assert "study_heads" in report.skipped["retrieval_heads"]
    # the per-model figures draw no study run (its entropy, erank and RULER tables are the study's): a study
    # folder is not their kind, so they are left out, not reported as skipped
    assert {s.name for s in figures.MODEL_SPECS} == set(report.absent) == MODEL_FIGURES
    assert "no model's own results" in report.absent["model_layers"]
    with pytest.raises(MissingInput, match="belongs to a run of the study"):
        Results(results).models("entropy")
    assert (tmp_path / "figs" / "ruler_by_length.png").stat().st_size > 1000
    assert {p.suffix for p in report.drawn["ruler_table"]} == {".md", ".tex", ".csv"}
    with pytest.raises(MissingInput):
        retrieval_heads.build(Results(results))


def test_figures_command(results, tmp_path):
    (results / "tables" / "study_heads.parquet").unlink()
    out = CliRunner().invoke(app, ["figures", str(results), "--out", str(tmp_path / "f"), "--format", "png,svg"])
    assert out.exit_code == 0, out.output
    assert "skipped retrieval_heads" in out.output and "study_heads" in out.output
    assert (tmp_path / "f" / "qk_vs_v.svg").read_text().lstrip().startswith("<?xml")
    empty = tmp_path / "empty"
    empty.mkdir()
    out = CliRunner().invoke(app, ["figures", str(empty), "--out", str(tmp_path / "g")])
    assert out.exit_code != 0 and "nothing to draw" in out.output
    out = CliRunner().invoke(app, ["figures", str(tmp_path / "nowhere")])
    assert out.exit_code != 0 and "does not exist" in out.output
    out = CliRunner().invoke(app, ["figures", str(results), "--only", "nonesuch"])
    assert out.exit_code != 0 and "ruler_by_length" in out.output


def test_the_report_embeds_every_figure_and_table_and_loads_nothing_from_elsewhere(results):
    import base64
    import html
    import re

    from figures.report import report_page

    (results / "tables" / "study_shortctx.parquet").unlink()
    page = report_page(results, figures.SPECS)
    assert page.skipped.keys() == {"short_context"} and "study_shortctx" in page.skipped["short_context"]
    assert page.shown == [s.name for s in figures.STUDY_SPECS if s.name != "short_context"]
    assert set(page.absent) == MODEL_FIGURES and "Not drawn" in page.html  # only short_context is said not drawn
    assert "model_layers" not in page.html
    images = re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,([^"]+)"', page.html)
    shown_figures = [s for s in figures.SPECS if s.name in page.shown and s.kind == "figure"]
    assert [alt for alt, _ in images] == [html.escape(s.title) for s in shown_figures]
    assert all(base64.b64decode(data).startswith(b"\x89PNG\r\n\x1a\n") for _, data in images)
    for spec in figures.SPECS:
        assert (html.escape(spec.title) in page.html) == (spec.name in page.shown)
    assert "<td>32.5 ± 7.1</td>" in page.html  # the RULER table's cell, as test_ruler_table_cells checks it
    assert not re.search(r'(?:src|href)="(?!data:|#)', page.html) and "http" not in page.html  # self-contained
    assert "Toy scale" in page.html and "2 seeds (0, 1)" in page.html and "Not drawn" in page.html


def test_report_command(results, tmp_path):
    out = CliRunner().invoke(app, ["report", str(results), "--out", str(tmp_path / "r.html")])
    assert out.exit_code == 0, out.output
    assert f"report: {tmp_path / 'r.html'} ({len(figures.STUDY_SPECS)} figures and tables)" in out.output
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    empty = tmp_path / "empty"
    empty.mkdir()
    out = CliRunner().invoke(app, ["report", str(empty), "--out", str(tmp_path / "e.html")])
    assert out.exit_code != 0 and "nothing to report" in out.output and not (tmp_path / "e.html").exists()
    out = CliRunner().invoke(app, ["report", str(results), "--out", str(empty)])
    assert out.exit_code != 0 and "is a folder" in out.output


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
@pytest.mark.parametrize("folder", ["results", "analyzed"])  # a study's, and one of `headprobe analyze`
def test_the_report_opens_in_a_browser_without_errors_and_every_image_loads(folder, request, tmp_path):
    from figures.report import write_report

    playwright = pytest.importorskip("playwright.sync_api", reason="needs playwright (the dev extra)")
    shown = write_report(request.getfixturevalue(folder), tmp_path / "r.html", figures.SPECS).shown
    expected = figures.STUDY_SPECS if folder == "results" else figures.MODEL_SPECS[:2]
    assert shown == [s.name for s in expected]
    flags = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync"]  # fmt: skip
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=flags)
        try:
            page, errors, requests = browser.new_page(), [], []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto((tmp_path / "r.html").as_uri())
            loaded = page.evaluate("Array.from(document.images).map(i => i.complete && i.naturalWidth > 0)")
            headings = page.evaluate("Array.from(document.querySelectorAll('h2')).map(h => h.id)")
        finally:
            browser.close()
    assert not errors, errors
    assert len(loaded) == sum(s.kind == "figure" for s in expected) and all(loaded)
    assert headings[0] == "caveats" and headings[-1] == "settings" and set(shown) <= set(headings)
    assert all(u.startswith(("file:", "data:")) for u in requests), requests  # nothing from the network


def test_the_docs_gallery_shows_every_figure_it_drew_and_every_table_inline(results, tmp_path):
    from figures.gallery import main

    (results / "tables" / "study_heads.parquet").unlink()
    skipped = {"retrieval_heads", "retrieval_heads_table"} | MODEL_FIGURES  # as test_a_missing_table_... finds
    main([str(results), "--docs", str(tmp_path / "docs"), "--command", "pytest fixture"])
    page = (tmp_path / "docs" / "figures.md").read_text()
    titles = [line[3:] for line in page.splitlines() if line.startswith("## ")]
    assert titles == [s.title for s in figures.SPECS if s.name not in skipped] + ["Not drawn"]
    for spec in figures.SPECS:
        drawn = spec.kind == "figure" and spec.name not in skipped
        image = tmp_path / "docs" / "img" / f"{spec.name}.png"
        assert image.is_file() == drawn and (f"](img/{spec.name}.png)" in page) == drawn
        assert (f"*{spec.how_to_read}*" in page) == (spec.name not in skipped)
    assert "| 32.5 ± 7.1 |" in page and "`retrieval_heads`: no 'study_heads' table" in page and "pytest fixture" in page


# ---- per-model figures: any model's analyze / ruler eval / ablation results, no study around them ----

ALPHA_HEADS = {0: ("sliding", 2), 1: ("full", 3), 2: ("full", 3)}  # layer -> type, heads (layer 0 has fewer)
ALPHA_KEPT = {512: 2, 1024: 1}  # kept needle samples per length, of 4 each


def alpha_score(length: int, layer: int, head: int) -> float:
    return 0.1 * layer + 0.05 * head if length == 512 else 0.4 - 0.1 * layer + 0.2 * head


def alpha_pooled(layer: int, head: int) -> float:
    """The score over every kept sample: each length's score weighted by its kept samples."""
    return sum(ALPHA_KEPT[n] * alpha_score(n, layer, head) for n in ALPHA_KEPT) / sum(ALPHA_KEPT.values())


def _model_table(folder, model_name, table, rows, with_model=True):
    frame = pd.DataFrame(rows)
    if not with_model:  # as analyze's retrieval table was written for a while: the model only in the metadata
        frame = frame.drop(columns=["model"])
    meta = TableMeta(
        table=table,
        model=model_name,
        command=["headprobe", "analyze", f"ckpt/{model_name}"],
        settings={"lengths": sorted({r.get("length") for r in rows if r.get("length") is not None})},
    )
    write_table(folder / model_name / f"{table}.parquet", frame, meta)  # fmt: skip


@pytest.fixture()
def analyzed(tmp_path):
    """What `headprobe analyze --metrics retrieval,entropy,erank` writes for two models: alpha (a sliding
    layer with fewer heads, two lengths) and beta (answered no needle sample: no score)."""
    out = tmp_path / "analyzed"
    _model_table(out, "alpha", "retrieval", [
        {"model": "alpha", "layer": layer, "head": h, "layer_type": kind, "value": alpha_score(n, layer, h),
         "n_kept": ALPHA_KEPT[n], "n_samples": 4, "length": n}
        for n in ALPHA_KEPT for layer, (kind, heads) in ALPHA_HEADS.items() for h in range(heads)
    ], with_model=False)  # fmt: skip
    _model_table(out, "beta", "retrieval", [
        {"model": "beta", "layer": layer, "head": h, "layer_type": "full", "value": math.nan, "n_kept": 0,
         "n_samples": 5, "length": 512}
        for layer in range(2) for h in range(2)
    ])  # fmt: skip
    _model_table(out, "alpha", "entropy", [
        {"model": "alpha", "layer": layer, "head": h, "layer_type": kind, "value": 1.0,
         "norm_value": 0.2 * layer + 0.1 * h + 0.05 * s, "max_prob": 0.5, "mean_distance": 3.0, "length": 512,
         "sample": s}
        for layer, (kind, heads) in ALPHA_HEADS.items() for h in range(heads) for s in range(2)
    ])  # fmt: skip
    _model_table(out, "beta", "entropy", [
        {"model": "beta", "layer": layer, "head": h, "layer_type": "full", "value": 1.0, "norm_value": 0.9,
         "max_prob": 0.5, "mean_distance": 3.0, "length": 512, "sample": 0}
        for layer in range(2) for h in range(2)
    ])  # fmt: skip
    _model_table(out, "alpha", "erank", [
        {"model": "alpha", "layer": layer, "site": "embed" if layer < 0 else "block_out",
         "layer_type": "embedding" if layer < 0 else ALPHA_HEADS[layer][0], "value": 10.0 + layer, "centered": 1.0,
         "tokens": 100, "length": 512, "samples": 2}
        for layer in (-1, 0, 1, 2)
    ])  # fmt: skip
    return out


def _image(fig, gid):
    (image,) = [im for ax in fig.axes for im in ax.get_images() if im.get_gid() == gid]
    return image


def test_retrieval_heatmap_holds_each_heads_pooled_score_and_masks_what_has_none(analyzed):
    from figures import model_retrieval_heads

    fig = model_retrieval_heads.build(Results(analyzed))
    scores = _image(fig, "scores:alpha").get_array()
    assert scores.shape == (3, 3)  # 3 layers x the widest layer's 3 heads
    for layer, (_, heads) in ALPHA_HEADS.items():
        for h in range(heads):
            assert not scores.mask[layer, h] and scores[layer, h] == pytest.approx(alpha_pooled(layer, h))
    assert scores[1, 2] == pytest.approx((2 * 0.2 + 0.7) / 3)  # by hand: 0.2 at 512 (2 kept), 0.7 at 1024 (1 kept)
    assert scores.mask[0, 2]  # layer 0 has two heads: a blank cell ...
    assert not _image(fig, "no-score:alpha").get_array()[..., 3].any()  # ... not a grey one
    beta = _image(fig, "scores:beta").get_array()
    assert beta.shape == (2, 2) and beta.mask.all()  # no sample kept: no score anywhere ...
    assert _image(fig, "no-score:beta").get_array()[..., 3].all()  # ... and every head grey
    titles = {ax.get_title().split("\n")[0]: ax.get_title() for ax in fig.axes if ax.get_title()}
    hits = sum(alpha_pooled(layer, h) >= 0.1 for layer, (_, n) in ALPHA_HEADS.items() for h in range(n))
    assert "kept 3 of 8 needle samples" in titles["alpha"] and f"{hits} of 8 heads ≥ 0.1" in titles["alpha"]
    assert "512, 1K tokens" in titles["alpha"]
    assert "no needle sample answered (0 of 5)" in titles["beta"] and "grey" in titles["beta"]
    strip = next(ax for ax in fig.axes if any(im.get_gid() == "layer-types:alpha" for im in ax.get_images()))
    assert [t.get_text() for t in strip.texts] == ["S", "F", "F"]
    (rings,) = [c for ax in fig.axes for c in ax.collections if c.get_label() == "_retrieval heads:alpha"]
    assert sorted(map(tuple, rings.get_offsets().astype(int))) == sorted(
        (h, layer) for layer, (_, n) in ALPHA_HEADS.items() for h in range(n) if alpha_pooled(layer, h) >= 0.1
    )
    legend = " ".join(t.get_text() for t in fig.legends[0].get_texts()) + fig.legends[0].get_title().get_text()
    assert "no score (no sample kept)" in legend and "no such head" in legend and "S = sliding window" in legend
    plt.close(fig)


def test_a_thirty_layer_nine_head_model_gets_every_layer_labelled(tmp_path):
    from figures import model_retrieval_heads

    _model_table(tmp_path, "smol", "retrieval", [
        {"model": "smol", "layer": layer, "head": h, "layer_type": "full", "value": (layer * 9 + h) / 270,
         "n_kept": 3, "n_samples": 10, "length": 1024}
        for layer in range(30) for h in range(9)
    ])  # fmt: skip
    style.apply()
    fig = model_retrieval_heads.build(Results(tmp_path))
    image = _image(fig, "scores:smol")
    assert image.get_array()[17, 3] == pytest.approx((17 * 9 + 3) / 270)
    strip = next(ax for ax in fig.axes if ax.get_ylabel() == "layer")
    assert [t for t in strip.get_yticks()] == list(range(30))  # every layer named
    width, height = fig.get_size_inches()
    assert height / 30 >= 0.12 and width <= 4.5  # rows tall enough for a 6 pt label, one column wide
    plt.close(fig)


def test_entropy_and_effective_rank_by_layer(analyzed):
    from figures import model_layers

    fig = model_layers.build(Results(analyzed))
    entropy, erank = fig.axes
    x, y = _lines(entropy)["alpha:512"].get_data()
    # per head the mean over samples 0 and 1 (+0.025), then the mean over the layer's heads (0.05 / 0.1)
    assert list(x) == [0, 1, 2] and list(y) == pytest.approx([0.075, 0.325, 0.525])
    assert list(_lines(entropy)["beta:512"].get_data()[1]) == pytest.approx([0.9, 0.9])
    x, y = _lines(erank)["alpha:512"].get_data()
    assert list(x) == [-1, 0, 1, 2] and list(y) == pytest.approx([9.0, 10.0, 11.0, 12.0])
    assert "beta:512" not in _lines(erank)  # beta has no erank table
    assert erank.get_xticklabels()[0].get_text() == "emb"
    (open_points,) = [c for c in entropy.collections if c.get_label() == "_other:alpha:512"]
    assert list(open_points.get_offsets()[:, 0]) == [0]  # layer 0 is the sliding one: drawn open
    (heads,) = [c for c in entropy.collections if c.get_label() == "_heads:alpha:512"]
    assert len(heads.get_offsets()) == 8  # every head a dot
    plt.close(fig)


def test_the_ruler_grid_holds_each_score_and_marks_a_partial_mean(tmp_path):
    from figures import model_ruler

    rows = [("task", "niah_single_1", 1024, 80.0, 4, None), ("task", "niah_single_1", 2048, 40.0, 4, None),
            ("task", "vt", 1024, 60.0, 4, None), ("length", None, 1024, 70.0, 2, 2), ("length", None, 2048, 40.0, 1, 2),
            ("overall", None, None, 55.0, 2, None)]  # fmt: skip
    frame = pd.DataFrame(rows, columns=["scope", "task", "length", "score", "n", "n_tasks"]).assign(model="gamma")
    frame = frame.assign(length=frame.length.astype("Int64"), n_tasks=frame.n_tasks.astype("Int64"), fit="ruler")
    write_table(tmp_path / "gamma" / "ruler_scores.parquet", frame, TableMeta(table="ruler_scores", model="gamma"))
    fig = model_ruler.build(Results(tmp_path))
    grid = _image(fig, "scores:gamma").get_array()
    assert grid.shape == (3, 2) and grid[0].tolist() == [80.0, 40.0] and grid[2].tolist() == [70.0, 40.0]
    assert grid[1, 0] == 60.0 and grid.mask[1, 1]  # vt was not evaluated at 2K
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["niah_single_1", "vt", "mean over tasks"]
    texts = [t.get_text() for t in ax.texts]
    assert "40.0*" in texts and "70.0" in texts and "–" in texts and "4 samples per cell" in ax.get_title()
    assert "*: mean over the tasks scored there" in fig.get_supxlabel()
    plt.close(fig)


def test_the_ruler_grid_from_samples_alone_is_the_mean_of_sample_scores(tmp_path):
    from figures import model_ruler

    scores = {("niah_single_1", 1024): [100.0, 0.0, 100.0, 100.0], ("qa_1", 1024): [50.0, 0.0]}
    rows = [{"model": "gamma", "task": t, "length": n, "sample": i, "pred": "x", "outputs": ["x"], "score": v,
             "token_count": n - 50, "fit": "ruler", "fill": 0.9, "source": "builtin", "haystack": "essay"}
            for (t, n), values in scores.items() for i, v in enumerate(values)]  # fmt: skip
    write_table(tmp_path / "gamma" / "ruler_samples.parquet", pd.DataFrame(rows), TableMeta(table="ruler_samples"))
    fig = model_ruler.build(Results(tmp_path))
    grid = _image(fig, "scores:gamma").get_array()
    assert grid[:, 0].tolist() == pytest.approx([75.0, 25.0, 50.0])  # each task's mean, then their mean
    assert "2-4 samples per cell" in fig.axes[0].get_title()
    plt.close(fig)


# an ablation run's cells: (condition, n_heads, seed, task, length, depth) -> (accuracy, n)
ABLATION = {
    ("baseline", 0, -1, "needle", 1024, 25.0): (1.0, 4), ("baseline", 0, -1, "needle", 1024, 75.0): (0.5, 2),
    ("baseline", 0, -1, "needle", 2048, 25.0): (0.75, 4), ("baseline", 0, -1, "needle", 2048, 75.0): (0.25, 2),
    ("top", 2, -1, "needle", 1024, 25.0): (0.25, 4), ("top", 2, -1, "needle", 1024, 75.0): (0.0, 2),
    ("top", 2, -1, "needle", 2048, 25.0): (0.0, 4), ("top", 2, -1, "needle", 2048, 75.0): (0.5, 2),
    ("baseline", 0, -1, "niah_single_1", 1024, math.nan): (0.9, 10),
    ("top", 2, -1, "niah_single_1", 1024, math.nan): (0.3, 10),
}  # fmt: skip
RANDOM = {0: (0.75, 1.0), 1: (1.0, 0.0), 2: (0.5, 0.5)}  # seed -> accuracy at depth 25 (n 4) and 75 (n 2)
for _seed, (_a, _b) in RANDOM.items():
    for _length, _shift in ((1024, 0.0), (2048, -0.25)):
        ABLATION[("random", 2, _seed, "needle", _length, 25.0)] = (_a + _shift, 4)
        ABLATION[("random", 2, _seed, "needle", _length, 75.0)] = (_b, 2)


@pytest.fixture()
def ablated(tmp_path):
    rows = [
        {"model": "delta", "condition": c, "mode": "none" if c == "baseline" else "zero",
         "heads": {"baseline": "", "top": "1.0,2.1"}.get(c, f"0.{seed + 1},1.1"), "n_heads": k, "seed": seed,
         "task": task, "length": length, "depth": depth, "accuracy": acc, "n": n}
        for (c, k, seed, task, length, depth), (acc, n) in ABLATION.items()
    ]  # fmt: skip
    out = tmp_path / "ablated"
    write_table(out / "delta" / "ablation.parquet", pd.DataFrame(rows), TableMeta(table="ablation", model="delta"))
    return out


def test_ablation_lines_are_n_weighted_over_depths_and_random_spans_its_seeds(ablated):
    from figures import ablation

    fig = ablation.build(Results(ablated))
    axes = {ax.get_gid(): ax for ax in fig.axes if ax.get_gid()}
    assert set(axes) == {"delta:needle", "delta:niah_single_1"}
    lines = _lines(axes["delta:needle"])
    x, y = lines["baseline (nothing ablated)"].get_data()
    assert list(np.log2(x)) == pytest.approx([10, 11], abs=0.3)  # at its length, dodged a little to the side
    assert list(y) == pytest.approx([(4 * 1.0 + 2 * 0.5) / 6, (4 * 0.75 + 2 * 0.25) / 6])
    xs = [line.get_data()[0][0] for line in lines.values()]
    assert len(set(xs)) == len(xs)  # no series hides another at one length
    assert list(lines["top 2 (zero)"].get_data()[1]) == pytest.approx([(4 * 0.25 + 0) / 6, (0 + 2 * 0.5) / 6])
    per_seed = {n: [(4 * (a + s) + 2 * b) / 6 for a, b in RANDOM.values()] for n, s in ((1024, 0.0), (2048, -0.25))}
    mean = lines["random 2 (zero): mean, min-max over 3 seeds"].get_data()[1]
    assert list(mean) == pytest.approx([np.mean(per_seed[1024]), np.mean(per_seed[2048])])
    (ranges,) = [c for c in axes["delta:needle"].collections if c.get_label() == "_range:random 2 (zero)"]
    for segment, n in zip(ranges.get_segments(), (1024, 2048), strict=True):
        assert sorted(segment[:, 1]) == pytest.approx([min(per_seed[n]), max(per_seed[n])])
    (band,) = [c for c in axes["delta:needle"].collections if c.get_label() == "_band:random 2 (zero)"]
    ys = band.get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(min(per_seed[2048])) and ys.max() == pytest.approx(max(per_seed[1024]))
    (seeds,) = [c for c in axes["delta:needle"].collections if c.get_label() == "_seeds:random 2 (zero)"]
    assert sorted(seeds.get_offsets()[:, 1]) == pytest.approx(sorted(per_seed[1024] + per_seed[2048]))
    assert axes["delta:needle"].get_title() == "needle\n6 prompts per point"  # 4 + 2 over the depths
    assert axes["delta:niah_single_1"].get_title() == "niah_single_1\n10 prompts per point"
    one = _lines(axes["delta:niah_single_1"])  # no depth: one cell per length
    assert list(one["baseline (nothing ablated)"].get_data()[1]) == pytest.approx([0.9])
    assert list(one["top 2 (zero)"].get_data()[1]) == pytest.approx([0.3])
    assert "delta" in fig.get_suptitle() and "mean-ablated" not in fig.get_suptitle()
    plt.close(fig)


@pytest.fixture()
def ruled(tmp_path):
    """What `headprobe ruler eval` writes for one model (its scores table alone)."""
    rows = [{"model": "gamma", "scope": "task", "task": "vt", "length": 1024, "score": 50.0, "n": 2, "fit": "ruler"}]
    out = tmp_path / "ruled"
    write_table(out / "gamma" / "ruler_scores.parquet", pd.DataFrame(rows), TableMeta(table="ruler_scores"))
    return out


@pytest.mark.parametrize(
    ("folder", "drawn"),
    [("analyzed", {"model_retrieval_heads", "model_layers"}), ("ruled", {"model_ruler"}), ("ablated", {"ablation"})],
)
def test_a_models_folder_draws_the_per_model_figures_its_tables_allow(folder, drawn, request, tmp_path):
    report = figures.draw(request.getfixturevalue(folder), tmp_path / "figs", figures.SPECS)
    assert set(report.drawn) == drawn
    assert set(report.skipped) == MODEL_FIGURES - drawn  # each says which table it lacks
    assert all("no 'ablation' table" in report.skipped[n] for n in report.skipped if n == "ablation")
    assert set(report.absent) == {s.name for s in figures.STUDY_SPECS}  # not a study: its figures left out
    assert all("not a study's results folder" in why for why in report.absent.values())
    for name in drawn:
        assert (tmp_path / "figs" / f"{name}.png").stat().st_size > 5000


def test_the_per_model_figures_draw_a_model_beside_a_study_but_not_its_runs(results):
    from figures import model_layers

    _model_table(results / "analysis", "mine", "entropy", [
        {"model": "mine", "layer": 0, "head": h, "layer_type": "full", "value": 1.0, "norm_value": 0.5 + 0.25 * h,
         "max_prob": 0.5, "mean_distance": 3.0, "length": 512, "sample": 0}
        for h in range(2)
    ])  # fmt: skip
    fig = model_layers.build(Results(results))
    assert set(_lines(fig.axes[0])) == {"mine:512"}  # the study's 18 runs are the study figures' business
    assert list(_lines(fig.axes[0])["mine:512"].get_data()[1]) == pytest.approx([0.625])
    plt.close(fig)
    report = figures.draw(results, results / "figs", figures.SPECS)
    assert "model_layers" in report.drawn and "attention_entropy" in report.drawn  # both kinds, one folder


def test_figures_command_on_an_analyze_folder_and_on_nothing(analyzed, tmp_path):
    out = CliRunner().invoke(app, ["figures", str(analyzed), "--out", str(tmp_path / "f")])
    assert out.exit_code == 0, out.output
    assert "drew model_retrieval_heads" in out.output and "drew model_layers" in out.output
    assert (tmp_path / "f" / "model_retrieval_heads.png").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    for command, verb in (("figures", "draw"), ("report", "report")):
        out = CliRunner().invoke(app, [command, str(empty), "--out", str(tmp_path / "g" / "x.html")])
        said = " ".join(out.output.split())  # the message wraps
        assert out.exit_code != 0 and f"nothing to {verb} from" in said
        for looked_for in ("study_ruler", "retrieval", "entropy", "ruler_scores", "ablation", "`headprobe analyze`"):
            assert looked_for in said


def test_the_report_of_an_analyze_folder(analyzed):
    from figures.report import report_page

    page = report_page(analyzed, figures.SPECS)
    assert page.shown == ["model_retrieval_heads", "model_layers"]
    assert "beta answered none of its 5 needle samples" in page.html
    assert "Toy scale" not in page.html and "published" not in page.html
    assert "ckpt/alpha" in page.html and "alpha/retrieval.parquet" in page.html  # the settings that made them


def test_the_docs_gallery_draws_the_per_model_figures_from_another_folder(results, analyzed, tmp_path):
    from figures.gallery import main

    main([str(results), "--docs", str(tmp_path / "docs"), "--also", str(analyzed), "--also-command", "analyze x"])
    page = (tmp_path / "docs" / "figures.md").read_text()
    titles = [line[3:] for line in page.splitlines() if line.startswith("## ")]
    elsewhere = {"model_ruler", "needle_margin", "head_agreement", "retrieval_steps", "ablation", "definition_ablation"}
    drawn = [s.title for s in figures.SPECS if s.name not in elsewhere | {"graft"}]
    assert titles == [*drawn, "Not drawn"] and "here from analyze x." in page
    assert (tmp_path / "docs" / "img" / "model_retrieval_heads.png").is_file()
    assert "Reads `retrieval` (headprobe analyze)." in page and "Reads `study_heads` (headprobe study)" in page
    # the last folder tried says why, and the page says what the figure would show and what it reads
    ablation = next(s for s in figures.SPECS if s.name == "ablation")
    why = f"no 'ablation' table under {analyzed}"
    assert f"- `ablation`: {why}. {ablation.title}: {ablation.how_to_read} Reads `ablation` (headprobe ablate)." in page


def test_a_diverged_run_is_in_no_study_figure_and_every_one_says_so(results):
    data = Results(results)
    assert data.diverged().values.tolist() == [["toy-k64v16", 1, r] for r in RUNS]
    kept = data.table("study_ruler")
    assert not ((kept.member == "toy-k64v16") & (kept.seed == 1)).any() and len(kept) == 5 * 2 * 2  # 6 runs - 1
    assert len(data.table("study_ruler", keep_diverged=True)) == 6 * 2 * 2  # loss_vs_retrieval draws it as a cross
    skipped: dict[str, str] = {}
    specs = [s for s in figures.STUDY_SPECS if s.kind == "figure"]
    made = dict(built(data, specs, skipped))
    assert made and not skipped
    for name, fig in made.items():
        notes = [t.get_text() for t in fig.texts if t.get_text().startswith("diverged")]
        assert notes == ["diverged (no architecture's score): toy-k64v16 seed 1: pt, cpt, cpt-frozen"], name
        plt.close(fig)


def test_needle_margin_draws_each_models_top_heads_by_mass_against_length(tmp_path):
    from figures import needle_margin

    # gamma: head (1, 0) has the most mass at both lengths, (0, 1) the next, (1, 1) the third, (0, 0) the least;
    # two samples each, so the lines are means over samples: (1, 0) at 512 is (0.8 + 0.6) / 2
    mass = {(0, 0): 0.01, (0, 1): 0.3, (1, 0): 0.7, (1, 1): 0.2}
    _model_table(tmp_path, "gamma", "needle_margin", [
        {"model": "gamma", "layer": layer, "head": h, "layer_type": "full" if layer else "sliding", "sample": s,
         "depth": 50.0, "answer_steps": 4, "seen": 1.0, "length": n,
         "mass": mass[layer, h] / (1 if n == 512 else 2) + ((0.1 if s == 0 else -0.1) if (layer, h) == (1, 0) else 0),
         "margin": 3.0 - n / 512 + s, "rank": 1.0}
        for n in (512, 2048) for (layer, h) in mass for s in (0, 1)
    ])  # fmt: skip
    fig = needle_margin.build(Results(tmp_path))
    left, right = fig.axes
    lines = _lines(left)
    assert list(lines) == ["gamma L1H0", "gamma L0H1", "gamma L1H1"]  # the top three by mass, most first
    x, y = lines["gamma L1H0"].get_data()
    assert list(x) == [512, 2048] and list(y) == pytest.approx([0.7, 0.35])
    assert [line.get_linestyle() for line in lines.values()] == ["-", "--", ":"]
    x, y = _lines(right)["gamma L0H1"].get_data()
    assert list(y) == pytest.approx([2.5, -0.5])  # 3 - n/512 + the mean of samples 0 and 1
    assert left.get_xscale() == "log" and [t.get_text() for t in left.get_xticklabels()] == ["512", "2K"]
    plt.close(fig)
    one = tmp_path / "one"
    _model_table(one, "gamma", "needle_margin", [
        {"model": "gamma", "layer": 0, "head": 0, "layer_type": "full", "sample": 0, "depth": 50.0,
         "answer_steps": 4, "seen": 1.0, "length": 512, "mass": 0.5, "margin": 1.0, "rank": 1.0}
    ])  # fmt: skip
    with pytest.raises(MissingInput, match="one length"):
        needle_margin.build(Results(one))


def test_graft_shares_each_part_sets_gain_of_the_donors_and_leaves_out_a_gain_too_small_to_share(tmp_path):
    from figures import graft

    # base -> donor gains: needle_prefix 0.2 -> 0.6 (+0.4); eval_loss 9 -> 8 (-1); needle_accuracy 0 -> 0.02 (too
    # small to share). mlp brings 0.3 of the needle (share 0.25) and 8.5 of the loss (0.5); attn 0.5 (0.75) and 9.2
    values = {"none": (0.2, 9.0, 0.0), "mlp": (0.3, 8.5, 0.0), "attn": (0.5, 9.2, 0.01), "all": (0.6, 8.0, 0.02)}
    _model_table(tmp_path, "b", "graft", [
        {"model": "b", "base": "b", "donor": "d", "parts": parts, "n_parameters": 1, "metric": metric,
         "length": length, "value": value[i], "n": 16}
        for parts, value in values.items()
        for i, (metric, length) in enumerate([("needle_prefix", 1024), ("eval_loss", 0), ("needle_accuracy", 1024)])
    ])  # fmt: skip
    table = graft.shares(Results(tmp_path).models("graft")).set_index(["metric", "parts"])["share"]
    assert table["needle_prefix", "mlp"] == pytest.approx(0.25) and table["needle_prefix", "attn"] == pytest.approx(
        0.75
    )
    assert table["eval_loss", "mlp"] == pytest.approx(0.5) and table["eval_loss", "attn"] == pytest.approx(-0.2)
    assert "needle_accuracy" not in table.index.get_level_values(0)
    fig = graft.build(Results(tmp_path))
    assert len(fig.axes) == 2 and "at 1,024 tokens: 1 base → donor pair" in fig.axes[0].get_title(loc="left")
    (dots,) = [c for c in fig.axes[1].collections if c.get_label() == "b → d"]
    assert sorted(dots.get_offsets()[:, 1]) == pytest.approx([-0.2, 0.5])  # the held-out loss panel
    assert [t.get_text() for t in fig.axes[1].get_xticklabels()] == ["mlp", "attn"]
    plt.close(fig)


def test_retrieval_steps_draws_each_heads_score_over_steps_beside_the_counts_and_the_runs_probes(tmp_path):
    from figures import retrieval_steps

    # run r (two layers of two heads) at steps 100 and 200, at 512 and 1024 tokens; head (1, 0) grows from 0.1 to 0.9
    # at 512. The run's metrics.jsonl (beside its step folders) logs task probes at steps 100 and 200 only.
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"step": 50, "loss": 3.0},
        {"step": 100, "loss": 2.0, "probe/needle@500": 0.25, "probe/list@300": 0.5, "probe_loss/list@300": 9.0},
        {"step": 200, "loss": 1.0, "probe/needle@500": 0.75, "probe/list@300": 1.0}]))  # fmt: skip
    score = lambda n, step, layer, h: (0.1 + 0.8 * (step == 200)) if (layer, h, n) == (1, 0, 512) else 0.05 * h  # noqa: E731
    out = tmp_path / "analysis"
    for step in (100, 200):
        name = f"r-step_{step:06d}"
        meta = dict(model=name, checkpoint=str(run / f"step_{step:06d}"))
        rows = [{"model": name, "step": step, "tokens": step * 10, "layer": layer, "head": h, "layer_type": "full",
                 "forced_mass": score(n, step, layer, h), "forced_value": 0.0, "value": float("nan"), "length": n}
                for n in (512, 1024) for layer in (0, 1) for h in (0, 1)]  # fmt: skip
        write_table(out / name / "retrieval.parquet", pd.DataFrame(rows), TableMeta(table="retrieval", **meta))
        summary = [{"model": name, "step": step, "tokens": step * 10, "metric": "retrieval", "length": n,
                    "layer_type": kind, "layer": None, "statistic": stat, "value": float(step // 100 + (n == 1024))}
                   for n in (512, 1024) for kind in ("all", "full") for stat in retrieval_steps.COUNTS]  # fmt: skip
        write_table(out / name / "analysis_summary.parquet", pd.DataFrame(summary),
                    TableMeta(table="analysis_summary", **meta))  # fmt: skip
    fig = retrieval_steps.build(Results(out))
    grid, counts, probes, bar = fig.axes
    image = grid.get_images()[0].get_array()
    assert np.allclose(image, [[0.0, 0.0], [0.05, 0.05], [0.1, 0.9], [0.05, 0.05]])  # heads x steps
    assert [t.get_text() for t in grid.get_yticklabels()] == ["L0H0", "L0H1", "L1H0", "L1H1"]
    assert [t.get_text() for t in grid.get_xticklabels()] == ["100", "200"]
    lines = _lines(counts)
    x, y = lines["retrieval heads (answer forced)"].get_data()
    assert list(x) == [100, 200] and list(y) == [1.0, 2.0]  # the 'all' rows, not the 'full' ones
    assert len(lines) == 3  # the counts at the heatmap's length, 512, only
    x, y = _lines(probes)["needle@500"].get_data()  # each task probe's accuracy, at the steps that logged it
    assert list(x) == [100, 200] and list(y) == [0.25, 0.75]
    assert list(_lines(probes)["list@300"].get_data()[1]) == [0.5, 1] and len(_lines(probes)) == 2  # no probe loss
    assert bar.get_ylabel() == "attention mass on the needle"
    plt.close(fig)
    (run / "metrics.jsonl").unlink()
    fig = retrieval_steps.build(Results(out))
    assert "probes not drawn" in " ".join(t.get_text() for t in fig.axes[1].texts)
    plt.close(fig)
    # the per-model figures leave step checkpoints to this one
    with pytest.raises(MissingInput, match="is of a step checkpoint"):
        Results(out).models("retrieval")


def test_head_agreement_draws_each_pairs_spearman_and_the_least_agreeing_pairs_scores(tmp_path):
    from figures import head_agreement

    # delta, 4 heads: at 1024 the pair (needle_mass, echo) agrees least (-0.8); retrieval has no number (n_heads 0);
    # at 512 (not drawn: the longest length is) every pair would agree
    pairs = [("retrieval", "needle_mass", 0, math.nan), ("retrieval", "echo", 0, math.nan),
             ("needle_mass", "echo", 4, -0.8)]  # fmt: skip
    _model_table(tmp_path, "delta", "head_agreement", [
        {"model": "delta", "length": n, "layer_type": kind, "definition_a": a, "definition_b": b, "n_heads": heads,
         "spearman": rho if n == 1024 else 1.0, "k": 1, "jaccard": 0.0}
        for n in (512, 1024) for kind in ("all", "full") for a, b, heads, rho in pairs
    ])  # fmt: skip
    values = {"needle_mass": [0.1, 0.4, 0.3, 0.2], "echo": [0.5, 0.1, 0.2, 0.3]}
    for name, v in values.items():
        _model_table(tmp_path, "delta", name, [
            {"model": "delta", "length": 1024, "layer": h // 2, "head": h % 2, "layer_type": "full", "value": x}
            for h, x in enumerate(v)
        ])  # fmt: skip
    fig = head_agreement.build(Results(tmp_path))
    matrix_ax, scatter_ax = fig.axes[0], fig.axes[1]  # the colour bar comes after
    matrix = matrix_ax.images[0].get_array()
    assert [t.get_text() for t in matrix_ax.get_yticklabels()] == ["retrieval", "needle_mass", "echo"]
    assert matrix[1, 2] == pytest.approx(-0.8) and matrix[2, 1] == pytest.approx(-0.8) and matrix[1, 1] == 1.0
    assert matrix.mask[0, 0] and matrix.mask[0, 1]  # no number for retrieval: masked, not 1
    assert "1,024 tokens" in matrix_ax.get_title() and "-0.80" in scatter_ax.get_title()
    (dots,) = [c for c in scatter_ax.collections if isinstance(c, PathCollection)]
    assert dots.get_offsets().tolist() == [[0.1, 0.5], [0.4, 0.1], [0.3, 0.2], [0.2, 0.3]]
    assert scatter_ax.get_xlabel() == "needle_mass" and scatter_ax.get_ylabel() == "echo"
    plt.close(fig)


def test_definition_ablation_bars_each_definitions_drop_beside_the_random_band(tmp_path):
    from figures import definition_ablation

    # eps, sets of 2 zero-ablated, two depths of 2 prompts each: baseline (1.0 + 0.5) / 2 = 0.75; Wu's top set 0.25
    # (drop 0.5), needle_mass's (0.75 + 0.25) / 2 = 0.5 (drop 0.25); random seeds 0.75 and 0.5 (drops 0 and 0.25)
    rows = []
    for condition, seed, acc in [("baseline", -1, (1.0, 0.5)), ("top", -1, (0.25, 0.25)),
                                 ("top:needle_mass", -1, (0.75, 0.25)), ("random", 0, (1.0, 0.5)),
                                 ("random", 1, (0.5, 0.5))]:  # fmt: skip
        for depth, a in zip((0.0, 100.0), acc, strict=True):
            rows.append(
                {
                    "model": "eps",
                    "condition": condition,
                    "mode": "none" if seed == -1 and condition == "baseline" else "zero",
                    "heads": "",
                    "n_heads": 0 if condition == "baseline" else 2,
                    "seed": seed,
                    "task": "needle",
                    "length": 512,
                    "depth": depth,
                    "accuracy": a,
                    "n": 2,
                }
            )
    _model_table(tmp_path, "eps", "ablation", rows)
    fig = definition_ablation.build(Results(tmp_path))
    (ax,) = fig.axes
    bars = [p.get_height() for p in ax.patches if p.get_width() < 1.5]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["retrieval", "needle_mass"]  # largest drop first
    assert bars[:2] == pytest.approx([0.5, 0.25])
    band = [p for p in ax.patches if p.get_width() >= 1.5 or p.get_label().startswith("random")]
    assert band and "baseline 0.75" in ax.get_title()
    (mean,) = [line for line in ax.get_lines() if line.get_label() == "random mean"]
    assert mean.get_ydata()[0] == pytest.approx(0.125)  # drops 0 and 0.25
    plt.close(fig)
    only = tmp_path / "only"
    _model_table(only, "eps", "ablation", [r for r in rows if r["condition"] != "top:needle_mass"])
    with pytest.raises(MissingInput, match="ranks top sets by one definition"):
        definition_ablation.build(Results(only))
