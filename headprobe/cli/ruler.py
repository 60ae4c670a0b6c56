"""``headprobe ruler generate`` and ``headprobe ruler eval``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import pandas as pd
import typer
from rich.table import Table

from headprobe.cli.common import (
    MemoryLimit,
    check_run,
    fail,
    gib,
    resumable,
    say_error,
    say_warning,
    settings_from,
    wide_console,
    with_settings,
)
from headprobe.core.settings import MODELS_HELP, Range
from headprobe.evals.ruler.resolve import DEFAULT_LENGTH
from headprobe.evals.ruler.settings import RulerSettings

if TYPE_CHECKING:
    from headprobe.evals.ruler.tables import Coverage

GENERATE_SETTINGS = (
    "tasks",
    "lengths",
    "samples",
    "seed",
    "haystack_files",
    "qa_files",
    "prompt_format",
    "fit",
    "cwe_rule",
)
"""The :class:`RulerSettings` fields that ``ruler generate`` takes: those that make the samples (not ``data``,
which reads samples, nor the model's ``dtype`` and ``allow_beyond_trained``)."""


def ruler_generate(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option(help="JSONL file to write")],
    tokenizer: Annotated[
        str,
        typer.Option(
            help="byte, a tokenizer.json, or the evaluated model: its folder or .gguf file (its tokenizer and chat "
            "template)"
        ),
    ] = "byte",
    reserve: Annotated[
        int, typer.Option(help="tokens kept free for special tokens (e.g. 1 for a BOS)"), Range(minimum=0)
    ] = 0,
    overwrite: Annotated[bool, typer.Option(help="replace an existing --out file; without it, it is refused")] = False,
    **options: Any,
) -> None:
    """Generate RULER-style samples fitted to a tokenizer, one JSON object per line. A task whose smallest
    prompt does not fit a length is skipped there, with a warning, and the samples of that length record it
    (``skipped_tasks``) for ``ruler eval``."""
    from headprobe.core.atomic import atomic_write_text
    from headprobe.core.outputs import SAMPLES, claim
    from headprobe.evals.ruler import RulerGenerator
    from headprobe.evals.ruler.samples import qa_file_kinds, skip_warnings, skipped_tasks
    from headprobe.hooked import model_tokenizer
    from headprobe.model.tokenizer import load_tokenizer
    from headprobe.text.prompt_format import resolve_wrapper

    settings = settings_from(RulerSettings, options)  # a malformed list: one line naming its flag (_Context)
    tasks = settings.validate()  # the chosen tasks; before any tokenizer loads or file is written
    if out.is_dir():
        raise fail(f"--out {out} is a folder; give the JSON-lines file to write, e.g. {out / 'samples.jsonl'}", ctx)
    inputs = [p for p in (tokenizer, *(settings.haystack_files or []), *(settings.qa_files or [])) if Path(p).exists()]
    claim(out, SAMPLES, inputs=inputs, overwrite=overwrite)  # never an input; a file only with --overwrite
    if not out.parent.is_dir():
        raise fail(f"--out {out}: the folder {out.parent} does not exist; create it or give another path", ctx)
    source = _tokenizer_files(tokenizer)
    tok = load_tokenizer("byte") if source is None else model_tokenizer(source)  # a checkpoint's own, as it loads
    folder = None if source is None else source if source.is_dir() else source.parent
    qa = qa_file_kinds(settings.qa_files)
    wrapper = resolve_wrapper(settings.prompt_format, folder)
    files = [Path(f) for f in settings.haystack_files or []] or None
    gen = RulerGenerator(
        tok, settings.seed, files, qa, reserve, wrapper=wrapper, fit=settings.fit, cwe_rule=settings.cwe_rule
    )
    rows = list(gen.samples(tasks, settings.lengths or [DEFAULT_LENGTH], settings.samples))
    for warning in skip_warnings(skipped_tasks(rows)):
        say_warning(warning, ctx)
    atomic_write_text(out, "".join(json.dumps(r) + "\n" for r in rows))
    typer.echo(f"{out}: {len(rows)} samples")


def _tokenizer_files(tokenizer: str) -> Path | None:
    """Where ``ruler generate --tokenizer`` finds the tokenizer and chat template: ``None`` for ``byte``, a
    GGUF file's converted folder (converted now if it was not), any other path as it is."""
    from headprobe.hooked import ModelLoadError, model_files

    if tokenizer == "byte":
        return None
    try:
        return model_files(tokenizer, log=typer.echo)
    except ModelLoadError as err:
        raise ModelLoadError(f"`tokenizer`: {err}") from None


