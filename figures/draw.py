"""Draw the study's figures and tables from a results folder into files."""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never a window
import matplotlib.pyplot as plt

from figures import style, tables
from figures.data import MissingInput, Results
from figures.spec import Spec
from headprobe.model.atomic import atomic_write_bytes

FORMATS = ("png", "pdf", "svg")


@dataclass
class DrawReport:
    """What :func:`draw` wrote (``name -> files``) and skipped (``name -> why``)."""

    out: Path
    drawn: dict[str, list[Path]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


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


def built(data: Results, specs: Sequence[Spec], skipped: dict[str, str]) -> Iterator[tuple[Spec, Any]]:
    """Each spec with what its ``build`` made from ``data`` (in the house style); a spec whose inputs are
    missing goes to ``skipped`` (``name -> why``) instead."""
    style.apply()
    for spec in specs:
        try:
            yield spec, spec.build(data)
        except MissingInput as err:
            skipped[spec.name] = str(err)


def draw(
    results: str | Path,
    out: str | Path,
    specs: Sequence[Spec],
    only: Sequence[str] | None = None,
    formats: Sequence[str] = ("png",),
) -> DrawReport:
    """Draw ``specs`` (those named in ``only``, when given) from the results folder ``results`` into ``out``:
    figures as ``<name>.<format>``, tables as ``<name>.md``/``.tex``/``.csv``. A spec whose inputs are
    missing is skipped and reported, not fatal."""
    bad = sorted(set(formats) - set(FORMATS))
    if bad:
        raise ValueError(f"unknown figure format(s) {bad}; choose from {', '.join(FORMATS)}")
    names = [s.name for s in specs]
    unknown = sorted(set(only or ()) - set(names))
    if unknown:
        raise ValueError(f"unknown figure(s) {unknown}; the figures are: {', '.join(names)}")
    data = Results(Path(results))
    report = DrawReport(Path(out))
    chosen = [s for s in specs if not only or s.name in only]
    for spec, made in built(data, chosen, report.skipped):
        stem = report.out / spec.name
        if spec.kind == "table":
            report.drawn[spec.name] = tables.write(made, stem)
        else:
            report.drawn[spec.name] = save_figure(made, stem, formats)
    return report
