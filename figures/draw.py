"""Draw the study's figures and tables from a results folder into files."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

from headprobe.core.errors import SettingError

matplotlib.use("Agg")  # files only; never a window
import matplotlib.pyplot as plt

from figures import plot, style, tables
from figures.data import MissingInput, Results
from figures.spec import Spec
from headprobe.core.atomic import atomic_write_bytes, atomic_write_text
from headprobe.core.outputs import FIGURES, FIGURES_FILE, OutputRefused, claim, input_conflict

FORMATS = ("png", "pdf", "svg")
SUFFIXES = {f".{f}" for f in (*FORMATS, "md", "tex", "csv")}  # what a figures folder holds (figures and tables)


@dataclass
class DrawReport:
    """What :func:`draw` wrote (``name -> files``), skipped (``name -> why``), and left out because the
    folder is not their kind (``absent``: a study's figures in a model's folder, or the reverse)."""

    out: Path
    drawn: dict[str, list[Path]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    absent: dict[str, str] = field(default_factory=dict)  # specs of a family the folder holds no results of


def figure_bytes(fig, fmt: str) -> bytes:
    """``fig`` rendered as ``fmt`` (png, pdf or svg)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt)
    return buffer.getvalue()


def save_figure(fig, stem: Path, formats: Sequence[str]) -> list[Path]:
    """``fig`` as ``stem.<format>`` for each format, each written atomically; the figure is closed."""
    out = []
    for fmt in formats:
        path = stem.with_suffix(f".{fmt}")
        atomic_write_bytes(path, figure_bytes(fig, fmt))
        out.append(path)
    plt.close(fig)
    return out


def built(
    data: Results, specs: Sequence[Spec], skipped: dict[str, str], absent: dict[str, str] | None = None
) -> Iterator[tuple[Spec, Any]]:
    """Each spec with what its ``build`` made from ``data`` (in the house style); a spec whose inputs are
    missing goes to ``skipped`` (``name -> why``) instead, and one of a family the folder holds no results
    of (:meth:`Results.absent`) to ``absent`` (to ``skipped`` when ``absent`` is not given)."""
    style.apply()
    for spec in specs:
        why = data.absent(spec.family)
        if why is not None:
            (skipped if absent is None else absent)[spec.name] = why
            continue
        try:
            made = spec.build(data)
        except MissingInput as err:
            skipped[spec.name] = str(err)
            continue
        if spec.family == "study" and spec.kind != "table":
            plot.note_diverged(made, data.diverged())
        yield spec, made


def draw(
    results: str | Path,
    out: str | Path,
    specs: Sequence[Spec],
    only: Sequence[str] | None = None,
    formats: Sequence[str] = ("png",),
) -> DrawReport:
    """Draw ``specs`` (those named in ``only``, when given) from the results folder ``results`` into ``out``:
    figures as ``<name>.<format>``, tables as ``<name>.md``/``.tex``/``.csv``. A spec whose inputs are
    missing is skipped and reported, not fatal; one of a family the folder holds nothing of (a study's
    figure in a model's folder, or the reverse) is left out (``absent``)."""
    bad = sorted(set(formats) - set(FORMATS))
    if bad:
        raise SettingError(f"unknown figure format(s) {bad}; choose from {', '.join(FORMATS)}")
    names = [s.name for s in specs]
    unknown = sorted(set(only or ()) - set(names))
    if unknown:
        raise SettingError(f"unknown figure(s) {unknown}; the figures are: {', '.join(names)}")
    check_figures_folder(Path(out), Path(results), names)
    data = Results(Path(results))
    report = DrawReport(Path(out))
    chosen = [s for s in specs if not only or s.name in only]
    for spec, made in built(data, chosen, report.skipped, report.absent):
        stem = report.out / spec.name
        if spec.kind == "table":
            report.drawn[spec.name] = tables.write(made, stem)
        else:
            report.drawn[spec.name] = save_figure(made, stem, formats)
    if report.drawn:  # the folder's index: what it holds, and from which results (every draw into it, merged)
        drawn = {**_index(report.out).get("drawn", {}), **{k: [p.name for p in v] for k, v in report.drawn.items()}}
        index = {"results": str(Path(results).resolve()), "drawn": drawn}
        atomic_write_text(report.out / FIGURES_FILE, json.dumps(index, indent=2) + "\n")
    return report


