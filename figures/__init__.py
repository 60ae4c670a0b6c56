"""Every figure and table of the study, and the per-model figures of any model's results, drawn from
result files alone (``headprobe figures``).

One module per figure or table, each with a :class:`~figures.spec.Spec` named ``SPEC``; :data:`SPECS`
lists them in the order the report shows them: the study's (from a ``headprobe study`` folder), then
the per-model ones (from ``headprobe analyze`` / ``headprobe ruler eval`` / ablation results of any
model, a panel or a colour per model). :func:`draw` draws all (or some) of them from a results folder
into a folder of files, skipping those whose inputs are missing.
"""

from __future__ import annotations

from figures import (
    ablation,
    attention_entropy,
    definition_ablation,
    effective_rank,
    frozen_cpt,
    graft,
    head_agreement,
    loss_vs_retrieval,
    model_layers,
    model_retrieval_heads,
    model_ruler,
    needle_margin,
    probes,
    qk_vs_v,
    retrieval_heads,
    retrieval_heads_table,
    retrieval_steps,
    ruler_by_length,
    ruler_table,
    short_context,
    token_reordering,
    verdicts,
)
from figures.draw import DrawReport, asked_not_drawn, draw, nothing_drawn
from figures.spec import Spec

STUDY_SPECS: tuple[Spec, ...] = tuple(
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
        verdicts,
    )
)
"""The study's figures and tables: a ``headprobe study`` folder's members, seeds and runs."""

MODEL_SPECS: tuple[Spec, ...] = tuple(
    m.SPEC
    for m in (
        model_retrieval_heads,
        model_layers,
        needle_margin,
        head_agreement,
        retrieval_steps,
        model_ruler,
        ablation,
        definition_ablation,
        graft,
    )
)
"""The per-model figures: any model's ``analyze``, ``ruler eval`` and ablation results (models that are not
runs of a study in the folder), a panel or a colour per model."""

SPECS: tuple[Spec, ...] = STUDY_SPECS + MODEL_SPECS

__all__ = ["MODEL_SPECS", "SPECS", "STUDY_SPECS", "DrawReport", "Spec", "asked_not_drawn", "draw", "nothing_drawn"]
