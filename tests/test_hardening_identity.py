"""Hardening, third round (issue 37): nothing silently pooled or mislabelled.

* Results are keyed by what made them: two checkpoints that share a results name (two grids'
  ``toy-d64-s0-pt-final``, a checkpoint retrained at its path) or two runs of one checkpoint with other
  settings are read apart by every reader (``show``, ``figures``, ``report``), each labelled with what
  differs, and a warning says so; results written before the identity was recorded still read.
* ``explore --results`` and ``ablate --from`` take only the results of the checkpoint they run (one other
  model's folder was taken whatever its name), and still take a GGUF file's results for its converted folder.
* ``ablate --heads top:K`` ablates only heads that copied the needle: a K beyond them is refused with the
  counts, and a baseline that never finds the needle is warned about at the end of the run and by ``show``.
* The retrieval score's two forms: Wu et al.'s code's count (repeats counted, can pass 1) and the paper's set
  form (each needle token once, 0-1), checked against hand-worked numbers and an independent reference.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from cli_checks import invoke, refused, snapshot
from click.testing import Result

from headprobe.core.identity import checkpoint_identity
from headprobe.hooked.base import HookedModel
from headprobe.jobs.provenance import not_of, table_meta
from headprobe.metrics.retrieval import copy_scores, retrieval_scores
from headprobe.model.config import LayerInfo, LayerType
from headprobe.model.seam import AttentionCall
from headprobe.model.tokenizer import ByteTokenizer
from headprobe.results import ResultsWarning, TableMeta, collect, read_table, write_table
from headprobe.testing import tiny_checkpoint
from headprobe.text.needles import NEEDLES

GRID_RUN = Path("toy-d64") / "s0" / "pt" / "final"  # named toy-d64-s0-pt-final in any grid
NAME = "toy-d64-s0-pt-final"


def analyze(ckpt: Path, out: Path, *extra: str) -> Result:
    res = invoke("analyze", ckpt, "--metrics", "entropy", "--lengths", "128", "--samples", "1", "--out", out,
                 "--no-progress", *extra)  # fmt: skip
    assert res.exit_code == 0, res.output
    return res


def table_rows(text: str, title: str) -> dict[str, list[str]]:
    """The body rows of the printed table titled ``title``: first cell -> the others."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(title))
    rows = {}
    for line in lines[start + 1 :]:
        if line.startswith("└"):
            break
        if line.startswith("│"):
            cells = [cell.strip() for cell in line.strip().strip("│").split("│")]
            rows[cells[0]] = cells[1:]
    return rows


def by_hand(entropy: Path) -> list[str]:
    """``show``'s cells for one ``entropy.parquet`` computed here with pandas: the mean per layer type."""
    frame = pd.read_parquet(entropy)
    return [f"{frame[frame.layer_type == t]['value'].mean():.3f}" for t in ("full", "sliding")]


@pytest.fixture(scope="module")
def grids(tmp_path_factory) -> dict[str, Path]:
    """Two grids' ``toy-d64/s0/pt/final`` (different random weights, one results name), each analysed into
    its own folder below one results folder; grid A's also with another seed."""
    root = tmp_path_factory.mktemp("grids")
    ckpts = {g: tiny_checkpoint(root / g / GRID_RUN, seed=i, vocab_size=264, max_seq_len=1024)
             for i, g in enumerate(("gridA", "gridB"))}  # fmt: skip
    for g, ckpt in ckpts.items():
        analyze(ckpt, root / "results" / g)
    analyze(ckpts["gridA"], root / "results" / "seed7", "--seed", "7")
    return {**ckpts, "results": root / "results"}


