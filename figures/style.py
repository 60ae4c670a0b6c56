"""The house style of every figure: one colour per member, sized for a single paper column.

Colours follow the head shape, so a member keeps its colour in every figure and at every scale:
symmetric members (``d16`` ... ``d512``: qk width = v width) in blues, darker the wider; members whose
query/key is the wider (``k64v16``, ``k512v128``) in oranges, those whose value is the wider in greens.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import matplotlib as mpl

COLUMN_WIDTH = 3.4  # inches: one column of a two-column paper
FULL_WIDTH = 7.0
DPI = 200
PUBLISHED_MARKER = "*"  # the study's published values, drawn beside the user's results
PUBLISHED_COLOR = "0.25"

_SHAPE = re.compile(r"(?:^|[-_])(?:d(?P<d>\d+)|k(?P<k>\d+)v(?P<v>\d+))$")
_PALETTES = {"symmetric": "Blues", "wide-qk": "Oranges", "wide-v": "Greens"}


@dataclass(frozen=True)
class Shape:
    """A member's full-attention head shape read from its name (``toy-d64``, ``k512v128``)."""

    qk: int
    v: int

    @property
    def kind(self) -> str:
        return "symmetric" if self.qk == self.v else "wide-qk" if self.qk > self.v else "wide-v"

    @property
    def label(self) -> str:
        return f"d{self.qk}" if self.qk == self.v else f"k{self.qk}v{self.v}"


def shape(member: str) -> Shape | None:
    """The head shape a member's name states, else ``None``."""
    m = _SHAPE.search(member)
    if m is None:
        return None
    if m["d"]:
        return Shape(int(m["d"]), int(m["d"]))
    return Shape(int(m["k"]), int(m["v"]))


def member_order(members: Iterable[str]) -> list[str]:
    """Members in the order every figure lists them: symmetric by width, then wide-qk, then wide-v,
    then any member whose name states no shape (alphabetically)."""
    kinds = list(_PALETTES)

    def key(member: str) -> tuple:
        s = shape(member)
        return (1, 0, 0, member) if s is None else (0, kinds.index(s.kind), s.qk + s.v, member)

    return sorted(set(members), key=key)


def member_colors(members: Iterable[str]) -> dict[str, tuple[float, float, float, float]]:
    """A colour per member: within each shape family shades from light to dark by width."""
    ordered = member_order(members)
    colors = {}
    for kind, palette in _PALETTES.items():
        family = [m for m in ordered if (s := shape(m)) is not None and s.kind == kind]
        cmap = mpl.colormaps[palette]
        for i, m in enumerate(family):
            colors[m] = cmap(0.45 + 0.5 * (i + 1) / (len(family) + 1) if len(family) > 1 else 0.75)
    others = [m for m in ordered if m not in colors]
    grey = mpl.colormaps["Greys"]
    for i, m in enumerate(others):
        colors[m] = grey(0.4 + 0.5 * (i + 1) / (len(others) + 1))
    return colors


def apply() -> None:
    """Set matplotlib's defaults to the house style (small fonts for a column width, no top/right spines)."""
    mpl.rcParams.update(
        {
            "figure.dpi": DPI,
            "savefig.dpi": DPI,
            "savefig.bbox": "tight",
            "figure.constrained_layout.use": True,
            "font.size": 7,
            "axes.titlesize": 7,
            "axes.labelsize": 7,
            "legend.fontsize": 6,
            "xtick.labelsize": 6,
            "ytick.labelsize": 6,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "lines.linewidth": 1.2,
            "lines.markersize": 3.5,
        }
    )


RUN_ORDER = ("pt", "cpt", "cpt-frozen", "sft")  # the recipe's runs in the order figures show them


def run_order(runs: Iterable[str]) -> list[str]:
    """The recipe's runs in :data:`RUN_ORDER`, any others after them alphabetically."""
    present = set(runs)
    return [r for r in RUN_ORDER if r in present] + sorted(present - set(RUN_ORDER))
