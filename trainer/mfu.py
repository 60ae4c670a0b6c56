"""Model FLOPs utilisation: achieved training FLOPs over the hardware's dense bf16 peak.

FLOPs per token come from :func:`headprobe.model.budget.budget` (causal, window-aware attention), so MFU is
not inflated by counting masked attention. Peaks are dense (no sparsity) bf16 tensor-core numbers
from the vendors' data sheets; pass ``--peak-flops`` for anything else.
"""

from __future__ import annotations

import torch

# substring of torch.cuda.get_device_name() -> dense bf16 FLOP/s
PEAK_BF16 = {
    "H200": 989e12,
    "H100 SXM": 989e12,
    "H100 NVL": 835e12,
    "H100 PCIe": 756e12,
    "H100": 989e12,
    "GH200": 989e12,
    "B200": 2250e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10G": 70e12,
    "RTX 4090": 165e12,
}


def peak_flops(device: torch.device, override: float | None = None) -> float | None:
    """Peak FLOP/s of one ``device``; ``None`` when unknown (CPU, unlisted GPUs)."""
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, value in PEAK_BF16.items():
        if key in name:
            return value
    return None


def mfu(flops_per_token: float, tokens_per_s: float, peak_per_device: float | None, devices: int) -> float | None:
    if not peak_per_device:
        return None
    return flops_per_token * tokens_per_s / (peak_per_device * devices)
