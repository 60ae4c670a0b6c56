"""The study's Table 3: short-context accuracy per member and task."""

from __future__ import annotations

from figures.data import Results
from figures.spec import Spec
from figures.tables import Table, ordered
from headprobe.study.tables import seed_stats, spread


def build(results: Results) -> Table:
    frame = results.table("study_shortctx")
    cells = spread(frame, ["member", "run"], ["task", "metric"], "value", scale=100.0, digits=1, sd=True)
    cells = ordered(cells)
    values = seed_stats(frame, ["member", "run", "task", "metric"], "value")
    notes = (
        "Accuracy in %, mean ± sd over seeds; the built-in multiple-choice set unless the real task files were given.",
    )
    return Table("Short-context accuracy by member", cells, values, notes)


SPEC = Spec(
    "short_context",
    "Short-context accuracy (Table 3)",
    "table",
    ("study_shortctx",),
    "acc and acc_norm per task; the study found these barely move with head shape.",
    build,
)
