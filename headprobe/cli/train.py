"""``headprobe train ...`` and ``headprobe data ...``: the commands of the bundled trainer.

headprobe never imports the trainer. It finds it as a plugin, through the entry point
``headprobe.plugins: trainer`` (pyproject.toml), and builds ``headprobe train``'s options from the
trainer's config dataclass (:func:`headprobe.cli.common.settings_options`, as ``analyze`` from its settings):
each field is a flag (``batch_size`` -> ``--batch-size``) with the field's default, type and help (its
metadata), so a default lives in one place. Without the trainer installed,
these commands say so.
"""

from __future__ import annotations

import inspect
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated, Any

import typer

from headprobe.cli.common import (
    Session,
    check_run,
    fail,
    int_range,
    ints,
    resumable,
    settings_options,
    stopped,
    words,
)
from headprobe.cli.progress import progress_bar
from headprobe.core.settings import Range

PLUGIN_GROUP = "headprobe.plugins"
GRID_RESUME = "rerun the same command to continue (finished runs are skipped, a stopped one resumes from its step)"
OVERWRITE_HELP = "replace an existing --out (a data folder or a file) atomically; without it, it is refused"


def trainer_plugin() -> Any | None:
    """The installed trainer plugin (:class:`trainer.plugin.TrainerPlugin`), or ``None``."""
    found = [ep for ep in entry_points(group=PLUGIN_GROUP) if ep.name == "trainer"]
    return found[0].load() if found else None


def _stage_command(plugin: Any):
    """``headprobe train [OPTIONS]``: one training stage, its options those of ``plugin.config``."""

    def stage(ctx: typer.Context, **values: Any) -> None:
        if ctx.invoked_subcommand is not None:
            return
        cfg = plugin.config(**values)
        device = getattr(cfg, "device", None)
        if isinstance(device, str) and device.startswith("cuda"):  # before any model or data is built ("auto": ours)
            check_run(ctx, device=device)
        how = "rerun the same command" + ("" if cfg.resume else " with --resume") + " to continue from it"
        with resumable(Path(cfg.out), ctx, kept=lambda: _step_kept(plugin, cfg.out), resume=how):
            show = cfg.progress  # a bar on a terminal, a line every 30 s in a log (progress_bar)
            with progress_bar("train", ctx, enabled=show, info=True) as bar:
                result = plugin.train(cfg, on_step=bar.report)
        state = "stopped at the signal" if result.interrupted else "done"
        loss = "n/a" if result.final_loss is None else f"{result.final_loss:.4f}"
        typer.echo(f"{state}: {result.steps} steps, {result.tokens:,} tokens, last loss {loss}, in {result.out}")
        if getattr(result, "status", None) == "diverged":  # it still wrote final/: the run is data, not a result
            typer.echo(f"diverged: {result.status_reason}")
        if result.interrupted:  # the trainer took the first Ctrl-C or SIGTERM: it saved a step and stopped
            raise stopped(ctx)

    ctx_param = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
    stage.__signature__ = inspect.Signature([ctx_param, *settings_options(plugin.config)])  # type: ignore[attr-defined]
    stage.__doc__ = "Run one training stage (without a subcommand); `grid` runs a whole scale."
    return stage


def _step_kept(plugin: Any, out: str | Path) -> str | None:
    """What a stopped training run kept: its newest step checkpoint, or nothing."""
    step = plugin.last_step(out)
    return None if step is None else f"the step checkpoint {step} is kept"


def _grid_command(plugin: Any):
    def grid(
        ctx: typer.Context,
        recipe: Annotated[str, typer.Option(help="a built-in scale (toy | 0.6b | 3b) or a recipe JSON file")] = "toy",
        profile: Annotated[str | None, typer.Option(help="a profile of the recipe, e.g. demo")] = None,
        members: Annotated[str | None, typer.Option(help="comma list, e.g. d128,d512 (default: all)")] = None,
        runs: Annotated[str | None, typer.Option(help="comma list of the recipe's runs (default: all)")] = None,
        seeds: Annotated[str | None, typer.Option(help="comma list, e.g. 0,1,2 (default: the recipe's)")] = None,
        data: Annotated[str | None, typer.Option(help="data folder for every run (default: the recipe's)")] = None,
        jobs: Annotated[
            int, typer.Option(help="member x seed chains trained at once, one process each (CPU)"), Range(minimum=1)
        ] = 1,
        out: Annotated[str, typer.Option(help="RUNS folder")] = "runs/grid",
    ) -> None:
        """Train every member x seed through the recipe's runs; rerun to continue after a crash."""
        with resumable(Path(out), ctx, resume=GRID_RESUME):
            manifest = plugin.grid(
                recipe, out, words(members) if members else None, words(runs) if runs else None,
                ints(seeds) if seeds else None, profile, {"data": data} if data else None,
                typer.echo, jobs=jobs,
            )  # fmt: skip
        typer.echo(f"{len(manifest['runs'])} runs finished; manifest: {Path(out) / 'manifest.json'}")
        if manifest.get("interrupted"):  # a run took the Ctrl-C or SIGTERM: it saved a step and stopped
            raise stopped(ctx)

    return grid


