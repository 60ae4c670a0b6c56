"""The attention-map explorer: exact pooled maps against dense float64 patterns, the per-head metrics, the
API (every endpoint, bad requests, path traversal), the command line, and the page in a real browser."""

from __future__ import annotations

import base64
import itertools
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from reference import dense_probs, pooled_reference, visible
from typer.testing import CliRunner

from headprobe.cli import app as cli
from headprobe.explore import TILE, ModelView, TileSpec, api_answer, pooled_mass, top_level
from headprobe.explore.inputs import needle_input, ruler_input, text_input
from headprobe.hooked import HeadprobeModel, load_model
from headprobe.model.checkpoint import save_checkpoint
from headprobe.model.tokenizer import ByteTokenizer
from headprobe.model.transformer import Transformer
from headprobe.testing import tiny_config


@pytest.mark.parametrize("window", [None, 7, 64])
@pytest.mark.parametrize(
    "rows, keys, block",
    [((0, 300), (0, 300), 1), ((0, 300), (0, 300), 16), ((37, 250), (5, 200), 8), ((100, 300), (0, 300), 64)],
)
def test_pooled_mass_equals_the_dense_float64_pattern_pooled(window, rows, keys, block):
    q, k = torch.randn(300, 16) * 2, torch.randn(300, 16) * 2
    p = dense_probs(q[None, None], k[None, None], window, 0.25)[0, 0]
    want = pooled_reference(p, rows, keys, block)
    values, lse = pooled_mass(q, k, window=window, scale=0.25, rows=rows, keys=keys, block=block, budget=500)
    torch.testing.assert_close(values.double(), want, atol=1e-5, rtol=0)
    # with the rows' lse given the pass covers only the requested keys, and gives the same map
    again, _ = pooled_mass(q, k, window=window, scale=0.25, rows=rows, keys=keys, block=block, lse=lse, budget=700)
    torch.testing.assert_close(again.double(), want, atol=1e-5, rtol=0)
    s = (q.double() @ k.double().T) * 0.25
    s = s.masked_fill(~visible(300, 300, window), -math.inf)
    torch.testing.assert_close(lse.double(), torch.logsumexp(s, -1)[rows[0] : rows[1]], atol=1e-5, rtol=0)


def test_rows_sum_to_one_at_token_level_and_float64_stays_float64():
    q, k = torch.randn(200, 8, dtype=torch.float64), torch.randn(200, 8, dtype=torch.float64)
    values, _ = pooled_mass(q, k, window=None, scale=1.0, rows=(0, 200), keys=(0, 200), block=1)
    assert values.dtype == torch.float64
    torch.testing.assert_close(values.sum(1), torch.ones(200, dtype=torch.float64), atol=1e-12, rtol=0)
    # above the diagonal nothing is seen
    assert float(values.triu(1).abs().max()) == 0.0


def test_tile_geometry_by_hand():
    spec = TileSpec(level=2, row=3, col=1)  # 4 tokens per pixel, 1,024 tokens per tile side
    assert (spec.block, spec.span) == (4, 4 * TILE)
    assert spec.queries(5000) == (3072, 4096) and spec.keys(5000) == (1024, 2048)
    assert spec.queries(3500) == (3072, 3500)
    assert not spec.empty(5000, None) and TileSpec(2, 1, 3).empty(5000, None)  # above the diagonal
    assert spec.empty(5000, 1025) and not spec.empty(5000, 1026)  # key 2,047 is 1,025 back from query 3,072
    assert TileSpec(0, 4, 0).empty(1000, None)  # past the input
    assert top_level(256) == 0 and top_level(257) == 1 and top_level(131072) == 9


# -- one model on one input ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    """The tiny model (GQA sliding layers with window 5, full heads with qk 16 != v 4) over bytes."""
    torch.manual_seed(0)
    return HeadprobeModel(Transformer(tiny_config(vocab_size=264, max_seq_len=1024)), ByteTokenizer(), "tiny")


@pytest.fixture(scope="module")
def needle_view(tiny):
    """A 600-token needle prompt, captured in chunks of 128 tokens (the references run it in one pass)."""
    from unittest import mock

    import headprobe.explore.session as session

    with mock.patch.object(session, "PREFILL_CHUNK", 128):
        return ModelView(tiny, needle_input(tiny, 600, 40.0, seed=1), "tiny")


