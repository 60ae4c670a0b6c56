"""``headprobe analyze`` as a library: settings, the per-length work items, the job, its summary.

=========  ========================================================================================
settings   ``AnalyzeSettings``: what decides the numbers, checked before any work; resume keys
items      one model at one length: the pass metrics over haystack texts, retrieval over needles
job        ``analyze(checkpoints, out, ...)``: every checkpoint, resumable, failures isolated
summary    ``analysis_summary``: the aggregates as a derived tidy table
=========  ========================================================================================
"""

from headprobe.analysis.job import analyze, analyze_checkpoint
from headprobe.analysis.settings import AnalysisError, AnalyzeSettings
from headprobe.analysis.summary import ANALYSIS_SUMMARY, statistic, summarize

__all__ = [
    "ANALYSIS_SUMMARY",
    "AnalysisError",
    "AnalyzeSettings",
    "analyze",
    "analyze_checkpoint",
    "statistic",
    "summarize",
]