def test_show_keeps_two_checkpoints_of_one_name_and_two_seeds_apart(grids):
    res = invoke("show", grids["results"], "--metric", "entropy")
    assert res.exit_code == 0, res.output
    rows = table_rows(res.output, "entropy: mean per layer type")
    results = grids["results"]
    assert rows == {  # one row per checkpoint and settings, each as computed by hand from its own table
        f"{NAME} (gridA, seed 0)": by_hand(results / "gridA" / NAME / "entropy.parquet"),
        f"{NAME} (gridB, seed 0)": by_hand(results / "gridB" / NAME / "entropy.parquet"),
        f"{NAME} (gridA, seed 7)": by_hand(results / "seed7" / NAME / "entropy.parquet"),
    }
    assert len({tuple(v) for v in rows.values()}) == 3  # three different sets of numbers, none pooled
    said = [line for line in res.output.splitlines() if line.startswith("warning: ")]
    assert said == [
        f"warning: results named {NAME} were made from different checkpoints, with other settings (seed); shown "
        f"apart as {NAME} (gridA, seed 0), {NAME} (gridB, seed 0), {NAME} (gridA, seed 7)"
    ]


def test_one_checkpoint_with_one_setting_reads_as_one_model_with_no_warning(grids, tmp_path):
    shutil.copytree(grids["results"] / "gridA", tmp_path / "a")
    shutil.copytree(grids["results"] / "gridA", tmp_path / "copy")  # the same results twice: one model
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frame = collect(tmp_path, "entropy", recursive=True)
    assert not [w for w in caught if issubclass(w.category, ResultsWarning)]
    assert set(frame["model"]) == {NAME}


def test_figures_and_report_draw_two_checkpoints_of_one_name_apart(grids, tmp_path):
    from figures import SPECS
    from figures.data import Results
    from figures.report import report_page

    results = tmp_path / "results"
    for g in ("gridA", "gridB"):
        shutil.copytree(grids["results"] / g, results / g)
    with pytest.warns(ResultsWarning, match=f"results named {NAME} were made from different checkpoints;"):
        models = Results(results).models("entropy", ["length", "layer", "head", "sample"])
    assert sorted(models["model"].unique()) == [f"{NAME} (gridA)", f"{NAME} (gridB)"]
    for label, g in ((f"{NAME} (gridA)", "gridA"), (f"{NAME} (gridB)", "gridB")):  # each its own rows
        own = pd.read_parquet(results / g / NAME / "entropy.parquet")
        assert models[models.model == label]["value"].sort_values().tolist() == own["value"].sort_values().tolist()
    with pytest.warns(ResultsWarning):
        page = report_page(results, SPECS)
    assert f"{NAME} (gridA)" in page.html and f"{NAME} (gridB)" in page.html
    assert f"results named {NAME} were made from different checkpoints" in page.html  # a caveat on the page
    res = invoke("figures", results, "--out", tmp_path / "figs")
    assert res.exit_code == 0, res.output
    assert f"warning: results named {NAME}" in res.output


def test_results_written_before_the_identity_still_read_and_are_told_apart_by_path(grids, tmp_path):
    """Tables without ``identity`` (headprobe before issue 37): the checkpoint path as given tells them apart;
    a relative path and the absolute one it ends are one checkpoint."""
    results = tmp_path / "results"
    for g in ("gridA", "gridB", "seed7"):
        shutil.copytree(grids["results"] / g, results / g)
    for g, given in (("gridA", f"gridA/{GRID_RUN}"), ("gridB", f"gridB/{GRID_RUN}")):
        path = results / g / NAME / "entropy.parquet"
        table = read_table(path)
        old = TableMeta(**{**table.meta.__dict__, "identity": {}, "checkpoint": given})
        write_table(path, table.frame, old)
    with pytest.warns(ResultsWarning) as caught:
        frame = collect(results, "entropy", recursive=True)
    # seed7's table records the absolute path of grid A's checkpoint, which ends in gridA's relative one
    assert sorted(frame["model"].unique()) == [f"{NAME} (gridA, seed 0)", f"{NAME} (gridA, seed 7)",
                                               f"{NAME} (gridB, seed 0)"]  # fmt: skip
    assert len(caught) == 1


