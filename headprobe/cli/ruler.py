"""``headprobe ruler generate`` and ``headprobe ruler eval``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer
from rich.table import Table

from headprobe.cli.common import DTYPE_HELP, fail, gib, ints, say_error, wide_console, words

FIT_HELP = "ruler (RULER's size search: samples below the target) | tight (each sample fills its budget)"
CWE_HELP = "ruler (RULER's word counts by length) | fit (the small counts wherever the standard ones do not fit)"
WRAPPER_HELP = (
    "prompt wrapper (RULER's model template): base, chat (the model folder's chat template), "
    "or a string/file containing {task_template}"
)


def ruler_generate(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option(help="JSONL file to write")],
    tasks: Annotated[str, typer.Option(help="all or a comma list of task names")] = "all",
    lengths: Annotated[str, typer.Option(help="comma list of target lengths in tokens")] = "4096",
    samples: Annotated[int, typer.Option(help="samples per task and length")] = 25,
    tokenizer: Annotated[str, typer.Option(help="byte or a tokenizer.json (the evaluated model's)")] = "byte",
    seed: int = 42,
    haystack_file: Annotated[list[Path] | None, typer.Option(help="text files for the essay haystack")] = None,
    qa_file: Annotated[list[Path] | None, typer.Option(help="SQuAD v2 and/or HotpotQA dev JSON files")] = None,
    reserve: Annotated[int, typer.Option(help="tokens kept free for special tokens (e.g. 1 for a BOS)")] = 0,
    wrapper: Annotated[str, typer.Option(help=WRAPPER_HELP)] = "base",
    fit: Annotated[str, typer.Option(help=FIT_HELP)] = "ruler",
    cwe_rule: Annotated[str, typer.Option(help=CWE_HELP)] = "ruler",
) -> None:
    """Generate RULER-style samples fitted to a tokenizer, one JSON object per line."""
    from headprobe.evals.ruler import RulerError, RulerGenerator, resolve_tasks
    from headprobe.evals.ruler.samples import qa_file_kinds
    from headprobe.evals.ruler.templates import resolve_wrapper
    from headprobe.model.atomic import atomic_write_text
    from headprobe.model.tokenizer import load_tokenizer

    try:
        tok = load_tokenizer(tokenizer)
        folder = Path(tokenizer) if Path(tokenizer).is_dir() else Path(tokenizer).parent
        qa = qa_file_kinds([str(f) for f in qa_file or []])
        template = resolve_wrapper(wrapper, folder if tokenizer != "byte" else None)
        files = haystack_file or None
        gen = RulerGenerator(tok, seed, files, qa, reserve, wrapper=template, fit=fit, cwe_rule=cwe_rule)
        rows = list(gen.samples(resolve_tasks(tasks), ints(lengths), samples))
    except (RulerError, ValueError, FileNotFoundError) as err:
        raise fail(err, ctx) from None
    atomic_write_text(out, "".join(json.dumps(r) + "\n" for r in rows))
    typer.echo(f"{out}: {len(rows)} samples")


def ruler_eval(
    ctx: typer.Context,
    checkpoints: Annotated[
        list[Path], typer.Argument(help="our checkpoints or local Hugging Face models (several: one folder each)")
    ],
    out: Annotated[Path, typer.Option(help="results folder")] = Path("results/ruler"),
    tasks: Annotated[str, typer.Option(help="all or a comma list of task names")] = "all",
    lengths: Annotated[str, typer.Option(help="comma list of lengths in tokens")] = "4096",
    samples: Annotated[int, typer.Option(help="samples per task and length")] = 25,
    data: Annotated[Path | None, typer.Option(help="read samples from this JSONL instead of generating")] = None,
    seed: int = 42,
    haystack_file: Annotated[list[Path] | None, typer.Option(help="text files for the essay haystack")] = None,
    qa_file: Annotated[list[Path] | None, typer.Option(help="SQuAD v2 and/or HotpotQA dev JSON files")] = None,
    device: str = "cpu",
    memory_limit: Annotated[float | None, typer.Option(help="GiB the run may use (default: what is free)")] = None,
    batch_size: Annotated[int, typer.Option(help="samples decoded together (0 = as many as memory allows)")] = 0,
    wrapper: Annotated[str, typer.Option(help=WRAPPER_HELP)] = "base",
    fit: Annotated[str, typer.Option(help=FIT_HELP)] = "ruler",
    cwe_rule: Annotated[str, typer.Option(help=CWE_HELP)] = "ruler",
    dtype: Annotated[str | None, typer.Option(help=DTYPE_HELP)] = None,
    progress: bool = True,
) -> None:
    """Greedy decoding on RULER-style samples; tables of every sample and of the per-task, per-length and
    overall scores. Several checkpoints (a grid) are evaluated on the same samples, each into OUT/<name>/,
    and compared."""
    from headprobe.cli.progress import progress_bar
    from headprobe.evals.ruler import RulerError
    from headprobe.evals.ruler.evaluate import RulerSettings, evaluate_many
    from headprobe.probe import ModelLoadError
    from headprobe.runs import DoesNotFit

    settings = RulerSettings(
        tasks=words(tasks),
        lengths=ints(lengths),
        samples=samples,
        seed=seed,
        haystack_files=[str(f) for f in haystack_file] if haystack_file else None,
        qa_files=[str(f) for f in qa_file] if qa_file else None,
        data=str(data) if data else None,
        wrapper=wrapper,
        fit=fit,
        cwe_rule=cwe_rule,
        dtype=dtype,
    )
    try:
        with progress_bar("ruler", ctx, enabled=progress) as bar:
            report = evaluate_many(
                checkpoints,
                out,
                settings,
                device=device,
                memory_limit=gib(memory_limit),
                progress=bar,
                batch_size=batch_size or None,
            )
    except (RulerError, ModelLoadError, DoesNotFit, ValueError) as err:
        raise fail(err, ctx) from None
    console = wide_console()
    for name, scores in report.results.items():
        console.print(score_table(scores), f"{name}: {out if len(checkpoints) == 1 else out / name}")
    if len(checkpoints) > 1 and report.results:
        console.print(comparison_table(report.results))
    for name, message in report.errors.items():
        say_error(f"{name}: {message}", ctx)
    if report.errors:
        raise typer.Exit(1)


def comparison_table(results: dict[str, pd.DataFrame]) -> Table:
    """Checkpoints x lengths: the per-length means and the overall RULER-style score."""
    from headprobe.evals.ruler.tables import LABEL, overall, per_length

    lengths = sorted({n for scores in results.values() for n in per_length(scores)})
    table = Table(title=f"{LABEL} scores (0-100), mean over tasks")
    table.add_column("checkpoint")
    for length in lengths:
        table.add_column(f"{length:,}", justify="right")
    table.add_column("overall", justify="right")
    for name, scores in results.items():
        per, total = per_length(scores), overall(scores)
        table.add_row(name, *[f"{per[n]:.2f}" if n in per else "-" for n in lengths], _score(total))
    return table


def score_table(scores: pd.DataFrame) -> Table:
    """Tasks x lengths of one checkpoint, with the per-length means."""
    from headprobe.evals.ruler.tables import LABEL, overall, per_length, per_task

    means = per_length(scores)
    table = Table(title=f"{LABEL} scores (0-100): overall {_score(overall(scores))}")
    table.add_column("task")
    for length in means:
        table.add_column(f"{length:,}", justify="right")
    for task, per in per_task(scores).items():
        table.add_row(task, *[f"{per[n]:.2f}" if n in per else "-" for n in means])
    table.add_row("[bold]mean", *[f"[bold]{means[n]:.2f}" for n in means])
    return table


def _score(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