def reference_patterns(model: HeadprobeModel, ids: list[int]) -> dict[int, torch.Tensor]:
    """Dense float64 probabilities ``[heads, L, L]`` per layer from the model's own hook points (not the
    seam the explorer captures through)."""
    _, cache = model.model.run_with_cache(torch.tensor([ids]))
    out = {}
    for layer in range(model.model.cfg.n_layers):
        att = model.model.cfg.attention(layer)
        q = cache[f"blocks.{layer}.attn.hook_rot_q"].transpose(1, 2)
        k = cache[f"blocks.{layer}.attn.hook_rot_k"].transpose(1, 2)
        out[layer] = dense_probs(q, k, att.window, att.qk_head_dim**-0.5)[0]
    return out


def test_every_tile_of_every_head_equals_the_dense_pattern_pooled(tiny, needle_view):
    view, length = needle_view, needle_view.input.length
    dense = reference_patterns(tiny, view.input.ids)
    for layer in (0, 3):  # a sliding GQA layer and the full qk != v layer
        for head in range(tiny.layers[layer].n_heads):
            # deepest level first (row bands compute the lse), then coarser ones (the lse is known)
            for level in range(top_level(length) + 1):
                n = math.ceil(length / TileSpec(level, 0, 0).span)
                for row in range(n):
                    for col in range(n):
                        spec = TileSpec(level, row, col)
                        got = view.tile(layer, head, spec)
                        want = pooled_reference(dense[layer][head], spec.queries(length), spec.keys(length), spec.block)
                        np.testing.assert_allclose(got, want.numpy(), atol=1e-5, err_msg=f"{layer=} {head=} {spec}")
    # at token level every row's tiles sum to 1
    rows = sum(view.tile(3, 1, TileSpec(0, 2, c)).sum(1) for c in range(3))
    np.testing.assert_allclose(rows, 1.0, atol=1e-5)


def test_head_metrics_and_rows_equal_the_dense_pattern(tiny, needle_view):
    view = needle_view
    dense = reference_patterns(tiny, view.input.ids)
    (a, b), (q0, q1) = view.input.spans[0], view.input.question
    for layer, p in dense.items():
        heads = p.shape[0]
        ent = -(p * torch.log(torch.where(p > 0, p, torch.ones_like(p)))).sum(-1).mean(-1)
        np.testing.assert_allclose(view.metrics["entropy"][layer, :heads], ent.numpy(), atol=1e-5)
        np.testing.assert_allclose(view.metrics["max_prob"][layer, :heads], p.amax(-1).mean(-1).numpy(), atol=1e-5)
        mass = p[:, q0:q1, a:b].sum(-1).mean(-1)
        np.testing.assert_allclose(view.metrics["needle_mass"][layer, :heads], mass.numpy(), atol=1e-5)
        assert np.isnan(view.metrics["entropy"][layer, heads:]).all()
    row = view.row(3, 1, 450, k=5)
    order = torch.sort(dense[3][1, 450], descending=True)
    assert row["keys"] == order.indices[:5].tolist()
    np.testing.assert_allclose(row["probs"], order.values[:5].numpy(), atol=1e-6)
    assert row["visible"] == 451


def test_needle_evidence_is_the_decoding_with_each_heads_argmax(tiny, needle_view):
    ev = needle_view.evidence
    stops = [10, *tiny.stop_ids]  # a newline (Wu et al.) or the model's end of text
    assert ev["tokens"] == tiny.decode(torch.tensor([needle_view.input.ids]), needle_view.input.max_new_tokens, stops)
    # step 0 attends from the last prompt token: its argmax per head is the dense row's argmax
    dense = reference_patterns(tiny, needle_view.input.ids)
    for layer, p in dense.items():
        assert ev["argmax"][0, layer, : p.shape[0]].tolist() == p[:, -1].argmax(-1).tolist()


def test_inputs_know_where_the_answer_and_the_question_are(tiny, tmp_path):
    inp = needle_input(tiny, 500, 50.0, seed=2)
    (a, b), (q0, q1) = inp.spans[0], inp.question
    assert "".join(inp.tokens[a:b]).strip() == inp.answers[0]
    from headprobe.text.needles import NEEDLES

    question = f"\nBased on the content of the book, Question: {NEEDLES[2].question}\nAnswer:"  # Wu et al.'s
    assert "".join(inp.tokens[q0:q1]) == question and q1 == inp.length == 500
    r = ruler_input(tiny, "niah_multivalue", 700)
    assert r.max_new_tokens == 128  # RULER's budget for the niah tasks
    for value in r.answers:
        assert any("".join(r.tokens[s:e]).strip() == value for s, e in r.spans)
    assert r.question[1] == r.length and "What are all the special magic numbers" in "".join(
        r.tokens[slice(*r.question)]
    )
    (tmp_path / "t.txt").write_text("héllo wörld")
    t = text_input(tiny, tmp_path / "t.txt")
    assert t.length == len("héllo wörld".encode()) and t.tokens[:2] == ["h", "é"] and t.spans == []
    (tmp_path / "b.bin").write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ValueError, match=r"--text .*b.bin is not UTF-8 text"):
        text_input(tiny, tmp_path / "b.bin")
    with pytest.raises(ValueError, match=r"--length 100: .* holds only 13 tokens"):
        text_input(tiny, tmp_path / "t.txt", length=100)


