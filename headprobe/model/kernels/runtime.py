"""Where our Triton kernels can run, and how that is decided.

Kernels are ``@triton.jit`` functions. Triton compiles them for CUDA tensors, or, when the environment
variable ``TRITON_INTERPRET=1`` is set before Triton is first imported, runs the same code with numpy,
program by program, on CPU tensors (its interpreter). One process is in one mode or the other: the test
suite sets the variable on machines without a GPU (tests/conftest.py), so the CPU path of every kernel
is the GPU code itself, tested in ``make test``; on a GPU machine the kernels compile and the CUDA tests
hold them to the same references. The interpreter supports float32 (not bfloat16 ``tl.dot``) and says
nothing about speed or shared memory.

Kernel modules must not use ``from __future__ import annotations``: Triton reads ``tl.constexpr``
annotations as objects.
"""

from __future__ import annotations

import importlib.util
import os

import torch

INTERPRET = "TRITON_INTERPRET"


def interpreting() -> bool:
    """Whether Triton runs (or, once imported, will run) kernels in its interpreter in this process."""
    import sys

    if "triton" in sys.modules:
        return bool(sys.modules["triton"].knobs.runtime.interpret)
    return os.environ.get(INTERPRET, "0").lower() in ("1", "true", "on", "yes")


def unsupported_device(device: torch.device, dtype: torch.dtype) -> str | None:
    """``None`` when Triton kernels can run on ``device`` with ``dtype`` in this process, else why not (with
    the fix)."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install triton; Linux only)"
    if device.type == "cuda":
        if interpreting():
            return f"{INTERPRET}=1 is set, so Triton interprets on the CPU; unset it to run on the GPU"
        if dtype not in (torch.float16, torch.bfloat16, torch.float32):
            return f"Triton kernels take float16, bfloat16 or float32 on CUDA, got {dtype}"
        return None
    if device.type == "cpu":
        if not interpreting():
            return f"Triton runs on CPU tensors only in its interpreter: set {INTERPRET}=1 before Python starts"
        if dtype != torch.float32:
            return f"Triton's interpreter computes float32 only (no bfloat16 tl.dot), got {dtype}"
        return None
    return f"Triton kernels run on CUDA (or CPU, interpreted), not {device.type}"