def test_a_checkpoint_retrained_at_its_path_is_another(tmp_path):
    ckpt = tiny_checkpoint(tmp_path / "run" / "tiny", seed=0, vocab_size=264, max_seq_len=1024)
    analyze(ckpt, tmp_path / "results" / "before")
    shutil.rmtree(ckpt)
    tiny_checkpoint(ckpt, seed=1, vocab_size=264, max_seq_len=1024)  # new weights, the same path
    analyze(ckpt, tmp_path / "results" / "after")
    identities = [read_table(tmp_path / "results" / w / "tiny" / "entropy.parquet").meta.identity
                  for w in ("before", "after")]  # fmt: skip
    assert identities[0]["path"] == identities[1]["path"] == str(ckpt.resolve())
    assert identities[0]["weights"] != identities[1]["weights"]
    with pytest.warns(ResultsWarning, match="made from other weights at one path"):
        frame = collect(tmp_path / "results", "entropy", recursive=True)
    assert sorted(frame["model"].unique()) == sorted(f"tiny (weights of {i['modified']})" for i in identities) or (
        identities[0]["modified"] == identities[1]["modified"]  # written within one second: numbered instead
        and sorted(frame["model"].unique()) == [f"tiny (weights of {identities[0]['modified']}) #{i}" for i in (1, 2)]
    )
    # explore takes the new results, refuses the old ones: they describe weights that are gone
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 4)
    page = tmp_path / "page.html"
    refused(invoke("explore", ckpt, "--text", text, "--results", tmp_path / "results" / "before", "--export", page),
            "its weights or config changed since (the weights differ)", "not of tiny")  # fmt: skip
    assert not page.exists()


# ---------------------------------------------------------------------------------------------
# explore --results, ablate --from: this checkpoint's results only
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two(tmp_path_factory) -> dict[str, Path]:
    """Two different checkpoints named apart, ``d64`` and ``d32``, each analysed into its own folder."""
    root = tmp_path_factory.mktemp("two")
    out = {}
    for i, name in enumerate(("d64", "d32")):
        out[name] = tiny_checkpoint(root / name, seed=10 + i, vocab_size=264, max_seq_len=1024)
        analyze(out[name], root / f"{name}-results")
        out[f"{name}-results"] = root / f"{name}-results"
    text = root / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 4)
    return {**out, "text": text}


def test_explore_refuses_another_checkpoints_results_naming_both(two, tmp_path):
    page = tmp_path / "page.html"
    res = invoke("explore", two["d64"], "--text", two["text"], "--results", two["d32-results"], "--export", page)
    refused(res, f"--results {two['d32-results']} holds results of d32 (another checkpoint, {two['d32'].resolve()}), "
                 f"not of d64 ({two['d64']})",
            "give the folder that `headprobe analyze` of this model wrote (its --out)")  # fmt: skip
    assert not page.exists()


def test_explore_takes_its_own_results_also_when_the_checkpoint_was_moved(two, tmp_path):
    moved = tmp_path / "renamed"
    shutil.copytree(two["d64"], moved, copy_function=shutil.copy2)  # the same weights, their times kept
    page = tmp_path / "page.html"
    res = invoke("explore", moved, "--text", two["text"], "--results", two["d64-results"], "--export", page)
    assert res.exit_code == 0, res.output
    assert page.is_file()


def test_a_gguf_files_results_serve_its_converted_folder_and_nothing_else(tmp_path):
    """The legitimate case of naming apart: results of ``model.gguf`` record its content hash
    (``model_facts.source``), which its converted folder records too (``source.json``)."""
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(range(256)))
    import hashlib

    sha = hashlib.sha256(gguf.read_bytes()).hexdigest()  # computed here, not by headprobe
    converted = tmp_path / "cache" / sha
    converted.mkdir(parents=True)
    (converted / "source.json").write_text(json.dumps({"file": "model.gguf", "sha256": sha}))
    meta = TableMeta("retrieval", "model", str(gguf), model_facts={"source": {"sha256": sha}},
                     identity=checkpoint_identity(gguf))  # fmt: skip
    assert not_of(meta, gguf, "model") is None  # the file itself
    assert not_of(meta, converted, sha) is None  # its converted folder, named apart
    other = tmp_path / "other"
    other.mkdir()
    (other / "source.json").write_text(json.dumps({"sha256": "0" * 64}))
    assert not_of(meta, other, "other") == f"(another checkpoint, {gguf.resolve()})"


