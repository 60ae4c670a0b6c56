"""The ``headprobe`` command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from trainer.cli import data_app, train_app

app = typer.Typer(
    help="headprobe: how attention-head shape decides long-context retrieval.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(train_app, name="train")
app.add_typer(data_app, name="data")
ruler_app = typer.Typer(help="RULER-style long-context evaluation (13 tasks, generated offline).", no_args_is_help=True)
app.add_typer(ruler_app, name="ruler")
shortctx_app = typer.Typer(help="Short-context multiple-choice evaluation by log-likelihood.", no_args_is_help=True)
app.add_typer(shortctx_app, name="shortctx")


def _error(err: Exception) -> typer.Exit:
    typer.secho(f"error: {err}", fg=typer.colors.RED, err=True)
    return typer.Exit(2)


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected a comma list of integers, got {text!r}") from None


DTYPE_HELP = "model dtype: float32 | bfloat16 | float16 | float64 (default: as saved; HF models float32)"
WRAPPER_HELP = (
    "prompt wrapper (RULER's model template): base, chat (the model folder's chat template), "
    "or a string/file containing {task_template}"
)


@ruler_app.command("generate")
def ruler_generate(
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
) -> None:
    """Generate RULER-style samples fitted to a tokenizer, one JSON object per line."""
    from headprobe.model.atomic import atomic_write_text
    from headprobe.model.tokenizer import load_tokenizer
    from headprobe.ruler import RulerError, RulerGenerator, resolve_tasks
    from headprobe.ruler.evaluate import qa_file_kinds
    from headprobe.ruler.templates import resolve_wrapper

    try:
        tok = load_tokenizer(tokenizer)
        folder = Path(tokenizer) if Path(tokenizer).is_dir() else Path(tokenizer).parent
        qa = qa_file_kinds([str(f) for f in qa_file or []])
        template = resolve_wrapper(wrapper, folder if tokenizer != "byte" else None)
        gen = RulerGenerator(tok, seed, haystack_file or None, qa, reserve, wrapper=template)
        rows = list(gen.samples(resolve_tasks(tasks), _ints(lengths), samples))
    except (RulerError, ValueError, FileNotFoundError) as err:
        raise _error(err) from None
    atomic_write_text(out, "".join(json.dumps(r) + "\n" for r in rows))
    typer.echo(f"{out}: {len(rows)} samples")


@ruler_app.command("eval")
def ruler_eval(
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
    dtype: Annotated[str | None, typer.Option(help=DTYPE_HELP)] = None,
    progress: bool = True,
) -> None:
    """Greedy decoding on RULER-style samples; scores.json with per-task, per-length and overall scores.
    Several checkpoints (a grid) are evaluated on the same samples, each into OUT/<name>/, and compared."""
    from headprobe.analyze import AnalysisError
    from headprobe.plan import wide_console
    from headprobe.probe import ModelLoadError
    from headprobe.ruler import RulerError, resolve_tasks
    from headprobe.ruler.evaluate import RulerSettings, comparison_table, evaluate_many, score_table

    settings = RulerSettings(
        tasks=[t for t in tasks.split(",") if t],
        lengths=_ints(lengths),
        samples=samples,
        seed=seed,
        haystack_files=[str(f) for f in haystack_file] if haystack_file else None,
        qa_files=[str(f) for f in qa_file] if qa_file else None,
        data=str(data) if data else None,
        wrapper=wrapper,
        dtype=dtype,
    )
    try:
        resolve_tasks(settings.tasks)  # bad settings fail once, before any checkpoint is loaded
        result = evaluate_many(
            checkpoints,
            out,
            settings,
            device=device,
            memory_limit=int(memory_limit * 2**30) if memory_limit else None,
            progress=progress,
            batch_size=batch_size or None,
        )
    except (RulerError, ModelLoadError, AnalysisError, ValueError) as err:
        raise _error(err) from None
    console = wide_console()
    if len(checkpoints) == 1:
        console.print(score_table(next(iter(result["checkpoints"].values()))))
        typer.echo(f"wrote {out / 'scores.json'}")
        return
    for name, scores in result["checkpoints"].items():
        console.print(score_table(scores), f"{name}: {out / name / 'scores.json'}")
    if result["checkpoints"]:
        console.print(comparison_table(result["checkpoints"]))
        typer.echo(f"wrote {out / 'comparison.json'}")
    for name, message in result["errors"].items():
        typer.secho(f"error: {name}: {message}", fg=typer.colors.RED, err=True)
    if result["errors"]:
        raise typer.Exit(1)


@app.command()
def plan(
    scale: Annotated[str | None, typer.Option(help="toy | 0.6b | 3b (default: all grids)")] = None,
    seq_len: Annotated[int, typer.Option("--seq-len", help="sequence length for FLOPs and KV cache")] = 4096,
    config: Annotated[
        list[Path] | None,
        typer.Option("--config", help="price a config.json (repeatable) instead of presets"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON list instead of a table")] = False,
) -> None:
    """Parameters, attention parameters, training FLOPs/token and KV-cache bytes of each grid member."""
    from headprobe.model.config import ConfigError, ModelConfig
    from headprobe.model.presets import list_scales
    from headprobe.plan import configs_for, plan_rows, plan_table, wide_console

    if seq_len < 1:
        raise typer.BadParameter("--seq-len must be >= 1")
    try:
        if config:
            configs = [ModelConfig.load(p) for p in config]
        else:
            if scale is not None and scale not in list_scales():
                raise typer.BadParameter(f"unknown scale {scale!r}; choose one of {list_scales()}")
            configs = configs_for(scale)
    except (ConfigError, FileNotFoundError) as err:
        raise typer.BadParameter(str(err)) from None
    rows = plan_rows(configs, seq_len)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
    else:
        wide_console().print(plan_table(rows, seq_len))


@shortctx_app.command("eval")
def shortctx_eval(
    checkpoint: Annotated[Path, typer.Argument(help="our checkpoint or a local Hugging Face model")],
    task: Annotated[
        str, typer.Option(help="builtin, jsonl, arc, hellaswag, winogrande, race, piqa, openbookqa, commonsenseqa")
    ] = "builtin",
    file: Annotated[Path | None, typer.Option(help="the task's local file (original format)")] = None,
    limit: Annotated[int | None, typer.Option(help="evaluate only the first N items")] = None,
    out: Annotated[Path | None, typer.Option(help="write results JSON here")] = None,
    device: str = "cpu",
    dtype: Annotated[str | None, typer.Option(help=DTYPE_HELP)] = None,
    batch_size: Annotated[int, typer.Option(help="sequences scored together (right-padded)")] = 16,
) -> None:
    """Multiple-choice accuracy by log-likelihood (acc and length-normalised acc_norm)."""
    from headprobe.model.atomic import atomic_write_text
    from headprobe.probe import ModelLoadError, load_model, parse_dtype
    from headprobe.shortctx import ShortCtxError, builtin_items, evaluate_items, load_task

    try:
        if task == "builtin":
            items = builtin_items()
        elif file is None:
            raise ShortCtxError(f"--task {task} needs --file with the task's local data")
        else:
            items = load_task(task, file)
        model = load_model(checkpoint, device=device, dtype=parse_dtype(dtype))
        result = evaluate_items(model, items[:limit], progress=True, batch_size=max(1, batch_size))
    except (ShortCtxError, ModelLoadError, ValueError) as err:
        raise _error(err) from None
    summary = {"checkpoint": str(checkpoint), "task": task, "file": str(file) if file else None, "dtype": dtype}
    summary.update(result)
    if out:
        atomic_write_text(out, json.dumps(summary, indent=2) + "\n")
    typer.echo(f"{task}: acc {result['acc']:.4f}  acc_norm {result['acc_norm']:.4f}  ({result['n']} items)")


@app.command()
def analyze(
    checkpoints: Annotated[list[Path], typer.Argument(help="checkpoint folders (ours or local Hugging Face models)")],
    metrics: Annotated[str, typer.Option(help="comma list of retrieval,entropy,reordering,erank")] = (
        "retrieval,entropy,reordering,erank"
    ),
    lengths: Annotated[str, typer.Option(help="comma list of context lengths in tokens")] = "4096",
    samples: Annotated[int, typer.Option(help="inputs per length (needle prompts for retrieval)")] = 4,
    rows: Annotated[str, typer.Option(help="query rows to analyse: all | last:N | stride:N")] = "all",
    topk: Annotated[int, typer.Option(help="top-k keys per row for token reordering")] = 16,
    out: Annotated[Path, typer.Option(help="results folder")] = Path("results/analyze"),
    seed: int = 0,
    max_new_tokens: Annotated[int, typer.Option(help="retrieval: decoding budget per sample")] = 50,
    haystack_file: Annotated[list[Path] | None, typer.Option(help="text files to use as haystack")] = None,
    device: Annotated[str, typer.Option(help="cpu | cuda")] = "cpu",
    dtype: Annotated[str | None, typer.Option(help=DTYPE_HELP)] = None,
    memory_limit: Annotated[float | None, typer.Option(help="GiB the run may use (default: what is free)")] = None,
    progress: bool = True,
) -> None:
    """Per-head retrieval scores, attention entropy, token reordering and per-layer effective rank,
    exact and without any L x L matrix; results as Parquet plus summary.json."""
    from headprobe.analyze import AnalysisError, AnalyzeSettings
    from headprobe.analyze import analyze as run

    try:
        settings = AnalyzeSettings(
            metrics=[m.strip() for m in metrics.split(",") if m.strip()],
            lengths=[int(x) for x in lengths.split(",") if x.strip()],
            samples=samples,
            rows=rows,
            topk=topk,
            seed=seed,
            max_new_tokens=max_new_tokens,
            haystack=[str(f) for f in haystack_file] if haystack_file else None,
            dtype=dtype,
        )
        settings.validate()
    except (AnalysisError, ValueError) as err:
        typer.secho(f"error: {err}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    limit = int(memory_limit * 2**30) if memory_limit else None
    result = run(checkpoints, out, settings, device=device, memory_limit=limit, progress=progress)
    for name, summary in result["checkpoints"].items():
        typer.echo(f"{name}: {out / name}")
        for metric, per_length in summary["metrics"].items():
            for length, entry in per_length.items():
                typer.echo(f"  {metric:10s} L={length:>7}: {_one_line(metric, entry)}")
    if result["errors"]:
        raise typer.Exit(1)


def _one_line(metric: str, entry: dict) -> str:
    if metric == "retrieval":
        heads = entry["retrieval_heads"].get("all", {})
        return (
            f"{entry['n_kept']}/{entry['n_samples']} samples kept, {heads.get('count', 0)} retrieval heads "
            f"({heads.get('fraction', 0):.1%})"
        )
    if metric == "erank":
        values = list(entry["per_layer"].values())
        return f"effective rank {values[0]:.1f} (embedding) -> {values[-1]:.1f} (last block)"
    by_type = ", ".join(f"{t} {v:.3f}" for t, v in entry["by_layer_type"].items())
    return f"mean {entry['mean']:.3f} ({by_type})"


@app.command()
def demo(
    seq_len: Annotated[int, typer.Option("--seq-len")] = 1024,
    new_tokens: Annotated[int, typer.Option("--new-tokens")] = 24,
    seed: int = 0,
) -> None:
    """The built-in CPU default: plan the paper grids, build and run every toy preset."""
    from headprobe.demo import run_demo

    run_demo(seq_len=seq_len, new_tokens=new_tokens, seed=seed)


if __name__ == "__main__":
    app()
