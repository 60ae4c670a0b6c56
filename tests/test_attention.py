"""Every attention backend on this machine against the reference, and the reference against a loop."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import dense_probs, loop_attention
from torch.utils._python_dispatch import TorchDispatchMode

from headprobe.model import attention as attn_mod
from headprobe.model.attention import AttentionBackendError, FlexBackend, attention, select_backend

# (heads, kv_heads, q_len, k_len, qk_dim, v_dim, window)
CASES = {
    "causal": (2, 2, 37, 37, 16, 16, None),
    "window": (2, 2, 37, 37, 16, 16, 5),
    "window-1": (2, 2, 20, 20, 8, 8, 1),
    "window>=len": (2, 2, 20, 20, 8, 8, 64),
    "decode-1": (2, 2, 1, 30, 16, 16, 6),
    "decode-1-full": (2, 2, 1, 30, 16, 16, None),
    "chunk-after-cache": (2, 1, 7, 30, 16, 16, 6),
    "chunk-after-cache-full": (2, 2, 7, 30, 16, 16, None),
    "gqa": (4, 2, 33, 33, 16, 16, 9),
    "gqa-full": (6, 2, 33, 33, 16, 16, None),
    "qk>v": (2, 2, 41, 41, 32, 8, 7),
    "qk<v": (2, 2, 41, 41, 8, 32, None),
    "qk<v-window": (2, 1, 41, 41, 8, 20, 7),  # v_dim not a multiple of qk_dim
    "qk>v-full-gqa": (4, 2, 41, 41, 64, 16, None),
    "gqa-decode-1": (6, 2, 1, 50, 16, 16, None),
    "gqa-chunk-window": (6, 2, 5, 50, 16, 24, 7),
    "gqa-chunk-qk>v": (8, 2, 3, 50, 32, 8, None),
}


def make(case, dtype=torch.float32, batch=2, requires_grad=False):
    h, hkv, lq, lk, dqk, dv, window = CASES[case]
    q = torch.randn(batch, h, lq, dqk, dtype=torch.float64)
    k = torch.randn(batch, hkv, lk, dqk, dtype=torch.float64)
    v = torch.randn(batch, hkv, lk, dv, dtype=torch.float64)
    ts = [t.to(dtype).requires_grad_(requires_grad) for t in (q, k, v)]
    return (*ts, window)


def cpu_backends():
    """Backends that run on this machine's CPU; flex is used eagerly here (compiled case below)."""
    return {"sdpa": attn_mod.BACKENDS["sdpa"], "flex-eager": FlexBackend(compile=False)}


def test_reference_matches_per_query_loop():
    for case in ("window", "chunk-after-cache", "gqa", "qk<v-window", "causal"):
        q, k, v, window = make(case, torch.float64, batch=1)
        scale = 0.3
        got = attention(q, k, v, window=window, scale=scale, backend="reference")
        torch.testing.assert_close(got, loop_attention(q, k, v, window, scale), atol=1e-12, rtol=0)


@pytest.mark.parametrize("backend", ["sdpa", "flex-eager"])
@pytest.mark.parametrize("case", list(CASES))
def test_backend_matches_reference_float32(backend, case):
    q, k, v, window = make(case, torch.float32)
    ref = attention(q.double(), k.double(), v.double(), window=window, backend="reference")
    with torch.no_grad():
        got = cpu_backends()[backend](q, k, v, attn_mod.CausalMask(window), q.shape[-1] ** -0.5)
    assert got.shape == ref.shape and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("backend", ["sdpa", "flex-eager"])
@pytest.mark.parametrize("case", ["window", "gqa", "qk>v", "qk<v", "chunk-after-cache"])
def test_backend_matches_reference_bfloat16(backend, case):
    q, k, v, window = make(case, torch.bfloat16)
    ref = attention(q.double(), k.double(), v.double(), window=window, backend="reference")
    with torch.no_grad():
        got = cpu_backends()[backend](q, k, v, attn_mod.CausalMask(window), q.shape[-1] ** -0.5)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), ref, atol=3e-2, rtol=3e-2)


def test_sdpa_float64():
    q, k, v, window = make("qk<v-window", torch.float64)
    ref = attention(q, k, v, window=window, backend="reference")
    torch.testing.assert_close(attention(q, k, v, window=window, backend="sdpa"), ref, atol=1e-12, rtol=0)


