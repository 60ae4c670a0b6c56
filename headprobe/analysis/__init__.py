"""``headprobe analyze`` as a library: settings, the per-length work items, the job, its summary.

=========  ========================================================================================
settings   ``AnalyzeSettings``: what decides the numbers, checked before any work; resume keys
items      one model at one length: the pass metrics over haystack texts, retrieval over needles
job        ``AnalyzeJob`` and ``analyze(checkpoints, out, settings)``: every checkpoint, resumable
summary    ``analysis_summary``: the aggregates as a derived tidy table
=========  ========================================================================================
"""

from __future__ import annotations

from headprobe.core.lazy import lazy_exports

_EXPORTS = {
    "ANALYSIS_SUMMARY": "summary",
    "AnalyzeError": "settings",
    "AnalyzeSettings": "settings",
    "analyze": "job",
    "AnalyzeJob": "job",
    "statistic": "summary",
    "summarize": "summary",
}
__all__ = sorted(_EXPORTS)


# lazy: the command line builds its options from the settings without torch
__getattr__ = lazy_exports(__name__, _EXPORTS)
