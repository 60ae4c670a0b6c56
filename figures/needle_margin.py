"""How attention on the needle thins as the context grows, for any model (``headprobe analyze --metrics
needle_margin``): each model's top heads by mass on the needle, their mass (left) and margin (right) against
the context length."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from figures import models, plot, style
from figures.data import MissingInput, Results
from figures.spec import Spec
from headprobe.margin_table import top_heads

TOP = 3  # heads per model
DASHES = ("-", "--", ":")  # the first, second and third head of a model


def build(results: Results) -> Figure:
    frame = results.models("needle_margin", ["length", "layer", "head", "sample"])
    if frame["length"].nunique() < 2:
        raise MissingInput("the 'needle_margin' table holds one length: analyse two or more to see the needle thin")
    heads = top_heads(frame, TOP)
    names = models.model_order(heads.model)
    colors = models.model_colors(names)
    fig, (mass, margin) = plt.subplots(1, 2, figsize=(style.FULL_WIDTH, 2.8))
    for (model, place), rows in heads.groupby(["model", "place"]):
        first = rows.iloc[0]
        label = f"{model} L{int(first.layer)}H{int(first['head'])}"
        for ax, y in ((mass, "mass"), (margin, "margin")):
            ax.plot(rows.length, rows[y], color=colors[model], linestyle=DASHES[int(place)], marker="o",
                    markersize=3, label=label)  # fmt: skip
    for ax in (mass, margin):
        plot.length_axis(ax, heads.length)
        ax.set_xlabel("context length (tokens)")
    mass.set_ylim(-0.02, 1.02)
    mass.set_ylabel("attention mass on the needle")
    mass.set_title("mass on the needle at the answer steps")
    margin.axhline(0, color="0.5", linewidth=0.6)
    margin.set_ylabel("needle logit − best other (nats)")
    margin.set_title("margin: above 0 the needle's key wins")
    if len(names) == 1:  # one model: each line named by its head
        firsts = heads.drop_duplicates("place").sort_values("place")
        handles = [
            Line2D(
                [],
                [],
                color=colors[names[0]],
                linestyle=DASHES[int(r.place)],
                label=f"L{int(r.layer)}H{int(r['head'])}",
            )
            for _, r in firsts.iterrows()
        ]
    else:
        handles = [Line2D([], [], color=colors[m], label=m) for m in names]
        handles += [Line2D([], [], color="0.3", linestyle=d, label=f"head {i + 1} by mass")
                    for i, d in enumerate(DASHES) if (heads.place == i).any()]  # fmt: skip
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4), frameon=False)
    return fig


SPEC = Spec(
    "needle_margin",
    "Attention on the needle as the context grows, per model",
    "figure",
    ("needle_margin",),
    "Each model's three heads with the most attention on the needle (a colour per model, a line style per head, "
    "named L<layer>H<head>), at the teacher-forced answer steps, mean over the needle samples. Left: the attention "
    "mass on the needle's keys (0-1). Right: the needle's best key logit minus the best other key's, in nats; below "
    "0 another key outscores the needle. A log axis of context length: a falling line is a needle diluted by the "
    "haystack.",
    build,
    "model",
)