def test_flex_compiled_matches_reference():
    q, k, v, window = make("qk>v-full-gqa", torch.float32)
    q2, k2, v2, w2 = make("window", torch.float32)
    with torch.no_grad():
        for a, b, c, w in ((q, k, v, window), (q2, k2, v2, w2)):
            ref = attention(a.double(), b.double(), c.double(), window=w, backend="reference")
            got = attention(a, b, c, window=w, backend="flex")
            torch.testing.assert_close(got.double(), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "case", ["window", "gqa", "qk>v", "qk<v-window", "chunk-after-cache-full", "causal", "gqa-chunk-window"]
)
def test_sdpa_gradients_match_reference(case):
    q, k, v, window = make(case, torch.float64, requires_grad=True)
    w = torch.randn(q.shape[0], q.shape[1], q.shape[2], v.shape[-1], dtype=torch.float64)
    grads = {}
    for backend in ("reference", "sdpa"):
        for t in (q, k, v):
            t.grad = None
        (attention(q, k, v, window=window, backend=backend) * w).sum().backward()
        grads[backend] = [t.grad.clone() for t in (q, k, v)]
    for a, b in zip(grads["reference"], grads["sdpa"], strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


@pytest.mark.parametrize("backend", ["reference", "sdpa", "flex-eager"])
@pytest.mark.parametrize("window", [None, 1, 4, 13, 100])
@pytest.mark.parametrize("q_len", [1, 9, 40])
def test_black_box_window(backend, window, q_len):
    """q = k = 0 makes attention uniform over the visible keys, so with v = key position each output
    must be the mean of exactly the visible positions: (first + last) / 2."""
    k_len = 40
    q = torch.zeros(1, 2, q_len, 8)
    k = torch.zeros(1, 2, k_len, 8)
    v = torch.arange(k_len, dtype=torch.float32).view(1, 1, k_len, 1).expand(1, 2, k_len, 8).contiguous()
    fn = {"flex-eager": cpu_backends()["flex-eager"]}.get(backend)
    with torch.no_grad():
        if fn is None:
            out = attention(q, k, v, window=window, backend=backend)
        else:
            out = fn(q, k, v, attn_mod.CausalMask(window), 1.0)
    for i in range(q_len):
        pos = k_len - q_len + i
        first = 0 if window is None else max(0, pos - window + 1)
        assert out[0, :, i].sub((first + pos) / 2).abs().max() < 1e-4, (i, pos, window)


def test_sdpa_never_builds_quadratic_masks(monkeypatch):
    """Sliding windows at L=4096 must run as query blocks against their key band, and on CPU every
    SDPA call must have equal qk/v widths (the fused kernel's condition)."""
    calls = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        calls.append((q.shape, k.shape, v.shape, None if attn_mask is None else attn_mask.numel()))
        return real(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(attn_mod.F, "scaled_dot_product_attention", spy)
    L, W = 4096, 64
    q = torch.randn(1, 2, L, 16)
    k = torch.randn(1, 2, L, 16)
    v = torch.randn(1, 2, L, 40)
    with torch.no_grad():
        attention(q, k, v, window=W, backend="sdpa")
    block = attn_mod.BACKENDS["sdpa"].block_q
    assert calls, "SDPA was not called"
    for qs, ks, vs, mask_numel in calls:
        assert qs[-1] == vs[-1]
        assert ks[2] <= block + W - 1
        assert mask_numel is None or mask_numel <= block * (block + W - 1)
    calls.clear()
    with torch.no_grad():
        attention(q, k, v[..., :16], window=None, backend="sdpa")
    assert len(calls) == 1 and calls[0][3] is None  # one fused causal call, no mask tensor


def test_sdpa_refuses_its_quadratic_math_fallback(monkeypatch):
    """When no fused kernel accepts the inputs, SDPA would quietly build L x L; we raise instead."""
    from torch.nn.attention import SDPBackend

    monkeypatch.setattr(attn_mod, "_FUSED_SDPA_CPU", [SDPBackend.EFFICIENT_ATTENTION])  # CUDA-only kernel
    q, k, v = (torch.randn(2, 2, 80, 16) for _ in range(3))
    window = attn_mod.LOCAL_MAX_WINDOW + 8  # wider than local blocks take: SDPA's blocks
    with pytest.raises(AttentionBackendError, match=r"math fallback would build the full L x L.*flex"):
        attention(q, k, v, window=window, backend="sdpa")


def test_auto_on_cpu_is_sdpa_never_reference():
    q = torch.randn(1, 2, 8192, 32)
    k = torch.randn(1, 2, 8192, 32)
    for v_dim in (32, 8, 128):
        v = torch.randn(1, 2, 8192, v_dim)
        for window in (None, 512):
            assert select_backend(q, k, v, window=window) == "sdpa"
            q.requires_grad_(True)
            assert select_backend(q, k, v, window=window) == "sdpa"
            q.requires_grad_(False)


def test_flex_backward_on_cpu_is_refused_with_alternative():
    q, k, v, window = make("window", requires_grad=True)
    with pytest.raises(AttentionBackendError, match=r"no backward pass on CPU.*sdpa"):
        attention(q, k, v, window=window, backend="flex")


@pytest.mark.parametrize(
    "dims, dtype, match",
    [
        ((512, 128), torch.bfloat16, "qk_dim == v_dim"),
        ((512, 512), torch.bfloat16, "head widths <= 256"),
        ((128, 128), torch.float32, "float16/bfloat16"),
        ((128, 128), torch.bfloat16, "CUDA only"),
    ],
)
def test_flash_limits_are_named(dims, dtype, match):
    dqk, dv = dims
    q, k, v = (
        torch.zeros(1, 2, 4, dqk, dtype=dtype),
        torch.zeros(1, 2, 4, dqk, dtype=dtype),
        torch.zeros(1, 2, 4, dv, dtype=dtype),
    )
    with pytest.raises(AttentionBackendError, match=match) as info:
        attention(q, k, v, backend="flash")
    assert "use backend=" in str(info.value)


def test_bad_shapes_are_named():
    q = torch.zeros(1, 3, 4, 8)
    with pytest.raises(ValueError, match="not a multiple of kv_heads"):
        attention(q, torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8))
    with pytest.raises(ValueError, match="qk_dim"):
        attention(torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 6), torch.zeros(1, 2, 4, 8))
    with pytest.raises(ValueError, match="q_len"):
        attention(torch.zeros(1, 2, 9, 8), torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8))
    with pytest.raises(ValueError, match="unknown attention backend"):
        attention(torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8), backend="fast")


