"""``headprobe graft`` as a library: which components carry a checkpoint's gain, by grafting them into another.

=========  ==============================================================================================
parts      the part-set syntax (``embed``, ``mlp:0-1+attn:3``, ``param:GLOB``, ``all``) and the parameter groups
hybrid     ``grafted(base, donor, parts)``: BASE with DONOR's weights for those parts, one architecture checked
measure    what is measured of each model: needle accuracy, retrieval-head counts, held-out loss
settings   ``GraftSettings``: what decides the numbers, checked before any model loads
job        ``GraftJob`` and ``graft(bases, out, settings)``; the ``graft`` table, resumable
=========  ==============================================================================================
"""

from __future__ import annotations

from headprobe.core.lazy import lazy_exports

_EXPORTS = {
    "GRAFT": "job",
    "GraftError": "hybrid",
    "GraftJob": "job",
    "GraftSettings": "settings",
    "PartsError": "parts",
    "graft": "job",
    "grafted": "hybrid",
    "parse_parts": "parts",
}
__all__ = sorted(_EXPORTS)


# lazy: the command line builds its options from the settings without torch
__getattr__ = lazy_exports(__name__, _EXPORTS)