def _export_command(plugin: Any):
    def export(
        ctx: typer.Context,
        step_folder: Annotated[Path, typer.Argument(help="a step_XXXXXX folder (any parallelism)")],
        out: Annotated[Path, typer.Argument(help="plain checkpoint folder to write")],
        overwrite: Annotated[
            bool, typer.Option(help="replace OUT when it is a checkpoint (never anything else, never the input)")
        ] = False,
    ) -> None:
        """Turn a (possibly FSDP-sharded) step checkpoint into a plain checkpoint."""
        typer.echo(f"wrote {plugin.export(step_folder, out, overwrite)}")

    return export


def _with_bar(ctx: typer.Context, title: str, work: Any) -> Any:
    """``work(report)`` with a progress bar on a terminal (progress lines in a log)."""
    with progress_bar(title, ctx, info=True) as bar:
        return work(bar.report)


def _data_commands(plugin: Any, app: typer.Typer) -> None:
    @app.command("prepare")
    def prepare(
        ctx: typer.Context,
        sources: Annotated[list[Path], typer.Argument(help="text, JSONL ('text' field) or Parquet files")],
        out: Annotated[Path, typer.Option(help="data folder to create")],
        tokenizer: Annotated[str, typer.Option(help="byte or a tokenizer.json")] = "byte",
        dtype: Annotated[str, typer.Option(help="auto | uint16 | uint32")] = "auto",
        overwrite: Annotated[bool, typer.Option(help=OVERWRITE_HELP)] = False,
    ) -> None:
        """Tokenise local files into memory-mapped shards plus a manifest."""
        man = _with_bar(
            ctx, "prepare", lambda report: plugin.prepare(sources, tokenizer, out, dtype, report, overwrite)
        )
        typer.echo(f"{out}: {man.total_tokens:,} tokens in {len(man.shards)} shard(s) from {man.documents:,} documents")

    @app.command("synth")
    def synth(
        ctx: typer.Context,
        tokens: Annotated[int, typer.Option(help="tokens to generate"), Range(minimum=1)],
        out: Annotated[Path, typer.Option(help="data folder to create")],
        seed: int = 0,
        tokenizer: Annotated[str, typer.Option(help="byte or a tokenizer.json")] = "byte",
        tasks: Annotated[
            str | None,
            typer.Option(
                help="synthetic tasks with loss masks, e.g. copy=1,recall=1,needle=1,prose=1 (default: the corpus)"
            ),
        ] = None,
        distance: Annotated[str, typer.Option(help="tasks: MIN:MAX characters between a fact and its query")] = "0:256",
        segment: Annotated[str, typer.Option(help="tasks: MIN:MAX characters of a copied segment")] = "16:48",
        pairs: Annotated[str, typer.Option(help="tasks: MIN:MAX key-value pairs or facts per document")] = "1:4",
        queries: Annotated[int, typer.Option(help="tasks: keys asked about per recall document")] = 2,
        split: Annotated[str, typer.Option(help="tasks: train or heldout keys")] = "train",
        overwrite: Annotated[bool, typer.Option(help=OVERWRITE_HELP)] = False,
    ) -> None:
        """Generate the built-in offline corpus, or synthetic retrieval tasks whose answers are the only
        targets of the loss (copy, associative recall, needles in prose) mixed with prose."""
        from headprobe.text.tasks import TaskMix, TaskSettings

        settings = TaskSettings(int_range(distance), int_range(segment), int_range(pairs), queries, split)
        mix = TaskMix.parse(tasks, settings) if tasks else None
        man = _with_bar(ctx, "synth", lambda report: plugin.synth(tokens, out, tokenizer, seed, report, mix, overwrite))
        kinds = ", ".join(f"{k} {v}" for k, v in man.extra["documents_by_kind"].items())
        typer.echo(f"{out}: {man.total_tokens:,} tokens, {man.documents:,} documents ({kinds})")

    @app.command("verify")
    def verify(ctx: typer.Context, folder: Path) -> None:
        """Check every shard against the SHA-256 in the manifest."""
        tokens, shards = plugin.verify(folder)
        typer.echo(f"{folder}: {tokens:,} tokens, {shards} shard(s) verified")


def _missing(ctx: typer.Context) -> None:
    raise fail("the bundled trainer is not installed (it ships with headprobe: reinstall with `pip install -e .`)", ctx)


def add_trainer_commands(app: typer.Typer) -> None:
    """Mount ``train`` and ``data`` on ``app``: the trainer plugin's commands, or a note that it is missing. The
    errors the plugin declares as bad input (``plugin.errors``) are shown as one line, as headprobe's own are
    (``app.session``'s :attr:`~headprobe.cli.common.Session.user_errors`)."""
    plugin = trainer_plugin()
    train_help = (
        "Train the head-shape models: pretraining (pt), long-context continual pretraining (cpt), fine-tuning "
        "(sft); `grid` runs a whole scale. Launch with torchrun (-m headprobe train) for several processes."
    )
    if plugin is None:
        app.command("train", help=train_help)(_missing)
        app.command("data", help="Prepare token shards for training.")(_missing)
        return
    session = getattr(app, "session", None)
    if isinstance(session, Session):
        session.user_errors = tuple(dict.fromkeys((*session.user_errors, *plugin.errors)))
    train_app = typer.Typer(help=train_help, invoke_without_command=True, pretty_exceptions_enable=False)
    train_app.callback()(_stage_command(plugin))
    train_app.command("grid")(_grid_command(plugin))
    train_app.command("export")(_export_command(plugin))
    data_app = typer.Typer(help="Prepare token shards for training.", no_args_is_help=True)
    _data_commands(plugin, data_app)
    app.add_typer(train_app, name="train")
    app.add_typer(data_app, name="data")
