"""The streaming engine: exact per-row attention statistics without an ``L x L`` matrix.

============  ===========================================================================================
engine        ``attention_stats(q, k, ...)`` -> ``AttentionStats``: one online-softmax pass over key tiles
tiles         the tile kernels behind a small registry (``eager``, ``compiled``, ``triton``)
triton_stats  the statistics as one fused Triton kernel (the ``triton`` tiles)
============  ===========================================================================================
"""

from headprobe.stats.engine import AttentionStats, attention_stats
from headprobe.stats.tiles import TILE_KERNELS, Tiles

__all__ = ["TILE_KERNELS", "AttentionStats", "Tiles", "attention_stats"]
