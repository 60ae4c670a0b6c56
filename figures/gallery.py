"""The docs' figure page: ``python -m figures.gallery RESULTS [--also MODELS ...] [--docs DOCS]``.

Draws every figure a results folder allows into ``DOCS/img/<name>.png`` and writes ``DOCS/figures.md``:
each figure or table of :data:`figures.SPECS` in order, with its one line on how to read it, the tables
it reads (tables inline as Markdown), the command that made the page, and what could not be drawn (with
what it would show). A
figure that ``RESULTS`` (a study) cannot draw is drawn from the first ``--also`` folder that can (a
model's ``analyze`` / ``ruler eval`` results, for the per-model figures). Rerun it on new results and
the page follows; it never holds a number the results do not.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Sequence
from pathlib import Path

from figures import SPECS
from figures.data import Results
from figures.draw import built, save_figure
from figures.spec import Spec
from figures.tables import Table
from headprobe.core.atomic import atomic_write_text
from headprobe.study.tables import markdown

WRITTEN_BY = {  # which command writes each table a figure reads, for the page's "Reads" lines
    "retrieval": "headprobe analyze",
    "entropy": "headprobe analyze",
    "erank": "headprobe analyze",
    "reordering": "headprobe analyze",
    "ruler_scores": "headprobe ruler eval",
    "ruler_samples": "headprobe ruler eval",
    "ablation": "headprobe ablate",
}


def reads(spec: Spec) -> str:
    """The page's line on a figure's inputs: each table and what writes it."""
    return "Reads " + ", ".join(f"`{t}` ({WRITTEN_BY.get(t, 'headprobe study')})" for t in spec.inputs) + "."


def _drawn(folders: Sequence[Path], skipped: dict[str, str]):
    """Each spec built from the first folder that can draw it (``skipped``: why the last could not)."""
    why: dict[str, str] = {}
    for spec in SPECS:
        for folder in folders:
            why.pop(spec.name, None)
            made = next(built(Results(folder), [spec], why), None)
            if made is not None:
                yield made
                break
        else:
            skipped[spec.name] = why[spec.name]


def gallery(
    results: str | Path, docs: str | Path, command: str, also: Sequence[str | Path] = (), also_command: str = ""
) -> str:
    """Draw the figures of ``results`` (and what it cannot draw, from ``also``) into ``docs/img`` and write
    ``docs/figures.md``; returns the page."""
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
        "The per-model figures at the end (retrieval score of every head, entropy and effective rank by layer,",
        "RULER-style score by task and length, accuracy with heads ablated) draw any model's own results:",
        "`headprobe figures OUT` on the folder of `headprobe analyze`, `headprobe ruler eval` and/or `headprobe",
        "ablate` run with `--out OUT` (one model or several: a panel or a colour per model; lengths run into",
        "other folders below OUT are joined). In a study's folder they draw only models that are not its runs,",
        "and a folder holding nothing a study writes leaves the study's figures out (each command lists what",
        "it skipped and why)" + (f"; here from {also_command}." if also and also_command else "."),
        "",
    ]
    for spec, made in _drawn([results, *map(Path, also)], skipped):
        lines += [f"## {spec.title}", "", f"*{spec.how_to_read}*", "", reads(spec), ""]
        if isinstance(made, Table):
            lines += [markdown(made.cells), "", *(f"{note}\n" for note in made.notes)]
        else:
            save_figure(made, docs / "img" / spec.name, ["png"])
            lines += [f"![{spec.title}](img/{spec.name}.png)", ""]
    if skipped:
        specs = {spec.name: spec for spec in SPECS}  # what each would show, though these results cannot
        lines += ["## Not drawn", ""]
        lines += [f"- `{name}`: {why}. {specs[name].title}: {specs[name].how_to_read} {reads(specs[name])}"
                  for name, why in skipped.items()]  # fmt: skip
        lines += [""]
    page = "\n".join(lines).rstrip() + "\n"
    atomic_write_text(docs / "figures.md", page)
    return page


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="a results folder (what `headprobe study` wrote)")
    parser.add_argument("--docs", default="docs", help="the docs folder (default: docs)")
    parser.add_argument("--command", default="make study", help="what made the results, for the page")
    parser.add_argument("--also", nargs="*", default=[], help="folders to draw what RESULTS cannot (per-model)")
    parser.add_argument("--also-command", default="", help="what made the --also results, for the page")
    args = parser.parse_args(argv)
    gallery(args.results, args.docs, args.command, args.also, args.also_command)
    print(f"wrote {Path(args.docs) / 'figures.md'} and its images in {Path(args.docs) / 'img'}")


if __name__ == "__main__":
    main()
