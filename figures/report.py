"""``headprobe report``: one self-contained HTML page with every figure and table of a results folder.

The page needs nothing but itself: figures are PNGs embedded as ``data:`` URIs, tables are HTML tables,
the style sheet is inline, and nothing is loaded from anywhere (it opens offline and can be mailed).
It shows, in :data:`figures.SPECS` order, each figure or table with its title and how to read it; the
settings, command and versions that produced the results; the figures that could not be drawn and why;
and the caveats of the results at hand (scale, seeds, generated haystacks, published values).
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from figures.data import MODEL_TABLES, MissingInput, Results
from figures.draw import built, figure_bytes
from figures.spec import Spec
from figures.tables import Table
from headprobe.core.atomic import atomic_write_text
from headprobe.core.outputs import PAGE, PAGE_MARK, claim
from headprobe.results import read_meta, table_path

CSS = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
.how { color: #555; font-style: italic; } img { max-width: 100%; height: auto; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
th { background: #f3f3f3; } pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.8em; }
.caveats li, .skipped li { margin: 0.3em 0; } nav a { margin-right: 0.8em; }
"""


@dataclass
class ReportPage:
    """What :func:`report_page` built: the page, and which specs it shows and skipped (``name -> why``)."""

    html: str
    shown: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    absent: dict[str, str] = field(default_factory=dict)  # not this folder's kind (figures.draw.DrawReport)


def _png(fig) -> str:
    data = base64.b64encode(figure_bytes(fig, "png")).decode("ascii")
    plt.close(fig)
    return data


def _html_table(frame: pd.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    rows = [
        "<tr>" + "".join(f"<td>{'' if pd.isna(v) else html.escape(str(v))}</td>" for v in row) + "</tr>"
        for row in frame.itertuples(index=False)
    ]
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _section(spec: Spec, made: object) -> str:
    title = f'<h2 id="{spec.name}">{html.escape(spec.title)}</h2><p class="how">{html.escape(spec.how_to_read)}</p>'
    if isinstance(made, Table):
        notes = "".join(f"<p>{html.escape(n)}</p>" for n in made.notes)
        return f"{title}{_html_table(made.cells)}{notes}"
    return f'{title}<img alt="{html.escape(spec.title)}" src="data:image/png;base64,{_png(made)}">'


def caveats(data: Results) -> list[str]:
    """What a reader must know about these results, from the results themselves."""
    runs = data.runs()
    out = []
    members = sorted(set(runs["member"])) if "member" in runs else []
    if any(m.startswith("toy-") for m in members):
        out.append(
            "Toy scale: 4-layer models of about 1.4M parameters trained for minutes on a CPU, with a sliding "
            "window of 8 tokens and a full-attention budget of 128, not the study's 0.6B/3B models; they show "
            "the pipeline and toy-scale trends, not the study's numbers."
        )
    seeds = sorted(set(runs["seed"])) if "seed" in runs else []
    if len(seeds) == 1:
        out.append(f"One seed ({seeds[0]}): no spread can be shown; differences between members may be seed noise.")
    elif seeds:
        out.append(f"{len(seeds)} seeds ({', '.join(map(str, seeds))}): cells are the mean ± sd over seeds.")
    out += _unscored(data)
    out += data.read_apart  # results of different checkpoints or settings that share a name, shown apart
    out.append(
        "Haystacks, needles and RULER-style tasks are generated offline from headprobe's built-in corpus and "
        "word lists; RULER-style scores follow RULER's templates and scoring but not its essay haystacks."
    )
    if not runs.empty:
        out.append("Values marked as published are the study's own numbers, drawn for comparison; all others are ours.")
    return out


def _unscored(data: Results) -> list[str]:
    """A caveat per model (not a study run) whose retrieval analysis kept no needle sample."""
    try:
        heads = data.models("retrieval", ["length", "layer", "head"])
    except MissingInput:
        return []
    out = []
    for model, rows in heads.groupby("model", sort=True):
        per_length = rows.drop_duplicates("length")
        if per_length["n_kept"].sum() == 0:
            out.append(
                f"{model} answered none of its {int(per_length['n_samples'].sum())} needle samples (ROUGE-1 "
                "recall > 0.5 needed): its heads have no retrieval score, so its retrieval heatmap is grey."
            )
    return out


def _settings(results: Path, data: Results) -> str:
    meta = read_meta(table_path(results / "tables", "study_runs"))
    if meta is not None:
        record = {"settings": meta.settings, "command": meta.command, "versions": meta.versions,
                  "created": meta.created}  # fmt: skip
        return f"<pre>{html.escape(json.dumps(record, indent=2, default=str))}</pre>"
    runs: dict[str, dict] = {}  # the per-model tables, grouped by the command and settings that wrote them
    for path, m in data.sources(list(MODEL_TABLES)):
        key = json.dumps([m.command, m.settings], sort_keys=True, default=str)
        runs.setdefault(key, {"tables": [], "command": m.command, "settings": m.settings, "versions": m.versions,
                              "created": m.created})["tables"].append(str(path))  # fmt: skip
    if not runs:
        return ("<p>No <code>tables/study_runs.parquet</code> nor per-model tables: the settings that produced these "
                "results are unknown.</p>")  # fmt: skip
    return "".join(f"<pre>{html.escape(json.dumps(r, indent=2, default=str))}</pre>" for r in runs.values())


def report_page(results: str | Path, specs: Sequence[Spec], title: str | None = None) -> ReportPage:
    """The report of ``results`` (a folder ``headprobe study``, ``analyze``, ``ruler eval`` or ``ablate``
    run wrote) as one HTML string."""
    results = Path(results)
    data = Results(results)
    page = ReportPage("")
    sections = []
    for spec, made in built(data, specs, page.skipped, page.absent):
        sections.append(_section(spec, made))
        page.shown.append(spec.name)
    title = title or f"headprobe report: {results.name}"
    nav = " ".join(f'<a href="#{name}">{html.escape(name)}</a>' for name in page.shown)
    skipped = "".join(f"<li><b>{html.escape(name)}</b>: {html.escape(why)}</li>" for name, why in page.skipped.items())
    parts = [
        "<!DOCTYPE html>",
        f'<html lang="en"><head><meta charset="utf-8">{PAGE_MARK} report">',
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>From <code>{html.escape(str(results))}</code>, drawn {dt.date.today().isoformat()}.</p>",
        f"<nav>{nav}</nav>",
        '<h2 id="caveats">Caveats</h2><ul class="caveats">',
        *(f"<li>{html.escape(c)}</li>" for c in caveats(data)),
        "</ul>",
        *sections,
    ]
    if skipped:
        parts.append(f'<h2 id="skipped">Not drawn</h2><ul class="skipped">{skipped}</ul>')
    parts += ['<h2 id="settings">Settings</h2>', _settings(results, data), "</body></html>"]
    page.html = "\n".join(parts) + "\n"
    return page


def write_report(
    results: str | Path, out: str | Path, specs: Sequence[Spec], title: str | None = None, overwrite: bool = False
) -> ReportPage:
    """:func:`report_page` written to ``out`` atomically: a page headprobe wrote there is made anew, any other
    file replaced only with ``overwrite`` (:func:`headprobe.core.outputs.claim`)."""
    claim(out, PAGE, inputs=[results], overwrite=overwrite)
    page = report_page(results, specs, title)
    atomic_write_text(Path(out), page.html)
    return page
