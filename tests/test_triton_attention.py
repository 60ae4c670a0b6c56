"""Our Triton attention kernel (forward, backward, LSE) against the dense float64 reference.

On a machine without a GPU the kernels run in Triton's interpreter on CPU float32 tensors (tests/conftest.py
sets TRITON_INTERPRET=1): small lengths, every head shape. On a GPU the same kernels compile, and the CUDA
tests compare them in bfloat16 and float32 at lengths up to 32K.
"""

from __future__ import annotations

import math

import pytest
import torch
from reference import dense_probs, visible

from headprobe.model.attention import AttentionBackendError, attention, select_backend
from headprobe.model.kernels.runtime import interpreting

triton = pytest.importorskip("triton", reason="triton cannot be installed here (Linux only)")

interpreted = pytest.mark.skipif(
    not interpreting(), reason="this process compiles Triton for the GPU (TRITON_INTERPRET unset): see the CUDA tests"
)
cuda = pytest.mark.skipif(not torch.cuda.is_available() or interpreting(), reason="needs a CUDA GPU")


def dense(q, k, v, window, scale):
    """Output and LSE from the full float64 probability matrix (differentiable)."""
    p = dense_probs(q, k, window, scale)
    kk = k.double().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = ((q.double() @ kk.transpose(-1, -2)) * scale).masked_fill(~visible(q.shape[2], k.shape[2], window), -math.inf)
    out = p @ v.double().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return out, torch.logsumexp(s, -1)


def inputs(b, h, hkv, lq, lk, dqk, dv, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(lq * 1000 + dqk + dv)
    q = torch.randn(b, h, lq, dqk, generator=g).to(device, dtype)
    k = torch.randn(b, hkv, lk, dqk, generator=g).to(device, dtype)
    v = torch.randn(b, hkv, lk, dv, generator=g).to(device, dtype)
    return q, k, v


def check(q, k, v, window, atol=2e-5, grad_atol=5e-5):
    """Kernel output, LSE and the gradients of q, k, v against autograd through the float64 reference."""
    from headprobe.model.kernels.attention import triton_attention

    scale = q.shape[-1] ** -0.5
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    out, lse = triton_attention(q, k, v, window=window)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out)
    (out * dout).sum().backward()
    q64, k64, v64 = (t.detach().double().cpu().requires_grad_(True) for t in (q, k, v))
    ref, ref_lse = dense(q64, k64, v64, window, scale)
    (ref * dout.double().cpu()).sum().backward()
    assert out.shape == ref.shape and out.dtype == q.dtype and lse.dtype == torch.float32
    torch.testing.assert_close(out.double().cpu(), ref.detach(), atol=atol, rtol=1e-4)
    torch.testing.assert_close(lse.double().cpu(), ref_lse.detach(), atol=atol, rtol=1e-4)
    for mine, theirs in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        torch.testing.assert_close(mine.double().cpu(), theirs, atol=grad_atol, rtol=1e-3)


# (batch, heads, kv_heads, q_len, k_len, qk_dim, v_dim, window): lengths off the 16-row tiles on purpose
SHAPES = [
    (1, 2, 2, 37, 37, 16, 16, None),
    (1, 2, 2, 37, 37, 32, 32, 8),
    (2, 2, 1, 45, 45, 64, 64, None),  # grouped-query
    (1, 4, 2, 50, 50, 64, 64, 16),  # grouped-query, window
    (1, 2, 2, 33, 33, 128, 128, 16),
    (1, 1, 1, 40, 40, 256, 256, None),
    (1, 1, 1, 24, 24, 512, 512, 9),
    (1, 2, 1, 30, 30, 512, 128, None),  # wide qk, narrow v
    (1, 2, 1, 30, 30, 128, 512, 7),  # narrow qk, wide v
    (1, 2, 2, 35, 35, 64, 16, 5),
    (1, 2, 2, 35, 35, 16, 64, None),
    (1, 2, 2, 29, 29, 24, 40, 6),  # widths that are no power of two (tiles padded)
    (1, 2, 1, 7, 52, 32, 64, None),  # fewer queries than keys: the last 7 positions (a cached prefix)
    (1, 2, 1, 7, 52, 32, 64, 20),
    (1, 1, 1, 40, 40, 32, 32, 1),  # a window of one key: each query sees only itself
    (1, 1, 1, 40, 40, 32, 32, 64),  # a window longer than the sequence: plain causal
]


@interpreted
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}h{}kv{}q{}k{}d{}v{}w{}".format(*s))
def test_forward_lse_and_gradients_equal_the_float64_reference(shape):
    *dims, window = shape
    check(*inputs(*dims), window)


@interpreted
def test_the_1024_wide_shape_runs_forward_and_backward():
    check(*inputs(1, 1, 1, 17, 17, 1024, 1024), None, grad_atol=1e-4)