def test_bad_requests_name_the_problem(needle_view):
    with pytest.raises(ValueError, match=r"layer 9 is out of range: tiny has layers 0..3"):
        needle_view.tile(9, 0, TileSpec(0, 0, 0))
    with pytest.raises(ValueError, match=r"head 2 is out of range: layer 3 of tiny has heads 0..1"):
        needle_view.tile(3, 2, TileSpec(0, 0, 0))
    with pytest.raises(ValueError, match=r"level -1 is out of range: 0 \(tokens\) .. 2"):
        needle_view.tile(3, 0, TileSpec(-1, 0, 0))
    with pytest.raises(ValueError, match=r"tile \(0, 3\) is outside the map: level 0 has 3 x 3 tiles"):
        needle_view.tile(3, 0, TileSpec(0, 0, 3))
    with pytest.raises(ValueError, match=r"position 600 is outside the input \(0..599\)"):
        needle_view.row(3, 0, 600)


def test_an_input_too_long_for_memory_is_refused_before_any_work(tiny, monkeypatch):
    import headprobe.explore.session as session

    monkeypatch.setattr(session.MemoryBudget, "of", classmethod(lambda cls, device, limit: cls(2**20)))
    with pytest.raises(RuntimeError, match=r"exploring tiny at 600 tokens needs about .* use a shorter --length"):
        ModelView(tiny, needle_input(tiny, 600, 40.0), "tiny")


@pytest.mark.parametrize("arch", ["gemma3", "qwen2"])
def test_a_local_hugging_face_model_maps_equal_its_own_eager_attention_weights(hf_models, arch, tmp_path):
    """The reference is Hugging Face's eager attention (``output_attentions=True``), not our seam."""
    from transformers import AutoModelForCausalLM

    model = load_model(hf_models[arch])
    from unittest import mock

    import headprobe.explore.session as session

    (tmp_path / "t.txt").write_text(" ".join(f"word{i % 37} and thing{i % 11}." for i in range(200)))
    with mock.patch.object(session, "PREFILL_CHUNK", 64):  # captured in chunks; the reference in one pass
        view = ModelView(model, text_input(model, tmp_path / "t.txt", length=300), arch)
    eager = AutoModelForCausalLM.from_pretrained(str(hf_models[arch]), local_files_only=True,
                                                 attn_implementation="eager").eval()  # fmt: skip
    with torch.no_grad():
        attentions = eager(input_ids=torch.tensor([view.input.ids]), output_attentions=True).attentions
    for info in model.layers:
        p = attentions[info.index][0].double()
        for head in range(info.n_heads):
            for spec in (TileSpec(0, 1, 0), TileSpec(0, 1, 1), TileSpec(1, 0, 0)):
                want = pooled_reference(p[head], spec.queries(300), spec.keys(300), spec.block)
                np.testing.assert_allclose(view.tile(info.index, head, spec), want.numpy(), atol=1e-5)
        ent = -(torch.where(p > 0, p * p.log(), torch.zeros_like(p))).sum(-1).mean(-1)
        np.testing.assert_allclose(view.metrics["entropy"][info.index, : info.n_heads], ent.numpy(), atol=1e-5)


# -- the API ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client(needle_view):
    from fastapi.testclient import TestClient

    from headprobe.explore import create_app

    return TestClient(create_app([needle_view]))


