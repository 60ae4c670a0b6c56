"""Per-head and per-layer metrics as tidy tables (definitions: docs/metrics.md).

============  =========================================================================================
registry      ``METRICS``: each metric as a typed object (its settings, tables, and how to compute it)
passes        ``run_pass``: one forward pass feeding every pass metric's collector
attention     attention entropy and token reordering
erank         effective rank of the residual stream
retrieval     Wu et al.'s retrieval score, its teacher-forced form and the needle mass; retrieval heads
definitions   the retrieval-head definitions behind one interface (tables, GQA groups, ``retrieval_forced``)
headkv        ``needle_mass``: HeadKV's top-k attention mass on the needle
qrhead        ``query_focus``: QRHead's question-to-needle attention, calibrated by a null question
razor         ``echo`` and ``induction``: RazorAttention's scores on four copies of a random sequence
locos         ``logit_contrib``: LOCOS's answer logit sent from the needle against the rest
agreement     ``head_agreement``: Spearman and top-k Jaccard between the definitions
probe         ``Probe``, ``run_probes``: one sample's forward passes, each distinct input once, shared by the metrics
probs         exact attention probabilities of chosen query rows (and chosen keys), never ``L x L``
margin        the needle margin: each head's needle logit over the haystack's, its mass and rank
heads         per-head means of row statistics
rows          ``Rows``: which query rows a pass analyses
summaries     what each metric adds to a run's ``analysis_summary`` (aggregate rows) and its one-line headline
============  =========================================================================================

Every table has one row per layer x head (per residual site for effective rank) and the columns
``layer`` (0-based), ``head``, ``layer_type`` and ``value`` plus metric-specific ones; statistics
come from :func:`headprobe.stats.attention_stats` at the model's seam, so no ``L x L`` matrix is built.
"""

from headprobe.metrics.attention import attention_entropy, head_statistics, kendall_reordering, token_reordering
from headprobe.metrics.erank import GramAccumulator, effective_rank, residual_effective_rank
from headprobe.metrics.registry import METRICS, DecodeMetric, DecodeOptions, Metric, PassMetric, get_metrics
from headprobe.metrics.retrieval import (
    RetrievalScores,
    retrieval_heads,
    retrieval_sample,
    retrieval_scores,
    rouge1_recall,
    score_prompts,
)
from headprobe.metrics.rows import RowKind, Rows

__all__ = [
    "METRICS",
    "DecodeMetric",
    "DecodeOptions",
    "GramAccumulator",
    "Metric",
    "PassMetric",
    "RetrievalScores",
    "RowKind",
    "Rows",
    "attention_entropy",
    "effective_rank",
    "get_metrics",
    "head_statistics",
    "kendall_reordering",
    "residual_effective_rank",
    "retrieval_heads",
    "retrieval_sample",
    "retrieval_scores",
    "rouge1_recall",
    "score_prompts",
    "token_reordering",
]
