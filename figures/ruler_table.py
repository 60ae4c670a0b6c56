"""The study's Table 2: RULER-style score per member and task (mean over lengths), and overall."""

from __future__ import annotations

from figures import published
from figures.data import MissingInput, Results
from figures.spec import Spec
from figures.tables import Table, ordered
from headprobe.study.tables import mean_sd, seed_stats, spread


def build(results: Results) -> Table:
    scores = results.table("ruler_scores")
    tasks = scores[scores.scope == "task"]
    overall = scores[scores.scope == "overall"]
    if tasks.empty:
        raise MissingInput("the ruler_scores tables hold no per-task rows")
    cells = spread(tasks, ["member", "run"], ["task"], "score", digits=1, sd=True)
    if not overall.empty:
        total = mean_sd(overall, ["member", "run"], "score").rename(columns={"cell": "overall"})
        cells = cells.merge(total, on=["member", "run"], how="left")
    reference = published.lookup("ruler_overall")
    if any(m in reference for m in cells.member):
        cells["published overall"] = [
            f"{reference[m]:.2f}" if m in reference and r != "pt" else ""
            for m, r in zip(cells.member, cells.run, strict=True)
        ]
    cells = ordered(cells)
    values = seed_stats(tasks, ["member", "run", "task"], "score")
    notes = ["Scores 0-100, mean over lengths (and over seeds: mean ± sd where several)."]
    if "published overall" in cells:
        notes.append(f"Published: {published.source('ruler_overall')}.")
    return Table("RULER-style score by member and task", cells, values, tuple(notes))


SPEC = Spec(
    "ruler_table",
    "RULER-style score by member and task (Table 2)",
    "table",
    ("ruler_scores", "study_runs"),
    "Each task's score averaged over the evaluated lengths; 'overall' is RULER's mean over lengths of the "
    "mean over tasks; published values are the study's own, for members of its scale only.",
    build,
)