def test_every_endpoint_answers_what_the_view_holds(client, needle_view):
    info = client.get("/api/info").json()
    assert info["tile"] == TILE and info["models"][0]["length"] == 600
    assert [layer["window"] for layer in info["models"][0]["layers"]] == [5, 5, 5, None]
    ov = client.get("/api/overview", params={"model": "tiny", "metric": "max_prob"}).json()["values"]
    assert ov[3][:2] == pytest.approx(needle_view.metrics["max_prob"][3, :2].tolist()) and ov[3][2] is None
    tile = client.get("/api/tile", params=dict(model=0, layer=3, head=1, level=0, row=1, col=0)).json()
    values = np.frombuffer(base64.b64decode(tile["data"]), dtype="<f4").reshape(tile["rows"], tile["cols"])
    np.testing.assert_array_equal(values, needle_view.tile(3, 1, TileSpec(0, 1, 0)))
    assert (tile["q0"], tile["k0"], tile["block"]) == (256, 0, 1) and tile["max"] == pytest.approx(values.max())
    row = client.get("/api/row", params=dict(model=0, layer=3, head=0, pos=599, k=3)).json()
    assert row == needle_view.row(3, 0, 599, 3)
    toks = client.get("/api/tokens", params=dict(model=0, start=10, end=20)).json()
    assert toks == {"start": 10, "tokens": needle_view.input.tokens[10:20]}
    needle = client.get("/api/needle", params={"model": 0}).json()
    assert needle["tokens"] == needle_view.evidence["tokens"] and needle["spans"] == [list(needle_view.input.spans[0])]
    page = client.get("/")
    assert page.status_code == 200 and "explore.js" in page.text
    assert client.get("/static/explore.js").status_code == 200


@pytest.mark.parametrize(
    "url, status, message",
    [
        ("/api/tile?model=0&layer=7&head=0&level=0&row=0&col=0", 400, "layer 7 is out of range"),
        ("/api/tile?model=0&layer=3&head=5&level=0&row=0&col=0", 400, "head 5 is out of range"),
        ("/api/tile?model=0&layer=3&head=0&level=-1&row=0&col=0", 400, "level -1 is out of range"),
        ("/api/tile?model=0&layer=3&head=0&level=0&row=9&col=0", 400, "outside the map"),
        ("/api/tile?model=0&layer=x&head=0&level=0&row=0&col=0", 400, "layer='x' is not an integer"),
        ("/api/tile?model=0&head=0&level=0&row=0&col=0", 400, "missing parameter 'layer'"),
        ("/api/tile?model=big&layer=3&head=0&level=0&row=0&col=0", 404, "unknown model 'big'; loaded: 0 (tiny)"),
        ("/api/row?model=0&layer=3&head=0&pos=-1", 400, "position -1 is outside the input"),
        ("/api/row?model=0&layer=3&head=0&pos=1&k=1000", 400, "ask for 1..100 top keys"),
        ("/api/overview?model=0&metric=nope", 400, "unknown metric 'nope'"),
        ("/api/tokens?model=0&start=590&end=700", 400, "inside 0..600"),
        ("/api/nothing", 404, "no endpoint /api/nothing"),
        ("/static/secret.py", 404, "no asset 'secret.py'"),
    ],
)
def test_bad_parameters_answer_4xx_with_a_clear_message(client, url, status, message):
    answer = client.get(url)
    assert answer.status_code == status and message in answer.json()["detail"]


@pytest.mark.parametrize(
    "path",
    [
        "/static/../../etc/passwd",
        "/static/..%2F..%2Fetc%2Fpasswd",
        "/static/%2e%2e/%2e%2e/etc/passwd",
        "/static/%252e%252e%252fetc%252fpasswd",
        "/static//etc/passwd",
        "/static/%2Fetc%2Fpasswd",
        "/static/..\\..\\etc\\passwd",
        "/../../../etc/passwd",
        "/static/../app.py",
        "/static/..%2Fapp.py",
        "/etc/passwd",
    ],
)
def test_nothing_outside_the_shipped_assets_can_be_read(needle_view, path):
    """Requests as a server hands them to the app: the raw path as sent (no client normalises the dots away),
    percent-decoded into ``path`` as uvicorn does."""
    import asyncio
    from urllib.parse import unquote

    from headprobe.explore import create_app

    app = create_app([needle_view])
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
        "path": unquote(path), "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": [],
        "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5000),
    }  # fmt: skip
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    status = sent[0]["status"]
    body = b"".join(m.get("body", b"") for m in sent[1:]).decode(errors="replace")
    assert status in (400, 404), (path, status)
    assert "root:" not in body and "import " not in body


