"""The study's Table 4: retrieval-head counts and fractions per member, run and layer type."""

from __future__ import annotations

from figures import style
from figures.data import Results
from figures.spec import Spec
from figures.tables import Table, ordered
from headprobe.study.tables import mean_sd, seed_stats


def build(results: Results) -> Table:
    frame = results.table("study_heads")
    index = ["member", "layer_type", "run"]
    counts = mean_sd(frame, index, "retrieval_heads", digits=1)
    shares = mean_sd(frame, index, "fraction", scale=100.0, digits=1)
    cells = counts.merge(shares, on=index, suffixes=("_n", "_f"))
    cells["cell"] = [f"{n} ({f}%)" if n != "n/a" else "n/a" for n, f in zip(cells.cell_n, cells.cell_f, strict=True)]
    wide = cells.pivot_table(index=["member", "layer_type"], columns="run", values="cell", aggfunc="first")
    wide = wide[[r for r in style.run_order(wide.columns)]].reset_index()
    wide = ordered(wide)
    wide.columns.name = None
    values = seed_stats(frame, index, "retrieval_heads").merge(
        seed_stats(frame, index, "fraction"), on=index, suffixes=("_heads", "_fraction")
    )
    notes = (
        "Cells: retrieval heads (copies / span >= 0.1) and their share of the layer type's heads, mean ± sd over "
        "seeds; n/a: no needle sample was answered, so no head has a score.",
    )
    return Table("Retrieval heads by member, layer type and run", wide, values, notes)


SPEC = Spec(
    "retrieval_heads_table",
    "Retrieval-head counts and fractions (Table 4)",
    "table",
    ("study_heads", "study_runs"),
    "Counts and shares of retrieval heads per member and layer type, before (pt) and after (cpt) continual "
    "pretraining.",
    build,
)
