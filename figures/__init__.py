"""Every figure and table of the study, drawn from result files alone (``headprobe figures``).

One module per figure or table, each with a :class:`~figures.spec.Spec` named ``SPEC``; :data:`SPECS`
lists them in the order the report shows them. :func:`draw` draws all (or some) of them from a
results folder into a folder of files, skipping those whose inputs are missing.
"""

from __future__ import annotations

from figures import (
    attention_entropy,
    effective_rank,
    frozen_cpt,
    loss_vs_retrieval,
    probes,
    qk_vs_v,
    retrieval_heads,
    retrieval_heads_table,
    ruler_by_length,
    ruler_table,
    short_context,
    token_reordering,
)
from figures.draw import DrawReport, draw
from figures.spec import Spec

SPECS: tuple[Spec, ...] = tuple(
    m.SPEC
    for m in (
        ruler_by_length,
        ruler_table,
        probes,
        retrieval_heads,
        retrieval_heads_table,
        frozen_cpt,
        qk_vs_v,
        loss_vs_retrieval,
        attention_entropy,
        token_reordering,
        effective_rank,
        short_context,
    )
)

__all__ = ["SPECS", "DrawReport", "Spec", "draw"]
