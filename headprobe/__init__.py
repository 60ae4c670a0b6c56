"""headprobe: how the shape of attention heads decides long-context retrieval.

``headprobe.load_model(path)`` opens our checkpoints and local Hugging Face models for analysis
(see :mod:`headprobe.probe`); the metrics live in :mod:`headprobe.metrics`, the streaming engine in
:mod:`headprobe.stats`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ProbedModel", "load_model"]


def __getattr__(name: str) -> Any:  # lazy: keep `headprobe plan` and friends quick to start
    if name in __all__:
        from headprobe import probe

        return getattr(probe, name)
    raise AttributeError(f"module 'headprobe' has no attribute {name!r}")