@interpreted
@pytest.mark.parametrize("window", [None, 16])
def test_key_tiles_outside_the_band_are_never_read(window):
    """Poison whole 16-key tiles no query of a tile can see: the rows that cannot see them stay exact, so
    the kernel skipped those tiles (a sliding window costs O(L * W), not O(L^2))."""
    from headprobe.model.kernels.attention import triton_attention

    q, k, v = inputs(1, 1, 1, 128, 128, 32, 32)
    poisoned_k, poisoned_v = k.clone(), v.clone()
    if window:  # keys 0..63 lie before the band of query tiles starting at 80 (band from 65)
        poisoned_k[:, :, :64], poisoned_v[:, :, :64] = math.nan, math.nan
        clean = slice(80, 128)
    else:  # keys 64.. lie after every query of the tiles before 64
        poisoned_k[:, :, 64:], poisoned_v[:, :, 64:] = math.nan, math.nan
        clean = slice(0, 64)
    out, _ = triton_attention(q, poisoned_k, poisoned_v, window=window)
    ref, _ = dense(q, k, v, window, 32**-0.5)
    assert torch.isfinite(out[:, :, clean]).all()
    torch.testing.assert_close(out[:, :, clean].double(), ref[:, :, clean], atol=2e-5, rtol=1e-4)
    assert torch.isnan(out).any()  # the poison is visible to the other rows: the test can fail


@interpreted
def test_the_triton_backend_is_registered_and_held_to_the_convention():
    """Through attention(): with q = k = 0 and v = position, each row is the mean of exactly its visible
    positions (the project's window rule: W keys including the query's own)."""
    lq = lk = 40
    q, k = torch.zeros(1, 2, lq, 16), torch.zeros(1, 1, lk, 16)
    v = torch.arange(lk, dtype=torch.float32)[None, None, :, None].expand(1, 1, lk, 32).contiguous()
    for window in (None, 1, 5, 39):
        out = attention(q, k, v, window=window, backend="triton")
        vis = visible(lq, lk, window).double()
        want = (vis * torch.arange(lk)).sum(-1) / vis.sum(-1)
        torch.testing.assert_close(out[0, 1, :, 3].double(), want, atol=1e-5, rtol=0)


def test_auto_never_interprets_on_cpu_and_the_backend_names_its_limits():
    q, k, v = inputs(1, 2, 1, 8, 8, 16, 16)
    assert select_backend(q, k, v) != "triton"
    with pytest.raises(AttentionBackendError, match="float32 only"):
        select_backend(q.double(), k.double(), v.double(), backend="triton")
    wide = torch.zeros(1, 1, 4, 2048)
    with pytest.raises(AttentionBackendError, match="widths up to 1024"):
        select_backend(wide, wide, wide, backend="triton")


def test_the_planner_names_the_kernel_each_layer_type_runs_on_a_gpu():
    from headprobe.model.presets import preset
    from headprobe.plan import plan_rows

    rows = {r["name"]: r for r in plan_rows([preset(n) for n in ("0.6b-d128", "0.6b-d512", "0.6b-k512v128")], 4096)}
    assert [rows[n]["full_gpu_backend"] for n in ("0.6b-d128", "0.6b-d512", "0.6b-k512v128")] == [
        "flash",  # 128/128: flash-attn applies
        "triton",  # 512: wider than flash-attn's 256
        "triton",  # 512/128: qk != v
    ]
    assert {r["swa_gpu_backend"] for r in rows.values()} == {"flash"}  # every sliding layer is 128 wide


# ---------------------------------------------------------------------------------------------
# CUDA (skipped without a GPU): the compiled kernels, in bfloat16 and float32, at long lengths
# ---------------------------------------------------------------------------------------------
def blocked_reference(q, k, v, window, scale, rows=1024):
    """Exact attention in float32 one block of query rows at a time (no L x L matrix for the whole call)."""
    lq, lk = q.shape[2], k.shape[2]
    group = q.shape[1] // k.shape[1]
    kk, vv = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    out = torch.empty(*q.shape[:3], v.shape[-1], device=q.device)
    for r0 in range(0, lq, rows):
        r1 = min(lq, r0 + rows)
        i = torch.arange(lk - lq + r0, lk - lq + r1, device=q.device)[:, None]
        j = torch.arange(lk, device=q.device)[None, :]
        seen = (j <= i) & ((i - j < window) if window else True)
        s = (q[:, :, r0:r1].float() @ kk.transpose(-1, -2)) * scale
        out[:, :, r0:r1] = s.masked_fill(~seen, -math.inf).softmax(-1) @ vv
    return out


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("dqk,dv", [(128, 128), (256, 256), (512, 512), (1024, 1024), (512, 128), (128, 512)])
@pytest.mark.parametrize("length,window", [(4096, None), (4096, 512), (32768, 512), (32768, None)])
def test_cuda_forward_matches_the_reference_at_long_lengths(dtype, dqk, dv, length, window):
    from headprobe.model.kernels.attention import triton_attention

    if length > 4096 and max(dqk, dv) > 512:
        pytest.skip("the float32 reference of a 1024-wide head at 32K does not fit a reasonable test")
    q, k, v = inputs(1, 2, 1, length, length, dqk, dv, dtype, "cuda")
    out, _ = triton_attention(q, k, v, window=window)
    ref = blocked_reference(q, k, v, window, dqk**-0.5)
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-4
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


LONG_SHAPES = [(1, 4, 2, 2048, 2048, 512, 128, 512), (1, 2, 1, 2048, 2048, 128, 512, None)]


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [*SHAPES, *LONG_SHAPES])
def test_cuda_gradients_match_the_reference(dtype, shape):
    *dims, window = shape
    loose = dtype == torch.bfloat16
    check(*inputs(*dims, dtype=dtype, device="cuda"), window, atol=3e-2 if loose else 2e-4,
          grad_atol=1e-1 if loose else 1e-3)  # fmt: skip