# -- the command line ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(1)
    return save_checkpoint(
        Transformer(tiny_config(vocab_size=264, max_seq_len=1024)), tmp_path_factory.mktemp("ck") / "tiny"
    )


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "give exactly one input"),
        (["--needle", "--text", "x.txt"], "give exactly one input"),
        (["--needle"], "--needle needs --length N"),
        (["--ruler", "niah_single_1"], "--ruler needs --length N"),
        (["--text", "missing.txt"], "--text missing.txt does not exist; give a UTF-8 text file"),
        (["--needle", "--length", "300", "--rows", "odd:3"], "--rows 'odd:3'"),
        (["--needle", "--length", "300", "--layers", "7"], "--layers [7]: tiny has layers 0..3"),
        (["--ruler", "nope", "--length", "300"], "--ruler nope is not a RULER-style task"),
        (["--needle", "--length", "300", "--results", "nowhere"], "--results nowhere does not exist; give a"),
    ],
)
def test_the_command_refuses_bad_options_with_a_message(checkpoint, args, message, tmp_path):
    out = CliRunner().invoke(cli, ["explore", str(checkpoint), *args, "--no-open"])
    assert out.exit_code == 2 and message in out.output, out.output


def test_a_missing_checkpoint_is_named(tmp_path):
    out = CliRunner().invoke(cli, ["explore", str(tmp_path / "none"), "--needle", "--length", "300"])
    assert out.exit_code == 2 and "none does not exist; give a model folder" in out.output


def test_export_from_the_command_line_on_a_local_hugging_face_model(hf_models, tmp_path):
    (tmp_path / "t.txt").write_text("The quick brown fox jumps over the lazy dog. " * 30)
    out_file = tmp_path / "page.html"
    args = ["explore", str(hf_models["qwen2"]), "--text", str(tmp_path / "t.txt"), "--length", "200"]
    out = CliRunner().invoke(cli, [*args, "--export", str(out_file), "--export-levels", "1"])
    assert out.exit_code == 0, out.output
    page = out_file.read_text()
    assert "wrote" in out.output and '"name":"qwen2"' in page and '"length":200' in page
    refused = CliRunner().invoke(cli, [*args, "--export", str(tmp_path)])
    assert refused.exit_code == 2 and "give an HTML file path" in refused.output


