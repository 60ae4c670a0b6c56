"""Streaming attention statistics against the dense float64 implementation in reference.py."""

from __future__ import annotations

import pytest
import torch
from reference import dense_probs, dense_stats

from headprobe.stats import TILE_KERNELS, attention_stats

CASES = [
    # (heads, kv_heads, q_len, k_len, dim, window, rows, spans, chunk)
    (2, 2, 50, 50, 16, None, None, [(3, 9)], 7),
    (4, 2, 50, 50, 32, 6, None, [(0, 1), (40, 50)], 16),
    (4, 1, 9, 61, 64, 10, None, [(55, 61)], 8),
    (2, 2, 70, 70, 128, None, [0, 1, 33, 69], [(10, 20)], 64),  # rows subset, chunk > most ranges
    (3, 3, 40, 40, 512, 40, [39, 5, 20], [], 13),  # window == length; unsorted rows
    (2, 1, 33, 33, 16, 1, None, [(0, 33)], 5),  # window 1: a single visible key
]


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
@pytest.mark.parametrize("case", CASES)
def test_matches_dense_reference(case, dtype, tol):
    h, hkv, lq, lk, dim, window, rows, spans, chunk = case
    q = torch.randn(2, h, lq, dim, dtype=torch.float64)
    k = torch.randn(2, hkv, lk, dim, dtype=torch.float64)
    rows_t = torch.arange(lq) if rows is None else torch.tensor(rows)
    scale = dim**-0.5
    got = attention_stats(
        q.to(dtype),
        k.to(dtype),
        window=window,
        scale=scale,
        rows=rows_t,
        spans=spans,
        topk=4,
        chunk=chunk,
        row_block=16,
    )
    want = dense_stats(q.to(dtype), k.to(dtype), window, scale, rows_t, spans, 4)
    for name in ("lse", "entropy", "norm_entropy", "max_prob", "mean_distance", "span_mass"):
        torch.testing.assert_close(getattr(got, name).double(), want[name], atol=tol, rtol=tol, msg=name)
    assert torch.equal(got.argmax, want["argmax"])
    n_vis = torch.tensor([min(p + 1, window or p + 1) for p in (rows_t + lk - lq).tolist()])
    kk = min(4, int(n_vis.min()))
    torch.testing.assert_close(got.topk_prob[..., :kk].double(), want["topk_prob"][..., :kk], atol=tol, rtol=tol)
    assert torch.equal(got.visible, n_vis)
    assert torch.equal(got.positions, rows_t + lk - lq)


def test_topk_indices_are_the_largest_probabilities():
    q = torch.randn(1, 2, 30, 8, dtype=torch.float64)
    k = torch.randn(1, 2, 30, 8, dtype=torch.float64)
    st = attention_stats(q, k, window=12, topk=5, chunk=4)
    p = dense_probs(q, k, 12, 8**-0.5)
    for hd in range(2):
        for row in range(30):
            lo = max(0, row - 11)
            order = torch.argsort(p[0, hd, row, lo : row + 1], descending=True)[:5] + lo
            n = min(5, row + 1 - lo)
            assert st.topk_idx[0, hd, row, :n].tolist() == order[:n].tolist()
            assert st.topk_idx[0, hd, row, n:].tolist() == [-1] * (5 - n)


def test_argmax_ties_go_to_the_first_key():
    # identical keys: every score ties; the first visible key must win, across tile boundaries too
    q = torch.randn(1, 1, 20, 4)
    k = torch.ones(1, 1, 20, 4)
    for window in (None, 5):
        st = attention_stats(q, k, window=window, chunk=3)
        first = [0 if window is None else max(0, p - window + 1) for p in range(20)]
        assert st.argmax[0, 0].tolist() == first
        torch.testing.assert_close(st.entropy[0, 0], torch.log(st.visible.float()), atol=1e-5, rtol=0)


@pytest.mark.parametrize("tiles", list(TILE_KERNELS))
@pytest.mark.parametrize("window", [None, 9])
def test_every_tile_kernel_matches_the_dense_reference(window, tiles):
    """Every registered tile kernel (eager; compiled, used on long inputs) against the dense reference."""
    q = torch.randn(1, 4, 80, 32, dtype=torch.float64)
    k = torch.randn(1, 2, 80, 32, dtype=torch.float64)
    spans = [(10, 30)]
    got = attention_stats(q.float(), k.float(), window=window, spans=spans, topk=3, chunk=24, tiles=tiles)
    want = dense_stats(q, k, window, 32**-0.5, torch.arange(80), spans, 3)
    for name in ("lse", "entropy", "norm_entropy", "max_prob", "mean_distance", "span_mass"):
        torch.testing.assert_close(getattr(got, name).double(), want[name], atol=1e-5, rtol=1e-5, msg=name)
    assert torch.equal(got.argmax, want["argmax"])