def test_ablate_from_another_checkpoints_results_is_refused_naming_both(two, tmp_path):
    out, retrieval = tmp_path / "out", tmp_path / "res"
    write_table(retrieval / "d32" / "retrieval.parquet",
                pd.DataFrame([{"model": "d32", "layer": 3, "head": 0, "layer_type": "full", "value": 0.5,
                               "set_value": 0.5, "n_kept": 1, "n_samples": 1, "length": 512}]),
                table_meta("retrieval", "d32", two["d32"], {}))  # fmt: skip
    res = invoke("ablate", two["d64"], "--from", retrieval, "--heads", "top:1", "--lengths", "512", "--out", out,
                 "--no-progress")  # fmt: skip
    refused(res, f"--from {retrieval} holds retrieval scores of d32 (another checkpoint, {two['d32'].resolve()}), "
                 f"not of d64 ({two['d64']})", "--metrics retrieval")  # fmt: skip
    assert not (out / "d64").exists()


# ---------------------------------------------------------------------------------------------
# ablate --heads top:K: only heads that copied; a baseline of 0 is said to show nothing
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def scored(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny checkpoint and a retrieval table of it in which 3 heads copied the needle (0.5, 0.2, 0.05: two of
    them at or above 0.1) and every other head scored 0."""
    root = tmp_path_factory.mktemp("scored")
    ckpt = tiny_checkpoint(root / "tiny", seed=0, vocab_size=264, max_seq_len=1024)
    heads = [(layer, h) for layer in range(3) for h in range(4)] + [(3, 0), (3, 1)]
    scores = {(3, 0): 0.5, (0, 1): 0.2, (2, 3): 0.05}
    rows = [{"model": "tiny", "layer": layer, "head": h, "layer_type": "full" if layer == 3 else "sliding",
             "value": scores.get((layer, h), 0.0), "set_value": scores.get((layer, h), 0.0), "n_kept": 2,
             "n_samples": 2, "length": 512} for layer, h in heads]  # fmt: skip
    write_table(root / "res" / "tiny" / "retrieval.parquet", pd.DataFrame(rows),
                table_meta("retrieval", "tiny", ckpt, {}))  # fmt: skip
    return ckpt, root / "res"


def test_top_k_beyond_the_heads_that_copied_is_refused_with_the_counts(scored, tmp_path):
    ckpt, res_folder = scored
    out = tmp_path / "out"
    before = snapshot(res_folder)
    res = invoke("ablate", ckpt, "--from", res_folder, "--heads", "top:5", "--lengths", "512", "--out", out,
                 "--no-progress")  # fmt: skip
    refused(res, "--heads top:5: only 3 heads of tiny", "copied the needle at all (retrieval score > 0; 2 of them at "
            "or above the retrieval-head threshold 0.1)", "ask for top:3 or fewer")  # fmt: skip
    assert not (out / "tiny").exists() and snapshot(res_folder) == before


def test_top_k_with_weak_heads_runs_labelled_by_its_true_count_and_a_zero_baseline_is_warned(scored, tmp_path):
    """top:3 takes the three heads that copied (one below 0.1, said so); a random model never finds the needle,
    so its baseline is 0 and the run and ``show`` say that the test shows nothing."""
    ckpt, res_folder = scored
    out = tmp_path / "out"
    res = invoke("ablate", ckpt, "--from", res_folder, "--heads", "top:3", "--lengths", "512", "--depths", "50",
                 "--samples", "1", "--max-new-tokens", "4", "--out", out, "--no-progress")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "top:3 holds 1 heads scoring below the retrieval-head threshold 0.1 (only 2 of its heads are retrieval " \
        "heads)" in res.output  # fmt: skip
    table = pd.read_parquet(out / "tiny" / "ablation.parquet")
    top = table[table.condition == "top"].iloc[0]
    assert top["heads"] == "3.0,0.1,2.3" and top["n_heads"] == 3  # the heads that copied, by score, not by index
    base = table[table.condition == "baseline"]["accuracy"]
    assert (base == 0).all()  # a random model: checked, so that the warning below is the right one
    warning = "tiny: baseline accuracy 0 at needle @ 512: unablated it never finds the needle there, so ablating " \
        "heads can show nothing"  # fmt: skip
    assert f"warning: {warning}" in res.output
    shown = invoke("show", out, "--metric", "ablation")
    assert shown.exit_code == 0 and warning in " ".join(shown.output.split()), shown.output


# ---------------------------------------------------------------------------------------------
# the retrieval score's two forms
# ---------------------------------------------------------------------------------------------
def set_form_reference(argmax: np.ndarray, tokens: list[int], ids: list[int], span: tuple[int, int]) -> np.ndarray:
    """Wu et al.'s paper, literally: g_h = the needle tokens (span positions) head h copied from (its argmax at
    a step, holding that step's token); score |g_h ∩ k| / |k|, k the span's positions. Plain Python loops."""
    start, end = span
    out = np.zeros(argmax.shape[1:])
    for layer in range(argmax.shape[1]):
        for head in range(argmax.shape[2]):
            at = argmax[:, layer, head]
            copied = {int(at[t]) for t in range(len(tokens)) if start <= at[t] < end and ids[at[t]] == tokens[t]}
            out[layer, head] = len(copied & set(range(start, end))) / (end - start)
    return out


def test_copy_scores_both_forms_by_hand():
    # prompt: positions 2, 3, 4 are the needle span holding tokens 7, 8, 9; the answer is 7 7 8
    ids = [1, 2, 7, 8, 9, 3, 7]
    tokens = [7, 7, 8]
    argmax = np.array([[[2, 2, 6]], [[2, 0, 6]], [[3, 3, 3]]])  # [steps, 1 layer, 3 heads]
    scores = copy_scores(argmax, tokens, ids, [(2, 5)])
    # head 0 copies position 2 twice and 3 once: 3 copies / 3 = 1.0, but only 2 of the 3 needle tokens: 2/3
    # head 1 copies position 2 at step 0 and 3 at step 2 (step 1 looks at position 0): 2/3 both ways
    # head 2 looks at position 6 (a 7, but outside the span), then at 3 (an 8) when 8 is produced: 1/3 both ways
    assert scores.value[0].tolist() == pytest.approx([1.0, 2 / 3, 1 / 3])
    assert scores.set_value[0].tolist() == pytest.approx([2 / 3, 2 / 3, 1 / 3])


def test_copy_scores_set_form_equals_the_papers_definition_on_random_decodes():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(8, 40))
        ids = rng.integers(0, 4, n).tolist()  # few token ids: many repeats, inside and outside the span
        start = int(rng.integers(0, n - 3))
        span = (start, int(rng.integers(start + 1, min(n, start + 8) + 1)))
        steps = int(rng.integers(1, 12))
        tokens = rng.integers(0, 4, steps).tolist()
        argmax = rng.integers(0, n, (steps, 3, 5))
        scores = copy_scores(argmax, tokens, ids, [span])
        assert np.allclose(scores.set_value, set_form_reference(argmax, tokens, ids, span))
        assert (scores.set_value <= scores.value + 1e-12).all() and (scores.set_value <= 1).all()


class RepeatingCopyModel(HookedModel):
    """A hand-built byte-level model whose answer is the needle's answer twice, then a newline. Layer 1 head 0
    has one-hot positional queries and keys (q = 50 e(target), k_j = e(j)), its argmax walking the answer span
    twice, so it copies every answer token twice; layer 1 head 1 and layer 0 (a sliding window of 8) have zero
    queries, their argmax the first visible key, never the answer."""

    def __init__(self) -> None:
        self.name, self.tokenizer, self.device, self.prompt_start = "repeat", ByteTokenizer(), torch.device("cpu"), []
        self.layers = [LayerInfo(0, LayerType.SLIDING, 2, 2, 2048, 2048, 8),
                       LayerInfo(1, LayerType.FULL, 2, 2, 2048, 2048, None)]  # fmt: skip
        self.max_positions = 2048

    def decode(self, prompt_ids, max_new_tokens, stop_ids=None, hook=None):
        ids = prompt_ids[0].tolist()
        text = self.tokenizer.decode(ids)
        needle = next(n for n in NEEDLES if n.answer in text and n.question in text)
        start = text.find(needle.answer)  # byte-level: one token per character
        span = len(needle.answer)
        out = []
        for step in range(max_new_tokens):
            n = len(ids) + step  # keys in the cache: prompt + generated so far (the query is the last)
            target = start + step % span if step < 2 * span else n - 1
            token = ids[target] if step < 2 * span else 10  # the answer twice, then a newline
            out.append(token)
            q = torch.zeros(2, 1, 2048)
            q[0, 0, target] = 50.0
            k = torch.eye(2048)[:n]
            for layer, window in ((0, 8), (1, None)):
                kk = k if window is None else k[max(0, n - window) :]
                qq = q if layer == 1 else torch.zeros_like(q)
                keys = kk[None, None].expand(1, 2, -1, -1)
                kind = "sliding" if window else "full"
                hook(step, token, AttentionCall(layer, kind, qq[None], keys, window, 1.0, n - kk.shape[0]))
            if stop_ids and token in stop_ids:
                break
        return out

    def run(self, input_ids, hook=None, residual=None):
        """The teacher-forced pass (the prompt, ``" "``, the answer but its last byte): head 0 of layer 1 walks
        the answer span once at the rows producing the answer (the last ``len(answer)``); other queries zero."""
        ids = input_ids[0].tolist()
        text = self.tokenizer.decode(ids)
        needle = next(n for n in NEEDLES if n.answer in text and n.question in text)
        start, span, n = text.find(needle.answer), len(needle.answer), len(ids)
        q = torch.zeros(2, n, 2048)
        for t in range(span):
            q[0, n - span + t, start + t] = 50.0
        k = torch.eye(2048)[:n][None, None].expand(1, 2, -1, -1)
        hook(AttentionCall(0, "sliding", torch.zeros_like(q)[None], k, 8, 1.0, 0))
        hook(AttentionCall(1, "full", q[None], k, None, 1.0, 0))


def test_a_head_that_copies_the_answer_twice_scores_2_as_the_code_counts_and_1_in_the_set_form():
    scores = retrieval_scores(RepeatingCopyModel(), needles=NEEDLES[:2], lengths=[400], depths=[30.0],
                              max_new_tokens=200)  # room for the answer twice  # fmt: skip
    assert scores.samples["kept"].all()  # the answer, repeated, still recalls the needle
    heads = scores.heads.set_index(["layer", "head"])
    assert heads.loc[(1, 0), "value"] == pytest.approx(2.0)  # every needle token copied twice / span length
    assert heads.loc[(1, 0), "set_value"] == pytest.approx(1.0)  # each needle token once
    assert heads.loc[(1, 0), "forced_value"] == pytest.approx(1.0)  # the answer forced once: each token copied once
    others = heads.drop(index=(1, 0))
    assert (others["value"] == 0).all() and (others["set_value"] == 0).all()
    copies = scores.copies.set_index(["layer", "head", "sample"])
    assert copies.xs((1, 0), level=["layer", "head"])["set_value"].tolist() == pytest.approx([1.0, 1.0])