def ruler_eval(
    ctx: typer.Context,
    checkpoints: Annotated[list[Path], typer.Argument(help=MODELS_HELP)],
    out: Annotated[Path, typer.Option(help="results folder")] = Path("results/ruler"),
    device: str = "cpu",
    memory_limit: MemoryLimit = None,
    batch_size: Annotated[
        int, typer.Option(help="samples decoded together (0 = as many as memory allows)"), Range(minimum=0)
    ] = 0,
    progress: bool = True,
    **options: Any,
) -> None:
    """Greedy decoding on RULER-style samples; tables of every sample and of the per-task, per-length and
    overall scores. Several checkpoints (a grid) are evaluated on the same samples, each into OUT/<name>/,
    and compared. Tasks skipped at a length (too long for it) are left out of that length's mean, which
    says over how many tasks it is taken."""
    from headprobe.cli.progress import progress_bar
    from headprobe.evals.ruler.job import evaluate_many

    check_run(ctx, out, device)
    settings = settings_from(RulerSettings, options)  # a malformed list: one line naming its flag (_Context)
    with resumable(out, ctx), progress_bar("ruler", ctx, enabled=progress) as bar:
        report = evaluate_many(
            checkpoints,
            out,
            settings,
            device=device,
            memory_limit=gib(memory_limit),
            progress=bar,
            batch_size=batch_size or None,
        )
    if not report.primary:  # another process of a torchrun launch: the first one reports
        return
    console = wide_console()
    for name, scores in report.results.items():
        console.print(score_table(scores), f"{name}: {out / name}")
    if len(checkpoints) > 1 and report.results:
        console.print(comparison_table(report.results))
    for name, message in report.errors.items():
        say_error(f"{name}: {message}", ctx)
    if report.errors:
        raise typer.Exit(1)


def comparison_table(results: dict[str, pd.DataFrame]) -> Table:
    """Checkpoints x lengths: the per-length means and the overall RULER-style score; a mean that leaves
    tasks out says over how many (``(11/13)``)."""
    from headprobe.evals.ruler.tables import LABEL, coverage, overall, per_length

    lengths = sorted({n for scores in results.values() for n in per_length(scores)})
    covered = {name: coverage(scores) for name, scores in results.items()}
    caption = "(n/N): mean over n of the N tasks; the others do not fit the length" if any(covered.values()) else None
    table = Table(title=f"{LABEL} scores (0-100), mean over tasks", caption=caption)
    table.add_column("checkpoint")
    for length in lengths:
        table.add_column(f"{length:,}", justify="right")
    table.add_column("overall", justify="right")
    for name, scores in results.items():
        per, total, cov = per_length(scores), overall(scores), covered[name]
        cells = [_mean(per[n], cov.get(n)) if n in per else "-" for n in lengths]
        table.add_row(name, *cells, _score(total))
    return table


def score_table(scores: pd.DataFrame) -> Table:
    """Tasks x lengths of one checkpoint, with the per-length means; where a mean leaves tasks out, a row
    says over how many tasks it is taken and the skipped tasks' cells say so."""
    from headprobe.evals.ruler.tables import LABEL, coverage, overall, per_length, per_task

    means, cov, scored = per_length(scores), coverage(scores), per_task(scores)
    skipped = {n: c.skipped for n, c in cov.items()}
    table = Table(title=f"{LABEL} scores (0-100): overall {_score(overall(scores))}")
    table.add_column("task")
    for length in means:
        table.add_column(f"{length:,}", justify="right")
    for task in [*scored, *dict.fromkeys(t for ts in skipped.values() for t in ts if t not in scored)]:
        per = scored.get(task, {})
        cells = [f"{per[n]:.2f}" if n in per else "skipped" if task in skipped.get(n, ()) else "-" for n in means]
        table.add_row(task, *cells)
    table.add_row("[bold]mean", *[f"[bold]{means[n]:.2f}" for n in means])
    if cov:
        table.add_row("tasks in mean", *[f"{cov[n].n} of {cov[n].n_tasks}" if n in cov else "all" for n in means])
    return table


def _mean(value: float, cov: Coverage | None) -> str:
    return f"{value:.2f}" if cov is None else f"{value:.2f} ({cov.n}/{cov.n_tasks})"


def _score(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


# their options: RulerSettings' fields (headprobe.core.settings); generate takes those that make samples
with_settings(ruler_generate, RulerSettings, GENERATE_SETTINGS)
with_settings(ruler_eval, RulerSettings)