def test_chunk_sizes_do_not_change_results():
    q = torch.randn(1, 4, 100, 16)
    k = torch.randn(1, 2, 100, 16)
    ref = attention_stats(q, k, window=17, chunk=100)
    for chunk in (1, 7, 32, 99, 1000):
        got = attention_stats(q, k, window=17, chunk=chunk, row_block=13)
        torch.testing.assert_close(got.entropy, ref.entropy, atol=1e-5, rtol=0)
        assert torch.equal(got.argmax, ref.argmax)


def test_bad_arguments():
    q, k = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match="rows must be"):
        attention_stats(q, k, rows=torch.tensor([5]))
    with pytest.raises(ValueError, match="span"):
        attention_stats(q, k, spans=[(3, 3)])
    with pytest.raises(ValueError, match="not a multiple"):
        attention_stats(torch.randn(1, 3, 5, 8), k)
    with pytest.raises(ValueError, match="q_len"):
        attention_stats(torch.randn(1, 2, 6, 8), k)


def _triton_runs() -> str | None:
    from headprobe.model.kernels.runtime import unsupported_device

    return unsupported_device(torch.device("cuda" if torch.cuda.is_available() else "cpu"), torch.float32)


fused = pytest.mark.skipif(_triton_runs() is not None, reason=f"the Triton kernel cannot run here: {_triton_runs()}")


@fused
@pytest.mark.parametrize("topk", [4, 0])
@pytest.mark.parametrize("case", CASES)
def test_the_fused_triton_kernel_matches_the_dense_reference(case, topk):
    """One Triton kernel for the whole pass (CPU: Triton's interpreter; GPU: compiled), float32 within 1e-5."""
    h, hkv, lq, lk, dim, window, rows, spans, _ = case
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q = torch.randn(2, h, lq, dim, dtype=torch.float64)
    k = torch.randn(2, hkv, lk, dim, dtype=torch.float64)
    rows_t = torch.arange(lq) if rows is None else torch.tensor(rows)
    got = attention_stats(q.float().to(device), k.float().to(device), window=window, rows=rows_t.to(device),
                          spans=spans, topk=topk, tiles="triton").to("cpu")  # fmt: skip
    want = dense_stats(q, k, window, dim**-0.5, rows_t, spans, 4)
    for name in ("lse", "entropy", "norm_entropy", "max_prob", "mean_distance", "span_mass"):
        torch.testing.assert_close(getattr(got, name).double(), want[name], atol=1e-5, rtol=1e-5, msg=name)
    assert torch.equal(got.argmax, want["argmax"])
    if topk:
        kk = min(4, int(got.visible.min()))
        torch.testing.assert_close(got.topk_prob[..., :kk].double(), want["topk_prob"][..., :kk], atol=1e-5, rtol=0)
    else:
        assert got.topk_idx.shape[-1] == 0


@fused
def test_the_fused_kernel_breaks_argmax_ties_to_the_first_key_across_tiles():
    # every score ties exactly (small integers: any summation order gives the same float); tiles of 32 keys
    q, k = torch.randint(-3, 4, (1, 1, 70, 16)).float(), torch.ones(1, 1, 70, 16)
    for window in (None, 40):
        st = attention_stats(q, k, window=window, topk=0, tiles="triton")
        assert st.argmax[0, 0].tolist() == [0 if window is None else max(0, p - window + 1) for p in range(70)]


def test_the_fused_kernel_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="tiles='triton' cannot run here"):
        attention_stats(torch.randn(1, 1, 8, 16, dtype=torch.float64), torch.randn(1, 1, 8, 16), tiles="triton")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("length,window", [(4096, None), (32768, 512), (32768, None)])
def test_cuda_fused_kernel_matches_the_engine_at_long_lengths(dtype, length, window):
    """Compiled on the GPU, against the tile engine (itself held to float64 above) on 256 rows spread
    over the whole length, both reading the same bf16/fp32 q and k."""
    q = torch.randn(1, 4, length, 128, device="cuda").to(dtype)
    k = torch.randn(1, 2, length, 128, device="cuda").to(dtype)
    rows = torch.linspace(0, length - 1, 256, device="cuda").long()
    spans = [(0, 64), (length // 2, length // 2 + 100)]
    got = attention_stats(q, k, window=window, rows=rows, spans=spans, topk=4, tiles="triton")
    want = attention_stats(q.float(), k.float(), window=window, rows=rows, spans=spans, topk=4, tiles="eager")
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    for name in ("lse", "entropy", "max_prob", "mean_distance", "span_mass", "topk_prob"):
        torch.testing.assert_close(getattr(got, name).float(), getattr(want, name).float(), atol=tol, rtol=tol)
    if dtype == torch.float32:
        assert (got.argmax == want.argmax).float().mean() > 0.99  # near-ties may flip in another summation order