@settings(max_examples=40, deadline=None)
@given(
    groups=st.integers(1, 3),
    kv_heads=st.integers(1, 2),
    k_len=st.integers(1, 70),
    q_frac=st.floats(0.01, 1.0),
    qk=st.sampled_from([4, 8, 12, 32]),
    v=st.sampled_from([4, 8, 20, 32]),
    window=st.one_of(st.none(), st.integers(1, 80)),
    block=st.sampled_from([3, 16, 256]),
)
def test_sdpa_property(groups, kv_heads, k_len, q_frac, qk, v, window, block):
    q_len = max(1, round(q_frac * k_len))
    h = groups * kv_heads
    q = torch.randn(1, h, q_len, qk, dtype=torch.float64)
    k = torch.randn(1, kv_heads, k_len, qk, dtype=torch.float64)
    val = torch.randn(1, kv_heads, k_len, v, dtype=torch.float64)
    ref = attention(q, k, val, window=window, backend="reference")
    got = attn_mod.SdpaBackend(block_q=block)(q, k, val, attn_mod.CausalMask(window), qk**-0.5)
    torch.testing.assert_close(got, ref, atol=1e-10, rtol=0)
    assert not math.isnan(float(got.sum()))


def dense_attention(q, k, v, window, scale):
    """Float64 attention from the dense probability matrix of ``tests/reference.py`` (query head ``h``
    reads kv head ``h // groups``), independent of every backend. ``[B, H, Lq, Dv]``."""
    probs = dense_probs(q, k, window, scale)
    return probs @ v.double().repeat_interleave(q.shape[1] // k.shape[1], dim=1)


def gqa_decode_inputs(groups, q_len, k_len, dims, dtype=torch.float32, kv_heads=2, batch=2, spare=37):
    """A decode step as the model makes it: q ``[B, heads, q_len, qk]`` transposed from ``[B, q_len, heads,
    qk]``, k/v the first ``k_len`` entries of a cache buffer with spare room (non-contiguous views)."""
    qk, dv = dims
    h = groups * kv_heads
    q = torch.randn(batch, q_len, h, qk, dtype=torch.float64).to(dtype).transpose(1, 2)
    k = torch.randn(batch, kv_heads, k_len + spare, qk, dtype=torch.float64).to(dtype)[:, :, :k_len]
    v = torch.randn(batch, kv_heads, k_len + spare, dv, dtype=torch.float64).to(dtype)[:, :, :k_len]
    return q, k, v


DECODE_DIMS = {"16/16": (16, 16), "16/40": (16, 40), "32/8": (32, 8), "16/32": (16, 32)}


@pytest.mark.parametrize("dims", list(DECODE_DIMS))
@pytest.mark.parametrize("window", [None, 5, "k_len+1"])
@pytest.mark.parametrize("k_len", [9, 300, 2048])
@pytest.mark.parametrize("q_len", [1, 4])
@pytest.mark.parametrize("groups", [1, 3, 4])
def test_gqa_decode_steps_match_dense_reference(groups, q_len, k_len, window, dims):
    """Decode steps and short query blocks after a cache, grouped-query, against dense float64: SDPA
    (with its CPU v-splitting when the widths differ), the reference backend, and the left-padded
    decode path with no padding."""
    torch.manual_seed(groups * 1000 + q_len * 100 + k_len)
    window = k_len + 1 if window == "k_len+1" else window
    q, k, v = gqa_decode_inputs(groups, q_len, k_len, DECODE_DIMS[dims])
    scale = q.shape[-1] ** -0.5
    want = dense_attention(q, k, v, window, scale)
    no_pad = attn_mod.KeyPadding(torch.zeros(q.shape[0], dtype=torch.long))
    with torch.no_grad():
        got = {
            "sdpa": attention(q, k, v, window=window, backend="sdpa"),
            "sdpa-block3": attn_mod.SdpaBackend(block_q=3)(q, k, v, attn_mod.CausalMask(window), scale),
            "reference": attention(q, k, v, window=window, backend="reference"),
            "padded": attention(q, k, v, window=window, padding=no_pad),
        }
    for name, out in got.items():
        assert out.shape == want.shape and out.dtype == torch.float32, name
        torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("backend", ["sdpa", "flex-eager"])
@pytest.mark.parametrize("window", [None, 6])
def test_gqa_decode_steps_bfloat16(backend, window):
    q, k, v = gqa_decode_inputs(3, 1, 700, (16, 16), torch.bfloat16)
    want = dense_attention(q, k, v, window, 0.25)
    with torch.no_grad():
        got = cpu_backends()[backend](q, k, v, attn_mod.CausalMask(window), 0.25)
    torch.testing.assert_close(got.double(), want, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("window", [None, 64])
@pytest.mark.parametrize("q_len", [1, 4])
def test_gqa_padded_decode_matches_unpadded_rows(q_len, window):
    """Left-padded batched decoding with grouped heads: each row equals that row alone without its padding."""
    q, k, v = gqa_decode_inputs(3, q_len, 500, (16, 24))
    start = torch.tensor([0, 123])
    with torch.no_grad():
        got = attention(q, k, v, window=window, padding=attn_mod.KeyPadding(start))
    for row, first in enumerate(start.tolist()):
        want = dense_attention(q[row : row + 1], k[row : row + 1, :, first:], v[row : row + 1, :, first:], window, 0.25)
        torch.testing.assert_close(got[row : row + 1].double(), want, atol=1e-5, rtol=0)


class _FreshAllocations(TorchDispatchMode):
    """Records the element count of every tensor an aten op returns in new storage (views and in-place
    results share their input's storage and are not counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest: tuple[int, str] = (0, "")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage().data_ptr()
            for t in torch.utils._pytree.tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor)
        }
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.largest = max(self.largest, (t.numel(), f"{func} -> {tuple(t.shape)}"))
        return out


@pytest.mark.parametrize("path", ["sdpa", "reference", "padded"])
@pytest.mark.parametrize("dims", [(64, 64), (64, 128), (64, 40), (32, 8)])
@pytest.mark.parametrize("window", [None, 1000])
@pytest.mark.parametrize("q_len", [1, 4])
def test_gqa_decode_step_never_copies_the_cache(monkeypatch, path, dims, window, q_len):
    """A decode step reads the kv cache in place: no op may allocate a tensor the size of the cache's keys
    (the grouped expansion allocates ``groups`` times that), and ``_expand_kv`` is not called. The one
    allowed cache-sized buffer is the zero-padded tail of ``v`` that SDPA's CPU kernel needs when
    ``v_dim`` is not a multiple of ``qk_dim``."""
    groups, k_len = 4, 2048
    q, k, v = gqa_decode_inputs(groups, q_len, k_len, dims, batch=1)

    def no_expansion(*args, **kwargs):
        raise AssertionError("_expand_kv called during a decode step")

    monkeypatch.setattr(attn_mod, "_expand_kv", no_expansion)
    padded_tail = path == "sdpa" and dims[1] % dims[0] != 0
    allowed = k.numel() if padded_tail else k.numel() // 2
    padding = attn_mod.KeyPadding(torch.tensor([100])) if path == "padded" else None
    spy = _FreshAllocations()
    with torch.no_grad(), spy:
        out = attention(q, k, v, window=window, backend="auto" if padding else path, padding=padding)
    assert out.shape == (1, q.shape[1], q_len, dims[1])
    assert spy.largest[0] <= allowed, f"allocated {spy.largest[1]}; the cache's keys are {tuple(k.shape)}"


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.parametrize("backend", ["sdpa", "flex", "flash", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(CASES))
def test_cuda_backend_matches_reference(backend, dtype, case):
    """GPU paths against the CPU float64 reference, forward and gradients (run wherever CUDA exists)."""
    q, k, v, window = make(case, dtype)
    q, k, v = (t.cuda().requires_grad_(True) for t in (q, k, v))
    try:
        select_backend(q, k, v, window=window, backend=backend)
    except AttentionBackendError as err:
        pytest.skip(str(err))
    qd, kd, vd = (t.detach().cpu().double().requires_grad_(True) for t in (q, k, v))
    ref = attention(qd, kd, vd, window=window, backend="reference")
    out = attention(q, k, v, window=window, backend=backend)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.double().cpu(), ref, atol=tol, rtol=tol)
    w = torch.randn_like(ref)
    (ref * w).sum().backward()
    (out * w.to(out)).sum().backward()
    for got, want in ((q, qd), (k, kd), (v, vd)):
        torch.testing.assert_close(got.grad.double().cpu(), want.grad, atol=5 * tol, rtol=5 * tol)


@pytest.mark.parametrize("window", [1, 2, 8, 17, attn_mod.LOCAL_MAX_WINDOW])
@pytest.mark.parametrize("length", [attn_mod.LOCAL_MAX_WINDOW + 1, 100, 257])
def test_narrow_windows_over_a_sequence_run_as_local_blocks(monkeypatch, window, length):
    """Without gradients, windows up to LOCAL_MAX_WINDOW over a whole sequence take the local-block path (no
    SDPA call); local blocks equal the dense float64 attention of tests/reference.py, values and gradients,
    with grouped-query heads, qk != v and queries transposed from the model's [batch, seq, heads, dim]
    layout (not contiguous). With gradients (training) SDPA's kernel runs, as before local blocks."""
    real, calls = attn_mod.F.scaled_dot_product_attention, []

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(attn_mod.F, "scaled_dot_product_attention", spy)
    q = torch.randn(2, length, 6, 12, dtype=torch.float64).transpose(1, 2).requires_grad_(True)
    k = torch.randn(2, 2, length, 12, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, length, 20, dtype=torch.float64, requires_grad=True)
    want = dense_attention(q, k, v, window, 0.3)
    with torch.no_grad():
        out = attention(q, k, v, window=window, scale=0.3, backend="sdpa")
    assert calls == [] and out.shape == want.shape
    torch.testing.assert_close(out, want, atol=1e-12, rtol=0)
    trained = attention(q, k, v, window=window, scale=0.3, backend="sdpa")
    assert calls, "training must keep SDPA's kernel"
    torch.testing.assert_close(trained, want, atol=1e-10, rtol=0)
    w = torch.randn_like(want)
    local = attn_mod.local_blocks(q, k, v, attn_mod.CausalMask(window), 0.3)
    got = torch.autograd.grad((local * w).sum(), (q, k, v))
    ref = torch.autograd.grad((want * w).sum(), (q, k, v))
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
