"""``headprobe train grid``: every member of a scale through pt -> cpt -> sft, resumable.

``RUNS/<preset>/<stage>/`` is one training run (see :mod:`trainer.train`); each stage starts from the
previous stage's ``final/`` checkpoint. A stage counts as finished when its ``final/`` checkpoint and
``result.json`` exist; finished stages are skipped, unfinished ones resume from their newest step
checkpoint, so rerunning the command after a crash continues. ``RUNS/manifest.json`` maps
member -> stage -> checkpoint, tokens and final loss, and is rewritten atomically after every stage.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path
from typing import Any

from headprobe.model.atomic import atomic_write_text
from headprobe.model.presets import list_presets
from trainer.config import RESULT_FILE, TrainConfig, TrainError, TrainResult
from trainer.train import train

STAGES = ("pt", "cpt", "sft")


def recipe(scale: str) -> dict[str, Any]:
    """The study's recipe for a scale (``trainer/configs/<scale>.json``)."""
    try:
        text = files("trainer.configs").joinpath(f"{scale}.json").read_text()
    except FileNotFoundError:
        raise TrainError(f"no recipe for scale {scale!r}") from None
    return json.loads(text)


def stage_dir(runs: Path, member: str, stage: str, cpt_freeze: str | None) -> Path:
    if stage in ("cpt", "sft") and cpt_freeze:
        return runs / member / f"{stage}-frozen-{cpt_freeze}"
    return runs / member / stage


def is_finished(folder: Path) -> bool:
    return (folder / "final" / "config.json").is_file() and (folder / RESULT_FILE).is_file()


def _stage_config(
    member: str, stage: str, folder: Path, previous: Path | None, plan: dict[str, Any], cpt_freeze: str | None,
    overrides: dict[str, Any] | None,
) -> TrainConfig:  # fmt: skip
    """The recipe's settings for one stage of one member, with the overrides (a length override replaces
    the recipe's steps or tokens)."""
    settings = dict(plan[stage])
    if overrides and ({"steps", "tokens"} & set(overrides)):
        settings.pop("steps", None)
        settings.pop("tokens", None)
    settings.update(overrides or {})
    return TrainConfig(
        stage=stage,  # type: ignore[arg-type]
        preset=member if stage == "pt" else None,
        init=None if stage == "pt" else str(previous),
        out=str(folder),
        resume=True,
        freeze=cpt_freeze if stage == "cpt" else None,  # type: ignore[arg-type]
        **settings,
    )


def _check_choice(scale: str, members: list[str] | None, stages: list[str] | None) -> tuple[list[str], list[str]]:
    names = list_presets(scale)
    chosen = names if not members else [m if m.startswith(f"{scale}-") else f"{scale}-{m}" for m in members]
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        raise TrainError(f"unknown members {unknown} for scale {scale}; available: {', '.join(names)}")
    bad = [s for s in stages or STAGES if s not in STAGES]
    if bad:
        raise TrainError(f"unknown stages {bad}; choose from {', '.join(STAGES)}")
    return chosen, [s for s in STAGES if s in (stages or STAGES)]


def run_grid(
    scale: str,
    runs: str | Path,
    members: list[str] | None = None,
    stages: list[str] | None = None,
    cpt_freeze: str | None = None,
    overrides: dict[str, Any] | None = None,
    run_stage: Callable[[TrainConfig], TrainResult] = train,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run (or continue) the grid; returns the manifest. ``overrides`` apply to every stage.

    Under ``torchrun`` every process walks the same plan (each stage is a collective training run);
    only the main process logs and writes the manifest.
    """
    runs = Path(runs)
    main = int(os.environ.get("RANK", "0")) == 0
    if not main:
        log = lambda _msg: None  # noqa: E731
    chosen, order = _check_choice(scale, members, stages)
    plan = recipe(scale)["stages"]
    manifest_path = runs / "manifest.json"
    manifest: dict[str, Any] = {"scale": scale, "cpt_freeze": cpt_freeze, "members": {}}
    if manifest_path.is_file():
        manifest["members"] = json.loads(manifest_path.read_text()).get("members", {})
    for member in chosen:
        previous: Path | None = None
        for stage in STAGES:
            folder = stage_dir(runs, member, stage, cpt_freeze)
            if stage not in order:
                previous = folder / "final" if is_finished(folder) else previous
                continue
            if stage != "pt" and previous is None:
                raise TrainError(
                    f"{member}: stage {stage} needs the previous stage's checkpoint; "
                    f"include it in `stages` or run it first"
                )
            if is_finished(folder):
                log(f"{member} {stage}: finished earlier, skipping")
            else:
                log(f"{member} {stage}: training into {folder}")
                if run_stage(_stage_config(member, stage, folder, previous, plan, cpt_freeze, overrides)).interrupted:
                    log(f"{member} {stage}: interrupted; rerun the same command to continue")
                    if main:
                        _write_manifest(manifest_path, manifest)
                    return manifest
            result = json.loads((folder / RESULT_FILE).read_text())
            manifest["members"].setdefault(member, {})[stage] = {
                "checkpoint": str(folder / "final"),
                "tokens": result["tokens"],
                "steps": result["steps"],
                "final_loss": result["final_loss"],
            }
            if main:
                _write_manifest(manifest_path, manifest)
            previous = folder / "final"
    return manifest


def _write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(manifest, indent=2) + "\n")