def _serve(args: list[str]) -> tuple[subprocess.Popen, str]:
    """Start ``headprobe explore ARGS`` and return the process and the URL it printed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "headprobe", "explore", *args, "--no-open"],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # Ctrl-C as from a terminal
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )
    for line in proc.stdout:
        if line.startswith("headprobe explore: http"):
            return proc, line.split()[2]
    raise AssertionError(f"no URL printed; stderr: {proc.stderr.read()}")


def test_the_server_binds_localhost_and_ctrl_c_stops_it_cleanly(checkpoint):
    import httpx

    proc, url = _serve([str(checkpoint), "--needle", "--length", "300", "--port", "0"])
    try:
        assert url.startswith("http://127.0.0.1:")
        info = httpx.get(url + "api/info", timeout=30).json()
        assert info["models"][0]["name"] == "tiny" and info["models"][0]["length"] == 300
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "stopped" in out and "Traceback" not in err
    assert "warning" not in err


def test_binding_elsewhere_says_so(checkpoint):
    import httpx

    proc, url = _serve([str(checkpoint), "--needle", "--length", "300", "--host", "0.0.0.0"])
    assert url.startswith("http://127.0.0.1:")  # reachable here too
    assert httpx.get(url + "api/info", timeout=30).status_code == 200
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert "warning: serving on 0.0.0.0, not only this machine" in err


def test_export_embeds_exactly_what_the_server_answers(needle_view, tmp_path):
    from headprobe.explore.export import ExportSettings, api_key, export_page, export_requests, page_data, plan_export

    plan = plan_export([needle_view], ExportSettings(export_heads="all", export_levels=2))
    page = export_page([needle_view], tmp_path / "p.html", plan).read_text()
    data = page_data(page)
    asked = export_requests([needle_view], plan)
    assert set(data["answers"]) == {api_key(r, p) for r, p in asked}
    tiles = [p for r, p in asked if r == "tile"]
    assert {p["level"] for p in tiles} == {1, 2} and all(p["col"] <= p["row"] for p in tiles)
    key = api_key("tile", dict(model=0, layer=3, head=0, level=1, row=0, col=0))
    served = api_answer([needle_view], "tile", dict(model="0", layer="3", head="0", level="1", row="0", col="0"))
    # the same answer but for its values, coded compactly (tests/test_explore_export.py decodes them)
    assert data["answers"][key].keys() == served.keys() and data["answers"][key]["data"] != served["data"]
    assert {k: v for k, v in data["answers"][key].items() if k != "data"} == {
        k: served[k] for k in served if k != "data"
    }
    row = api_key("row", dict(model=0, layer=3, head=0, pos=needle_view.input.question[0], k=10))
    assert data["answers"][row] == api_answer(
        [needle_view], "row", dict(model="0", layer="3", head="0", pos=str(needle_view.input.question[0]), k="10")
    )
    assert 'src="static/' not in page and "http" not in page.split("<script>", 1)[0]


# -- the page in a real browser --------------------------------------------------------------------
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SHOTS = Path(os.environ.get("HEADPROBE_SCREENSHOTS", "")) if os.environ.get("HEADPROBE_SCREENSHOTS") else None


PIXEL = "Array.from(document.querySelector('canvas[data-model=\"0\"]').getContext('2d').getImageData"


def _colour(t: float, cmap: dict) -> list[int]:
    """The colour map's piecewise-linear interpolation, written from colormap.json's words."""
    t = min(1.0, max(0.0, t))
    anchors = cmap["anchors"]
    for (t0, c0), (t1, c1) in itertools.pairwise(anchors):
        if t <= t1:
            return [round(a + (t - t0) / (t1 - t0) * (b - a)) for a, b in zip(c0, c1, strict=True)]
    return anchors[-1][1]


@pytest.fixture(scope="module")
def served(trained_runs, tmp_path_factory):
    """The explorer on the trained toy-d64 (and, compared, the same model untrained) over a 512-token
    needle prompt, served on a free port in this process."""
    import socket

    import uvicorn

    from headprobe.explore import create_app

    trained = load_model(Path(trained_runs) / "toy-d64" / "s0" / "pt" / "final")
    untrained_path = tmp_path_factory.mktemp("untrained") / "toy-d64-untrained"
    torch.manual_seed(0)
    save_checkpoint(Transformer(trained.model.cfg), untrained_path, trained.tokenizer)
    untrained = load_model(untrained_path)
    views = [
        ModelView(trained, needle_input(trained, 512, 50.0, seed=0, needles="codes"), "toy-d64 trained"),
        ModelView(untrained, needle_input(untrained, 512, 50.0, seed=0, needles="codes"), "toy-d64 untrained"),
    ]
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(views[:1]), log_level="warning"))
    compare = uvicorn.Server(uvicorn.Config(create_app(views), log_level="warning"))
    sock2 = socket.socket()
    sock2.bind(("127.0.0.1", 0))
    threads = [
        threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True),
        threading.Thread(target=compare.run, kwargs={"sockets": [sock2]}, daemon=True),
    ]
    for t in threads:
        t.start()
    import time

    while not (server.started and compare.started):
        time.sleep(0.05)
    yield views, f"http://127.0.0.1:{sock.getsockname()[1]}/", f"http://127.0.0.1:{sock2.getsockname()[1]}/"
    server.should_exit = compare.should_exit = True
    for t in threads:
        t.join(timeout=10)


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("needs Debian's chromium (apt-get install chromium)")
    playwright = pytest.importorskip("playwright.sync_api", reason="needs playwright (the dev extra)")
    flags = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-sync"]
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=flags)
        yield b
        b.close()


def _open(browser, url: str, errors: list[str], width: int = 1300):
    page = browser.new_page(viewport={"width": width, "height": 1100})
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_function("window.hp && window.hp.state.info !== null && document.querySelector('table.heads')")
    page.evaluate("hp.idle()")
    return page


def _shot(page, name: str, tmp_path: Path) -> None:
    folder = SHOTS or tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"{name}.png"), full_page=True)


def test_the_page_draws_the_values_the_api_returned(served, browser, tmp_path):
    import httpx

    views, url, _ = served
    view = views[0]
    errors: list[str] = []
    page = _open(browser, url, errors)
    _shot(page, "overview", tmp_path)
    page.select_option("#metric", "needle_mass")
    page.evaluate("hp.idle()")
    cells = page.eval_on_selector_all(
        "table.heads[data-model='0'] td.cell", "cs => cs.map(c => [+c.dataset.layer, +c.dataset.head, c.title])"
    )
    assert [(layer, head) for layer, head, _ in cells] == [(i.index, h) for i in view.layers for h in range(i.n_heads)]
    for layer, head, title in cells:
        assert float(title.rsplit(": ", 1)[1]) == pytest.approx(view.metrics["needle_mass"][layer, head], rel=1e-6)

    # open the full layer's head 0: the whole map at one pixel per token (512 tokens on 512 pixels)
    page.click("table.heads[data-model='0'] td.cell[data-layer='1'][data-head='0']")
    page.select_option("#scale", "linear")
    page.uncheck("#marks")  # the diagonal, band and needle marks drawn over the map
    page.evaluate("hp.setView({u0: 0, v0: 0, zoom: 1})")
    page.evaluate("hp.idle()")
    cmap = httpx.get(url + "static/colormap.json").json()
    tiles = {
        (r, c): httpx.get(url + "api/tile", params=dict(model=0, layer=1, head=0, level=0, row=r, col=c)).json()
        for r in range(2)
        for c in range(r + 1)
    }
    values = {
        key: np.frombuffer(base64.b64decode(t["data"]), dtype="<f4").reshape(t["rows"], t["cols"])
        for key, t in tiles.items()
    }
    vmax = max(t["max"] for t in tiles.values())
    assert page.evaluate("hp.state.vmax") == pytest.approx(vmax)
    rng = np.random.default_rng(0)
    points = [(int(q), int(rng.integers(0, q + 1))) for q in rng.integers(0, 512, 40)] + [(511, 0), (300, 300), (5, 1)]
    for q, k in points:
        want = _colour(float(values[(q // 256, k // 256)][q % 256, k % 256]) / vmax, cmap)
        got = page.evaluate(f"{PIXEL}({k}, {q}, 1, 1).data)")
        assert got[:3] == pytest.approx(want, abs=1), (q, k)
    above = page.evaluate(f"{PIXEL}(400, 100, 1, 1).data)")
    assert above[:3] == cmap["background"]  # above the diagonal: nothing is seen

    page.check("#marks")
    page.select_option("#scale", "log")
    page.evaluate("hp.idle()")
    _shot(page, "map", tmp_path)
    # zoom to token level around the needle: the cells' labels are the tokens the API returns
    (a, _), q = view.input.spans[0], view.input.question[1] - 1
    page.evaluate(f"hp.centerOn({q}, {a})")
    page.evaluate("hp.idle()")
    page.evaluate("hp.idle()")
    _shot(page, "tokens", tmp_path)
    labels = page.evaluate("hp.state.labels")
    keys = [(x["pos"], x["text"]) for x in labels if x["axis"] == "key" and x["model"] == 0]
    assert keys and any(pos == a for pos, _ in keys)
    tokens = httpx.get(url + "api/tokens", params=dict(model=0, start=0, end=512)).json()["tokens"]
    assert all(text == tokens[pos] for pos, text in keys)

    # click a query token: its top keys are highlighted with the API's probabilities
    page.click(f"#tokens span.tok[data-pos='{q}']")
    page.evaluate("hp.idle()")
    row = httpx.get(url + "api/row", params=dict(model=0, layer=1, head=0, pos=q, k=10)).json()
    marked = page.eval_on_selector_all("#tokens span.topkey", "s => s.map(x => +x.dataset.pos)")
    shown = [k for k in row["keys"] if abs(k - q) <= 300]
    assert sorted(marked) == sorted(shown) and shown
    listed = page.eval_on_selector_all("#topk a", "s => s.map(x => +x.dataset.pos)")
    assert listed == row["keys"]
    assert f"entropy {row['entropy']:.3f} nats" in page.inner_text("#row-info")
    page.evaluate("document.getElementById('needle-panel').scrollIntoView()")
    _shot(page, "needle", tmp_path)
    needle_rows = page.eval_on_selector_all("#needle table tr", "rs => rs.slice(1).map(r => r.cells[2].textContent)")
    argmax = view.evidence["argmax"][:, 1, 0]
    assert [int(t.split()[0]) for t in needle_rows] == argmax.tolist()
    line = page.inner_text("#needle-head")
    assert f"retrieval score {view.metrics['retrieval'][1, 0]:.3f}" in line
    assert f"question rows {view.metrics['needle_mass'][1, 0]:.3f}" in line
    assert not errors, errors


def test_compare_shows_two_models_with_linked_zoom(served, browser, tmp_path):
    _, _, url = served
    errors: list[str] = []
    page = _open(browser, url, errors, width=1400)
    page.click("table.heads[data-model='0'] td.cell[data-layer='3'][data-head='1']")
    page.evaluate("hp.idle()")
    assert page.evaluate("hp.state.heads.map(h => [h.layer, h.head])") == [[3, 1], [3, 1]]
    canvas = page.locator("canvas[data-model='1']")
    box = canvas.bounding_box()
    page.mouse.move(box["x"] + 300, box["y"] + 350)
    for _ in range(6):
        page.mouse.wheel(0, -100)
    page.evaluate("hp.idle()")
    _shot(page, "compare", tmp_path)
    view = page.evaluate("hp.state.view")
    assert view["zoom"] > 3  # both maps draw from this one view
    drawn = page.evaluate("hp.state.maps.length")
    assert drawn == 2 and not errors, errors


def open_page_file(browser, path: Path) -> tuple[Any, list[str], list[str]]:
    """An exported page opened from its file in the browser, once its overview is drawn; with the console
    errors and the requested URLs it collects from then on."""
    errors: list[str] = []
    requests: list[str] = []
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(path.as_uri())
    page.wait_for_function("window.hp && window.hp.state.info !== null && document.querySelector('table.heads')")
    return page, errors, requests


def test_the_exported_page_works_from_a_file_without_a_server(served, browser, tmp_path):
    from headprobe.explore.export import ExportSettings, export_page, plan_export

    views, _, _ = served
    path = export_page(views[:1], tmp_path / "explore.html", plan_export(views[:1], ExportSettings(export_heads="all")))
    page, errors, requests = open_page_file(browser, path)
    page.click("table.heads td.cell[data-layer='1'][data-head='1']")
    page.evaluate("hp.idle()")
    page.wait_for_timeout(200)
    blank = page.evaluate(
        "(() => { const d = document.querySelector('canvas').getContext('2d').getImageData(0, 0, 512, 512).data;"
        " let n = 0; for (let i = 0; i < d.length; i += 4) if (d[i] !== 245) n++; return n; })()"
    )
    assert blank > 10000  # the embedded tiles are drawn
    assert not errors, errors
    assert all(u.startswith(("file:", "data:")) for u in requests), requests


def test_a_page_of_a_few_heads_decodes_them_and_says_what_it_left_out(checkpoint, browser, tmp_path):
    """A tiny checkpoint's page of two heads (no trained model needed): the page decodes the coded tiles to
    the values the library decodes, greys out the other heads and says how to include them."""
    from headprobe.explore.export import decode_tile, page_data, visible_columns

    path = tmp_path / "explore.html"
    args = [
        "explore",
        str(checkpoint),
        "--needle",
        "--length",
        "600",
        "--export",
        str(path),
        "--export-heads",
        "3.1,0.2",
    ]
    assert CliRunner().invoke(cli, args).exit_code == 0
    data = page_data(path.read_text())
    page, errors, requests = open_page_file(browser, path)
    assert "the maps of 2 of 14 heads of tiny (named: 3.1,0.2)" in page.inner_text("#export-note")
    absent = page.eval_on_selector_all("td.cell.absent", "cs => cs.map(c => [+c.dataset.layer, +c.dataset.head])")
    layers = [(0, 4), (1, 4), (2, 4), (3, 2)]
    assert sorted(map(tuple, absent)) == [(i, h) for i, n in layers for h in range(n) if (i, h) not in ((3, 1), (0, 2))]
    page.click("td.cell[data-layer='1'][data-head='0']")  # left out: says how to include it, opens nothing
    assert "--export-heads 1.0" in page.inner_text("#status") and page.evaluate("hp.state.heads.length") == 0

    page.click("td.cell[data-layer='3'][data-head='1']")
    page.evaluate("hp.idle()")
    page.wait_for_timeout(200)
    _shot(page, "export", tmp_path)
    # 600 tokens on 512 pixels want level 0; the page holds levels 2 and 1 and says it magnifies level 1
    assert "zoomed past this page's finest level (2 tokens a pixel)" in page.inner_text("#status")
    loaded = page.evaluate("Array.from(hp.tiles).filter(([, t]) => t.meta).map(([k, t]) => [k, Array.from(t.values)])")
    assert loaded
    for key, values in loaded:
        m, layer, head, level, row, col = map(int, key.split("/"))
        tile = data["answers"][f"tile?col={col}&head={head}&layer={layer}&level={level}&model={m}&row={row}"]
        lo, hi = visible_columns(TileSpec(level, row, col), 600, None)
        want = decode_tile(base64.b64decode(tile["data"]), tile["max"], lo, hi, tile["cols"]).ravel()
        np.testing.assert_allclose(values, want, rtol=1e-6, atol=0)  # float32 in the page
    blank = page.evaluate(
        "(() => { const d = document.querySelector('canvas').getContext('2d').getImageData(0, 0, 512, 512).data;"
        " let n = 0; for (let i = 0; i < d.length; i += 4) if (d[i] !== 245) n++; return n; })()"
    )
    assert blank > 10000  # drawn from the embedded levels, the finest magnified
    assert not errors, errors
    assert all(u.startswith(("file:", "data:")) for u in requests), requests
