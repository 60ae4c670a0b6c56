"""Tables of the study as files: Markdown, LaTeX and CSV from one frame of display strings.

A table module's ``build`` returns a :class:`Table`: ``cells`` (what is printed: ``"mean ± sd"`` over
seeds, rounded as stated) and ``values`` (the unrounded means, tidy, for CSV readers who recompute).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from figures import style
from headprobe.core.atomic import atomic_write_text
from headprobe.study.tables import markdown


@dataclass(frozen=True)
class Table:
    """A titled table: ``cells`` as printed, ``values`` the numbers behind them, ``notes`` below it."""

    title: str
    cells: pd.DataFrame
    values: pd.DataFrame
    notes: tuple[str, ...] = ()


def latex(table: Table) -> str:
    """A LaTeX ``tabular`` (booktabs rules) of the printed cells, with the title as caption."""

    def esc(text: object) -> str:
        out = str(text)
        for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#")):
            out = out.replace(a, b)
        return out.replace("±", r"$\pm$")

    cols = [esc(c) for c in table.cells.columns]
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption{{{esc(table.title)}}}",
        r"\begin{tabular}{" + "l" * len(cols) + "}",
        r"\toprule",
        " & ".join(cols) + r" \\",
        r"\midrule",
    ]
    for row in table.cells.itertuples(index=False):
        lines.append(" & ".join("" if pd.isna(v) else esc(v) for v in row) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def write(table: Table, stem: Path, formats: tuple[str, ...] = ("md", "tex", "csv")) -> list[Path]:
    """``stem.md`` (title, table, notes), ``stem.tex`` and ``stem.csv`` (the unrounded values), atomically."""
    out = []
    texts = {
        "md": f"**{table.title}**\n\n{markdown(table.cells)}\n" + "".join(f"\n{n}\n" for n in table.notes),
        "tex": latex(table),
        "csv": table.values.to_csv(index=False),
    }
    for fmt in formats:
        path = stem.with_suffix(f".{fmt}")
        atomic_write_text(path, texts[fmt])
        out.append(path)
    return out


def ordered(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows in the figures' order: by run (:data:`figures.style.RUN_ORDER`), then member
    (:func:`figures.style.member_order`), where those columns exist; the index reset."""
    keys = {
        "run": {r: i for i, r in enumerate(style.run_order(frame["run"]))} if "run" in frame else {},
        "member": {m: i for i, m in enumerate(style.member_order(frame["member"]))} if "member" in frame else {},
    }
    by = [c for c in ("run", "member") if c in frame]
    return frame.sort_values(by, key=lambda c: c.map(keys[c.name]), kind="stable").reset_index(drop=True)
