"""``headprobe ablate`` as a library: needle accuracy with retrieval heads (or random heads) ablated.

========  ===========================================================================================
settings  ``AblateSettings``; head sets (``top:K``, ``random:K``, ``L.H,...``) made into conditions
job       ``ablate(checkpoints, out, settings)``; the ``ablation`` and ``ablation_samples`` tables
========  ===========================================================================================

The ablation itself is :meth:`headprobe.hooked.HookedModel.ablate` (:mod:`headprobe.hooked.ablation`).
"""

from headprobe.ablation.job import ABLATION, ABLATION_SAMPLES, ablate
from headprobe.ablation.settings import AblateSettings, Condition, Ranking, conditions, ranked_heads

__all__ = [
    "ABLATION",
    "ABLATION_SAMPLES",
    "AblateSettings",
    "Condition",
    "Ranking",
    "ablate",
    "conditions",
    "ranked_heads",
]
