"""What every ``analyses/`` script shares: read a trained grid, settle the settings, measure, print.

    python analyses/<script>.py RUNS [--out RESULTS] [--runs pt,cpt] [--lengths 1024] [--samples 4]
                                     [--tasks niah_single_1,...] [--task-files arc=FILE,...] [--device cpu]
    python analyses/external_eval.py RUNS [--out RESULTS] [--runs cpt,sft] [-- COMMAND with {path} ...]

``RUNS`` is a grid's runs folder (``headprobe train grid`` or ``headprobe study`` wrote it; its
``manifest.json`` lists every finished run). The settings start from the ``study`` section of the recipe
that trained the grid (the manifest names the recipe and its profile; headprobe's defaults otherwise), then
the script's own, then the options. Everything is measured through :func:`headprobe.study.measure`, so
every part resumes (a rerun measures only what is missing) and lands in ``RESULTS`` as the tidy tables
``headprobe figures`` and ``headprobe report`` read; several scripts can share one ``RESULTS``. A script
that hands the runs to an outside evaluator instead (``hand_off``) exports them as Hugging Face folders
and runs the command after ``--`` on each (:func:`headprobe.study.exports.export_runs`).
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
    prints (titles starting with one of ``shows``); or, with ``hand_off``, none of that: the runs exported
    and handed to the command after ``--``."""

    doc: str
    parts: tuple[str, ...]
    settings: dict[str, Any] = field(default_factory=dict)
    shows: tuple[str, ...] = ()
    hand_off: bool = False


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
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[argv.index("--") + 1 :] if experiment.hand_off and "--" in argv else None
    argv = argv[: argv.index("--")] if command is not None else argv
    parser = argparse.ArgumentParser(description=experiment.doc.strip().splitlines()[0])
    parser.add_argument("runs_folder", type=Path, help="the grid's runs folder (holding manifest.json)")
    parser.add_argument("--out", type=Path, default=Path("results/analyses"), help="results folder")
    if experiment.hand_off:
        parser.add_argument("--runs", help="comma list of the grid's runs to hand off (default: every run)")
    else:
        parser.add_argument("--device", default="cpu", help="cpu | cuda")
    for option in sorted({o for part in experiment.parts for o in _OPTIONS[part]}):
        parser.add_argument(f"--{option.replace('_', '-')}", dest=option, help=_HELP[option])
    args = parser.parse_args(argv)
    args.command = command
    return args


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
    if experiment.hand_off:
        return hand_off(manifest, args)
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


def hand_off(manifest: dict[str, Any], args: argparse.Namespace) -> int:
    """Export the chosen runs and run the command on each; print where each went. 0 on success, 1 when a
    command failed, 2 on bad input."""
    from headprobe.core.errors import HeadprobeError
    from headprobe.study.exports import export_runs
    from headprobe.study.tables import markdown

    try:
        table = export_runs(manifest, args.out, _words(args.runs) if args.runs else None, args.command)
    except HeadprobeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    shown = ["member", "seed", "run", "path"] + (["exit_code"] if args.command is not None else [])
    print(f"\n{markdown(table[shown])}")
    print(f"\nexports: {args.out / 'hf'}; table: {args.out / 'tables' / 'study_exports.parquet'}")
    return 1 if (table["exit_code"].fillna(0) != 0).any() else 0
