"""``headprobe ablate`` as a library: needle accuracy with retrieval heads (or random heads) ablated.

========  ===========================================================================================
settings  ``AblateSettings``; head sets (``top:K``, ``random:K``, ``L.H,...``) made into conditions
job       ``AblateJob`` and ``ablate(checkpoints, out, settings)``; the ``ablation`` and ``ablation_samples`` tables
========  ===========================================================================================

The ablation itself is :meth:`headprobe.hooked.HookedModel.ablate` (:mod:`headprobe.hooked.ablation`).
"""

from __future__ import annotations

from headprobe.core.lazy import lazy_exports

_EXPORTS = {
    "ABLATION": "job",
    "ABLATION_SAMPLES": "job",
    "AblateJob": "job",
    "AblateSettings": "settings",
    "Condition": "settings",
    "Ranking": "settings",
    "ablate": "job",
    "conditions": "settings",
    "ranked_heads": "settings",
}
__all__ = sorted(_EXPORTS)


# lazy: the command line builds its options from the settings without torch
__getattr__ = lazy_exports(__name__, _EXPORTS)
