"""Command lines of the trainer: ``headprobe train ...`` (same as ``python -m trainer ...``) and
``headprobe data ...``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

train_app = typer.Typer(
    help="Train the head-shape models: pretraining (pt), long-context continual pretraining (cpt), "
    "fine-tuning (sft); `grid` runs a whole scale. Launch with torchrun for several processes.",
    invoke_without_command=True,
    no_args_is_help=False,
    pretty_exceptions_enable=False,
)
data_app = typer.Typer(help="Prepare token shards for training.", no_args_is_help=True, pretty_exceptions_enable=False)


def _fail(err: Exception) -> typer.Exit:
    typer.secho(f"error: {err}", fg=typer.colors.RED, err=True)
    return typer.Exit(code=2)


@train_app.callback()
def train_command(
    ctx: typer.Context,
    stage: Annotated[str, typer.Option(help="pt | cpt | sft")] = "pt",
    preset: Annotated[str | None, typer.Option(help="model preset for pt, e.g. toy-d32")] = None,
    config: Annotated[str | None, typer.Option(help="model config.json for pt")] = None,
    init: Annotated[str | None, typer.Option(help="checkpoint to start cpt/sft from")] = None,
    out: Annotated[str, typer.Option(help="run folder")] = "runs/default",
    data: Annotated[str | None, typer.Option(help="data folder (pt/cpt) or JSONL (sft); default built-in")] = None,
    tokenizer: Annotated[str | None, typer.Option(help="byte or tokenizer.json (default: from init/data)")] = None,
    steps: Annotated[int | None, typer.Option(help="optimizer steps")] = None,
    tokens: Annotated[int | None, typer.Option(help="tokens (alternative to --steps)")] = None,
    batch_size: Annotated[int, typer.Option(help="global batch in sequences per optimizer step")] = 8,
    micro_batch_size: Annotated[int | None, typer.Option(help="sequences per forward pass per process")] = None,
    seq_len: Annotated[int | None, typer.Option(help="tokens per sequence (default: model max_seq_len)")] = None,
    lr: float = 3e-3,
    min_lr_ratio: float = 0.1,
    warmup_steps: Annotated[int | None, typer.Option(help="default: 5% of the steps")] = None,
    schedule: Annotated[str, typer.Option(help="cosine | wsd")] = "cosine",
    decay_fraction: Annotated[float, typer.Option(help="wsd: fraction of steps spent decaying")] = 0.2,
    weight_decay: float = 0.1,
    grad_clip: Annotated[float, typer.Option(help="global grad-norm clip, 0 = off")] = 1.0,
    freeze: Annotated[str | None, typer.Option(help="attention | attention-full | attention-swa")] = None,
    rope_theta_full: Annotated[float | None, typer.Option(help="cpt: new RoPE base of full layers")] = None,
    seed: int = 0,
    save_every: Annotated[int, typer.Option(help="steps between step checkpoints (0 = end/interrupt)")] = 0,
    keep: Annotated[int, typer.Option(help="step checkpoints to keep")] = 2,
    resume: Annotated[bool, typer.Option(help="continue from the newest step checkpoint in --out")] = False,
    parallel: Annotated[str, typer.Option(help="auto | none | ddp | fsdp")] = "auto",
    compile: Annotated[bool, typer.Option(help="torch.compile each block")] = False,
    activation_checkpointing: Annotated[bool, typer.Option(help="recompute blocks in backward")] = False,
    attention_backend: Annotated[str, typer.Option(help="auto | sdpa | flex | flash | reference")] = "auto",
    device: Annotated[str, typer.Option(help="auto | cpu | cuda")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto (bf16 on CUDA) | float32 | bfloat16")] = "auto",
    peak_flops: Annotated[float | None, typer.Option(help="FLOP/s per device for MFU")] = None,
    log_every: int = 1,
    tensorboard: bool = False,
    wandb: bool = False,
) -> None:
    """Run one training stage (without a subcommand)."""
    if ctx.invoked_subcommand is not None:
        return
    from trainer.data import DataError
    from trainer.train import TrainConfig, TrainError, train

    cfg = TrainConfig(
        stage=stage,
        preset=preset,
        config=config,
        init=init,
        out=out,
        data=data,
        tokenizer=tokenizer,  # type: ignore[arg-type]
        steps=steps,
        tokens=tokens,
        batch_size=batch_size,
        micro_batch_size=micro_batch_size,
        seq_len=seq_len,
        lr=lr,
        min_lr_ratio=min_lr_ratio,
        warmup_steps=warmup_steps,
        schedule=schedule,  # type: ignore[arg-type]
        decay_fraction=decay_fraction,
        weight_decay=weight_decay,
        grad_clip=grad_clip,
        freeze=freeze,
        rope_theta_full=rope_theta_full,
        seed=seed,
        save_every=save_every,
        keep=keep,
        resume=resume,
        parallel=parallel,
        compile=compile,
        activation_checkpointing=activation_checkpointing,  # type: ignore[arg-type]
        attention_backend=attention_backend,
        device=device,
        dtype=dtype,
        peak_flops=peak_flops,  # type: ignore[arg-type]
        log_every=log_every,
        tensorboard=tensorboard,
        wandb=wandb,
    )
    if stage not in ("pt", "cpt", "sft"):
        raise _fail(ValueError(f"unknown --stage {stage!r}; choose pt, cpt or sft"))
    try:
        result = train(cfg)
    except (TrainError, DataError, FileNotFoundError) as err:
        raise _fail(err) from None
    state = "interrupted (resume with --resume)" if result.interrupted else "done"
    loss = "n/a" if result.final_loss is None else f"{result.final_loss:.4f}"
    typer.echo(f"{state}: {result.steps} steps, {result.tokens:,} tokens, last loss {loss}, in {result.out}")


@train_app.command("grid")
def grid_command(
    scale: Annotated[str, typer.Option(help="toy | 0.6b | 3b")] = "toy",
    members: Annotated[str | None, typer.Option(help="comma list, e.g. d128,d512 (default: all)")] = None,
    stages: Annotated[str, typer.Option(help="comma list of pt,cpt,sft")] = "pt,cpt,sft",
    cpt_freeze: Annotated[str | None, typer.Option(help="freeze attention projections in cpt")] = None,
    data: Annotated[str | None, typer.Option(help="data folder for pt/cpt (default built-in)")] = None,
    out: Annotated[str, typer.Option(help="RUNS folder")] = "runs/grid",
) -> None:
    """Run every member of a scale through the stages; rerun to continue after a crash."""
    from trainer.data import DataError
    from trainer.grid import run_grid
    from trainer.train import TrainError

    overrides = {"data": data} if data else None
    try:
        manifest = run_grid(
            scale, out, members.split(",") if members else None, stages.split(","), cpt_freeze, overrides
        )
    except (TrainError, DataError, FileNotFoundError) as err:
        raise _fail(err) from None
    typer.echo(json.dumps(manifest, indent=2))


@train_app.command("export")
def export_command(
    step_folder: Annotated[Path, typer.Argument(help="a step_XXXXXX folder (any parallelism)")],
    out: Annotated[Path, typer.Argument(help="plain checkpoint folder to write")],
) -> None:
    """Turn a (possibly FSDP-sharded) step checkpoint into a plain checkpoint."""
    from trainer.train_state import export_step

    if not (step_folder / "state.json").is_file():
        raise _fail(FileNotFoundError(f"{step_folder} is not a step checkpoint (no state.json)"))
    typer.echo(f"wrote {export_step(step_folder, out)}")


@data_app.command("prepare")
def prepare_command(
    sources: Annotated[list[Path], typer.Argument(help="text, JSONL ('text' field) or Parquet files")],
    out: Annotated[Path, typer.Option(help="data folder to create")],
    tokenizer: Annotated[str, typer.Option(help="byte or a tokenizer.json")] = "byte",
    dtype: Annotated[str, typer.Option(help="auto | uint16 | uint32")] = "auto",
) -> None:
    """Tokenise local files into memory-mapped shards plus a manifest."""
    from headprobe.model.tokenizer import load_tokenizer
    from trainer.data import DataError, prepare

    try:
        man = prepare(sources, load_tokenizer(tokenizer), out, dtype=dtype, progress=True)
    except (DataError, FileNotFoundError, ValueError) as err:
        raise _fail(err) from None
    typer.echo(f"{out}: {man.total_tokens:,} tokens in {len(man.shards)} shard(s) from {man.documents:,} documents")


@data_app.command("synth")
def synth_command(
    tokens: Annotated[int, typer.Option(help="tokens to generate")],
    out: Annotated[Path, typer.Option(help="data folder to create")],
    seed: int = 0,
    tokenizer: Annotated[str, typer.Option(help="byte or a tokenizer.json")] = "byte",
) -> None:
    """Generate the built-in offline corpus (prose plus retrieval documents)."""
    from headprobe.model.tokenizer import load_tokenizer
    from trainer.data import DataError, synth

    try:
        man = synth(tokens, out, load_tokenizer(tokenizer), seed=seed, progress=True)
    except (DataError, FileNotFoundError, ValueError) as err:
        raise _fail(err) from None
    kinds = ", ".join(f"{k} {v}" for k, v in man.extra["documents_by_kind"].items())
    typer.echo(f"{out}: {man.total_tokens:,} tokens, {man.documents:,} documents ({kinds})")


@data_app.command("verify")
def verify_command(folder: Path) -> None:
    """Check every shard against the SHA-256 in the manifest."""
    from trainer.data import DataError, TokenData

    try:
        data = TokenData(folder, verify=True)
    except DataError as err:
        raise _fail(err) from None
    typer.echo(f"{folder}: {len(data):,} tokens, {len(data.manifest.shards)} shard(s) verified")