def _index(out: Path) -> dict[str, Any]:
    """A figures folder's index (``figures.json``), or ``{}`` when it has none or it cannot be read."""
    try:
        index = json.loads((out / FIGURES_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return index if isinstance(index, dict) else {}


def check_figures_folder(out: Path, results: Path, names: Sequence[str]) -> None:
    """Refuse, before drawing, an ``out`` that is not a figures folder of these ``results``
    (:func:`headprobe.core.outputs.claim`: a new folder, or one of figures, beside the results is fine), or a
    figures folder of other results (their figures would be replaced and the index mixed). A folder drawn
    before folders had an index is one of figures when it holds nothing but files named for the figures and
    tables (``names``)."""
    legacy = (
        out.is_dir()
        and not (out / FIGURES_FILE).exists()
        and any(out.iterdir())
        and all(p.is_file() and p.stem in names and p.suffix in SUFFIXES for p in out.iterdir())
    )
    if legacy:
        if why := input_conflict(out, FIGURES, [results]):
            raise OutputRefused(f"`out` {out} {why}; give another `out`")
        return
    claim(out, FIGURES, inputs=[results])
    drawn_from = _index(out).get("results")
    if drawn_from and Path(drawn_from).resolve() != results.resolve():
        raise OutputRefused(
            f"`out` {out} holds the figures of {drawn_from}, not of {results}; give another `out` (a folder's figures "
            "are of one results folder)"
        )


WRITERS = (
    ("`headprobe study`", "study_*"),
    ("`headprobe analyze`", "retrieval, needle_margin, entropy, reordering, erank, analysis_summary, head_agreement"),
    ("`headprobe ruler eval`", "ruler_scores, ruler_samples"),
    ("`headprobe ablate`", "ablation"),
    ("`headprobe graft`", "graft"),
)


def nothing_drawn(results: str | Path, specs: Sequence[Spec], what: str = "draw") -> str:
    """Why nothing could be drawn from ``results``: the tables every spec looked for, and what writes them."""
    tables = list(dict.fromkeys(t for s in specs for t in s.inputs))
    writers = "; ".join(f"{cmd} writes {names}" for cmd, names in WRITERS)
    return (
        f"nothing to {what} from {results}: looked below it for the tables the figures read "
        f"({', '.join(tables)}) and found none a figure could use ({writers}); `headprobe shortctx eval`'s "
        f"tables (shortctx_scores) have no figure: `headprobe show {results}` prints them"
    )


def written_by(table: str) -> str:
    """The command that writes the result table ``table`` (:data:`WRITERS`)."""
    for command, names in WRITERS:
        if any(table == n or (n.endswith("*") and table.startswith(n[:-1])) for n in names.split(", ")):
            return command
    return "no headprobe command"


def asked_not_drawn(results: str | Path, asked: Sequence[Spec], report: DrawReport) -> str:
    """Why none of the figures asked for by name (``asked``, of ``only``) was drawn from ``results``: the
    tables each reads, their files and the command that writes them, and why the folder's did not serve
    (``report``: what :func:`draw` skipped and left out)."""
    why = {**report.absent, **report.skipped}
    each = []
    for spec in asked:
        join = " or " if spec.family == "model" else " and "  # a model figure draws from either of its tables
        needs = join.join(f"{t}.parquet (written by {written_by(t)})" for t in spec.inputs)
        each.append(f"{spec.name} reads {needs}, and {results} holds none it can use ({why.get(spec.name, '')})")
    commands = ", ".join(dict.fromkeys(written_by(t) for spec in asked for t in spec.inputs))
    return (
        f"`only` {', '.join(s.name for s in asked)}: nothing drawn from {results}: {'; '.join(each)}; give the "
        f"folder that {commands} wrote, or leave out `only` to draw what this folder holds"
    )
