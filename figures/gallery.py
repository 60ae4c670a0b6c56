"""The docs' figure page: ``python -m figures.gallery RESULTS [--docs DOCS]``.

Draws every figure a results folder allows into ``DOCS/img/<name>.png`` and writes ``DOCS/figures.md``:
each figure or table of :data:`figures.SPECS` in order, with its one line on how to read it (tables inline
as Markdown), the command that made the page, and what could not be drawn. Rerun it on new results and
the page follows; it never holds a number the results do not.
"""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

from figures import SPECS
from figures.data import Results
from figures.draw import built, save_figure
from figures.tables import Table
from headprobe.model.atomic import atomic_write_text
from headprobe.study.tables import markdown


def gallery(results: str | Path, docs: str | Path, command: str) -> str:
    """Draw the figures of ``results`` into ``docs/img`` and write ``docs/figures.md``; returns the page."""
    results, docs = Path(results), Path(docs)
    skipped: dict[str, str] = {}
    lines = [
        "# Figures and tables",
        "",
        f"Every figure and table of the study as headprobe draws it, from the results of `{command}`",
        f"({dt.date.today().isoformat()}). `headprobe figures RESULTS --out FIGS` draws the same from any",
        "results folder (png, pdf, svg; tables as Markdown, LaTeX and CSV), `headprobe report RESULTS` puts",
        "them on one HTML page, and `make demo` / `headprobe study` do both at the end. Colours follow the head",
        "shape (darker = wider heads; asymmetric members in their own hues); small dots are single seeds, large",
        "ones their mean; stars are the study's published values, drawn only for members of its scale.",
        "",
    ]
    for spec, made in built(Results(results), SPECS, skipped):
        lines += [f"## {spec.title}", "", f"*{spec.how_to_read}*", ""]
        if isinstance(made, Table):
            lines += [markdown(made.cells), "", *(f"{note}\n" for note in made.notes)]
        else:
            save_figure(made, docs / "img" / spec.name, ["png"])
            lines += [f"![{spec.title}](img/{spec.name}.png)", ""]
    if skipped:
        lines += ["## Not drawn", "", *(f"- `{name}`: {why}" for name, why in skipped.items()), ""]
    page = "\n".join(lines).rstrip() + "\n"
    atomic_write_text(docs / "figures.md", page)
    return page


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="a results folder (what `headprobe study` wrote)")
    parser.add_argument("--docs", default="docs", help="the docs folder (default: docs)")
    parser.add_argument("--command", default="make study", help="what made the results, for the page")
    args = parser.parse_args(argv)
    gallery(args.results, args.docs, args.command)
    print(f"wrote {Path(args.docs) / 'figures.md'} and its images in {Path(args.docs) / 'img'}")


if __name__ == "__main__":
    main()
