"""What every ``analyses/`` script shares: read a trained grid, settle the settings, measure, print.

    python analyses/<script>.py RUNS [--out RESULTS] [--runs pt,cpt] [--lengths 1024] [--samples 4]
                                     [--tasks niah_single_1,...] [--task-files arc=FILE,...] [--device cpu]

``RUNS`` is a grid's runs folder (``headprobe train grid`` or ``headprobe study`` wrote it; its
``manifest.json`` lists every finished run). The settings start from the ``study`` section of the recipe
that trained the grid (the manifest names the recipe and its profile; headprobe's defaults otherwise), then
the script's own, then the options. Everything is measured through :func:`headprobe.study.measure`, so
every part resumes (a rerun measures only what is missing) and lands in ``RESULTS`` as the tidy tables
``headprobe figures`` and ``headprobe report`` read; several scripts can share one ``RESULTS``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

# per measurement: the options that apply and the StudySettings field each sets
_OPTIONS = {
    "probes": {"samples": "probe_samples"},
    "heads": {"runs": "analysis_runs", "lengths": "analysis_lengths", "samples": "analysis_samples"},
    "ruler": {"runs": "ruler_runs", "lengths": "ruler_lengths", "samples": "ruler_samples", "tasks": "ruler_tasks"},
    "shortctx": {"runs": "shortctx_runs", "task_files": "shortctx_tasks"},
}
_HELP = {
    "runs": "comma list of the grid's runs to measure, e.g. pt,cpt",
    "lengths": "comma list of context lengths in tokens",
    "samples": "samples (inputs, needles or examples) per model and length",
    "tasks": "comma list of RULER-style tasks",
    "task_files": "short-context tasks and their local files, e.g. arc=ARC-Easy-Test.jsonl,piqa=valid.jsonl "
    "(default: the recipe's, else the built-in set)",
}


@dataclass(frozen=True)
class Experiment:
    """One script: what it measures (``parts`` of :data:`headprobe.study.MEASUREMENTS`), the settings it
    fixes (fields of :class:`headprobe.study.StudySettings`), and which comparisons of ``report.md`` it
    prints (titles starting with one of ``shows``)."""

    doc: str
    parts: tuple[str, ...]
    settings: dict[str, Any] = field(default_factory=dict)
    shows: tuple[str, ...] = ()


def recipe_settings(manifest: dict[str, Any]) -> dict[str, Any]:
    """The ``study`` section of the recipe (and profile) the manifest names; ``{}`` when there is none."""
    if not manifest.get("recipe"):
        return {}
    from trainer.config import TrainError
    from trainer.grid import Recipe

    try:
        return dict(Recipe.load(manifest["recipe"], manifest.get("profile")).study)
    except TrainError as err:
        print(f"warning: the grid's recipe cannot be read ({err}); using headprobe's defaults", file=sys.stderr)
        return {}


def _words(text: str) -> list[str]:
    return [w.strip() for w in text.split(",") if w.strip()]


def parse(experiment: Experiment, argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=experiment.doc.strip().splitlines()[0])
    parser.add_argument("runs_folder", type=Path, help="the grid's runs folder (holding manifest.json)")
    parser.add_argument("--out", type=Path, default=Path("results/analyses"), help="results folder")
    parser.add_argument("--device", default="cpu", help="cpu | cuda")
    for option in sorted({o for part in experiment.parts for o in _OPTIONS[part]}):
        parser.add_argument(f"--{option.replace('_', '-')}", dest=option, help=_HELP[option])
    return parser.parse_args(argv)


def settings_for(experiment: Experiment, manifest: dict[str, Any], args: argparse.Namespace):
    """The recipe's study settings, then the experiment's, then the options (``StudySettings``)."""
    from headprobe.study import StudySettings

    settings = StudySettings.from_dict({**recipe_settings(manifest), **experiment.settings})
    changes: dict[str, Any] = {}
    for part in experiment.parts:
        for option, name in _OPTIONS[part].items():
            value = getattr(args, option, None)
            if value is None:
                continue
            if option == "samples":
                changes[name] = int(value)
            elif option == "lengths":
                changes[name] = [int(x) for x in _words(value)]
            elif option == "task_files":
                pairs = [w.partition("=") for w in _words(value)]
                changes[name] = {task.strip(): file.strip() or None for task, _, file in pairs}
            else:
                changes[name] = _words(value)
    settings = replace(settings, **changes)
    settings.validate()
    return settings


def main(experiment: Experiment, argv: list[str] | None = None) -> int:
    """Run the experiment on ``argv``; print its comparisons; 0 on success, 2 on bad input."""
    from headprobe.study import StudyError, measure
    from headprobe.study.tables import markdown

    args = parse(experiment, argv)
    manifest_path = args.runs_folder / "manifest.json"
    if not manifest_path.is_file():
        print(f"error: {manifest_path} does not exist: give the runs folder of a trained grid", file=sys.stderr)
        return 2
    manifest = json.loads(manifest_path.read_text())
    try:
        settings = settings_for(experiment, manifest, args)
        report = measure(manifest, args.out, settings, parts=experiment.parts, device=args.device)
    except (StudyError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for title, frame in report.comparisons.items():
        if any(title.startswith(s) for s in experiment.shows) and isinstance(frame, pd.DataFrame) and len(frame):
            print(f"\n{title}\n\n{markdown(frame)}")
    for what, message in report.errors.items():
        print(f"failed: {what}: {message}", file=sys.stderr)
    print(f"\nresults: {args.out} (tables/, report.md); draw them with: headprobe figures {args.out}")
    return 1 if report.errors else 0
