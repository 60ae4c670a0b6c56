"""The training loop behind ``headprobe train`` / ``python -m trainer``: stages ``pt``, ``cpt``, ``sft``.

One :class:`TrainConfig` drives a run. The loop is the same at every scale: a global batch of
``batch_size`` sequences per optimizer step, split over the processes and into micro-batches of
``micro_batch_size``; the loss is the sum of token losses over the global batch divided by its number
of target tokens, so 1 process with accumulation and N processes give the same update.

Files in ``OUT``: ``metrics.jsonl`` (one JSON line per step), ``train_config.json``,
``step_XXXXXX/`` (resumable, see :mod:`trainer.train_state`) and ``final/`` (a plain checkpoint that
``headprobe`` analysis loads directly).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from headprobe.model.atomic import atomic_write_text
from headprobe.model.budget import budget
from headprobe.model.checkpoint import load_checkpoint, save_checkpoint
from headprobe.model.config import ModelConfig
from headprobe.model.presets import preset
from headprobe.model.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer
from headprobe.model.transformer import Transformer
from trainer import train_state
from trainer.data import (
    Batch,
    DataError,
    PackedSequences,
    Sampler,
    TokenData,
    collate,
    synth,
)
from trainer.distributed import Parallel, World, all_reduce_sum, init_world, shutdown, wrap
from trainer.mfu import mfu, peak_flops
from trainer.optim import Schedule, build_optimizer
from trainer.sft import SftData, builtin_examples, load_jsonl

Stage = Literal["pt", "cpt", "sft"]
FREEZE_CHOICES = ("attention", "attention-full", "attention-swa")


class TrainError(ValueError):
    """A training option is missing or inconsistent; the message names it and the fix."""


@dataclass
class TrainConfig:
    """Every option of a training run (the CLI flags map one to one).

    Attributes:
        stage: ``pt`` (from scratch), ``cpt`` (continue from ``init`` at a longer ``seq_len``),
            ``sft`` (prompt/response pairs, loss on responses only).
        preset / config: the model for ``pt`` (a preset name or a ``config.json``).
        init: checkpoint to start ``cpt``/``sft`` from.
        out: run folder.
        data: a prepared data folder (pt/cpt) or a JSONL file (sft); ``None`` = built-in corpus or
            built-in instruction set.
        tokenizer: ``byte`` or a ``tokenizer.json``; default: from ``init`` or the data manifest.
        steps / tokens: stage length (one of them; tokens are rounded up to whole steps).
        batch_size: global batch in sequences per optimizer step.
        micro_batch_size: sequences per forward pass per process (default: no accumulation).
        seq_len: tokens per sequence (default: the model's ``max_seq_len``).
        lr, min_lr_ratio, warmup_steps, schedule, decay_fraction: see :class:`trainer.optim.Schedule`.
        weight_decay, beta1, beta2, grad_clip: AdamW and global-norm clipping (0 = off).
        freeze: ``attention`` (q, k, v, o of every layer), ``attention-full`` or ``attention-swa``.
        rope_theta_full: new RoPE base for the full-attention layers (cpt).
        save_every: steps between step checkpoints (0 = only when interrupted and at the end).
        keep: step checkpoints to keep.
        resume: continue from the newest complete step checkpoint in ``out``.
        parallel: ``none``, ``ddp`` or ``fsdp`` (FSDP2); ``auto`` = ddp when launched with >1 process.
        compile, activation_checkpointing: speed / memory switches.
        device: ``auto``, ``cpu``, ``cuda``; dtype: ``auto`` (bf16 autocast on CUDA, fp32 on CPU),
            ``float32`` or ``bfloat16``.
        peak_flops: FLOP/s per device for MFU when the GPU is not in the table.
        tensorboard, wandb: also log there when the packages are installed.
    """

    stage: Stage = "pt"
    preset: str | None = None
    config: str | None = None
    init: str | None = None
    out: str = "runs/default"
    data: str | None = None
    tokenizer: str | None = None
    steps: int | None = None
    tokens: int | None = None
    batch_size: int = 8
    micro_batch_size: int | None = None
    seq_len: int | None = None
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int | None = None
    schedule: Literal["cosine", "wsd"] = "cosine"
    decay_fraction: float = 0.2
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    freeze: str | None = None
    rope_theta_full: float | None = None
    seed: int = 0
    save_every: int = 0
    keep: int = 2
    resume: bool = False
    parallel: Literal["auto", "none", "ddp", "fsdp"] = "auto"
    compile: bool = False
    activation_checkpointing: bool = False
    attention_backend: str = "auto"
    device: str = "auto"
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    peak_flops: float | None = None
    log_every: int = 1
    progress: bool = True
    tensorboard: bool = False
    wandb: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


RESULT_FILE = "result.json"


@dataclass
class TrainResult:
    """What a stage did; written to ``OUT/result.json`` when it completes."""

    out: Path
    steps: int
    tokens: int
    final_loss: float | None
    interrupted: bool

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "out": str(self.out)}


# ---------------------------------------------------------------------------------------------
# Setup
# ---------------------------------------------------------------------------------------------
def _model_and_tokenizer(cfg: TrainConfig) -> tuple[Transformer, ByteTokenizer | HFTokenizer | None]:
    """Build (pt) or load (cpt/sft) the model; the tokenizer if known yet."""
    if cfg.stage == "pt":
        if cfg.init:
            raise TrainError("--init is for cpt/sft; pt trains from scratch (use --preset or --config)")
        if bool(cfg.preset) == bool(cfg.config):
            raise TrainError("pt needs exactly one of --preset NAME or --config FILE")
        model_cfg = preset(cfg.preset) if cfg.preset else ModelConfig.load(cfg.config)  # type: ignore[arg-type]
        torch.manual_seed(cfg.seed)
        return Transformer(model_cfg), None
    if not cfg.init:
        raise TrainError(f"--stage {cfg.stage} continues a model: give --init CHECKPOINT")
    if cfg.preset or cfg.config:
        raise TrainError(f"--stage {cfg.stage} takes the model from --init; drop --preset/--config")
    model, tokenizer = load_checkpoint(cfg.init, dtype=torch.float32)
    model_cfg = model.cfg
    if cfg.rope_theta_full is not None:
        if cfg.stage != "cpt":
            raise TrainError("--rope-theta-full applies to cpt")
        model_cfg = model_cfg.replace(full=dataclasses.replace(model_cfg.full, rope_theta=cfg.rope_theta_full))
    if cfg.seq_len and cfg.seq_len > model_cfg.max_seq_len:
        model_cfg = model_cfg.replace(max_seq_len=cfg.seq_len)
    if model_cfg != model.cfg:
        rebuilt = Transformer(model_cfg)
        rebuilt.load_state_dict(model.state_dict())
        model = rebuilt
    model.train()
    return model, tokenizer


def apply_freeze(model: Transformer, freeze: str | None) -> list[str]:
    """Freeze q, k, v, o projections of the chosen layer types; returns the frozen parameter names."""
    if freeze is None:
        return []
    if freeze not in FREEZE_CHOICES:
        raise TrainError(f"unknown --freeze {freeze!r}; choose one of {', '.join(FREEZE_CHOICES)}")
    types = {"attention": ("full", "sliding"), "attention-full": ("full",), "attention-swa": ("sliding",)}[freeze]
    frozen = []
    for layer, block in enumerate(model.blocks):
        if block.attn.layer_type in types:
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                param = getattr(block.attn, name).weight
                param.requires_grad_(False)
                frozen.append(f"blocks.{layer}.attn.{name}.weight")
    return frozen


def _cache_root() -> Path:
    return Path(os.environ.get("HEADPROBE_CACHE", Path.home() / ".cache" / "headprobe"))


def builtin_corpus(tokens_needed: int, seed: int, world: World) -> Path:
    """The built-in corpus, generated once per size bucket into the cache folder."""
    bucket = max(1 << 21, 1 << math.ceil(math.log2(max(tokens_needed, 1))))  # >= 2M tokens, power of two
    folder = _cache_root() / "corpus" / f"byte-seed{seed}-{bucket}"
    if world.is_main and not (folder / "manifest.json").is_file():
        synth(bucket, folder, seed=seed)
    if world.distributed:
        torch.distributed.barrier()
    return folder


class _Source:
    """Items of the stage (packed sequences, or SFT examples) with their pad id."""

    def __init__(self, items: PackedSequences | SftData, pad_id: int, describe: dict[str, Any]) -> None:
        self.items, self.pad_id, self.describe = items, pad_id, describe

    def batch(self, indices: np.ndarray) -> Batch:
        if isinstance(self.items, SftData):
            return collate([self.items[int(i)] for i in indices], self.pad_id)
        return collate([(self.items[int(i)], None) for i in indices], self.pad_id)


def _check_same_tokenizer(folder: Path, man, tokenizer: ByteTokenizer | HFTokenizer) -> None:
    """The data must have been tokenised by the tokenizer the model is trained with."""
    data_is_byte = man.tokenizer == "byte"
    if data_is_byte != isinstance(tokenizer, ByteTokenizer):
        raise DataError(
            f"{folder} was tokenised with {man.tokenizer!r} but the model uses {tokenizer.name!r}; "
            "prepare the data with the model's tokenizer"
        )
    want = man.extra.get("tokenizer_sha256")
    if want and isinstance(tokenizer, HFTokenizer):
        import hashlib

        have = hashlib.sha256(Path(tokenizer.path).read_bytes()).hexdigest()
        if have != want:
            raise DataError(
                f"{folder} was tokenised with a different tokenizer.json than {tokenizer.path} (SHA-256 "
                "differs); prepare the data with the model's tokenizer"
            )


def _data_source(
    cfg: TrainConfig,
    seq_len: int,
    tokens_needed: int,
    tokenizer: ByteTokenizer | HFTokenizer | None,
    model_cfg: ModelConfig,
    world: World,
) -> tuple[_Source, ByteTokenizer | HFTokenizer]:
    if cfg.stage == "sft":
        tok = tokenizer or (load_tokenizer(cfg.tokenizer) if cfg.tokenizer else ByteTokenizer())
        examples = load_jsonl(cfg.data) if cfg.data else builtin_examples(4096, seed=cfg.seed)
        sft = SftData(examples, tok, seq_len)
        return _Source(sft, sft.pad_id, {"kind": "sft", "data": cfg.data or "builtin", "items": len(sft)}), tok
    folder = Path(cfg.data) if cfg.data else builtin_corpus(tokens_needed, cfg.seed, world)
    data = TokenData(folder)
    man = data.manifest
    if tokenizer is None:
        tokenizer = load_tokenizer(cfg.tokenizer or man.tokenizer)
    _check_same_tokenizer(folder, man, tokenizer)
    if man.vocab_size > model_cfg.vocab_size:
        raise DataError(
            f"{folder} was tokenised with {man.vocab_size:,} ids but the model has "
            f"vocab_size={model_cfg.vocab_size:,}; prepare the data with the model's tokenizer"
        )
    seqs = PackedSequences(data, seq_len)
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else man.eod_id
    desc = {"kind": "packed", "data": str(folder), "total_tokens": man.total_tokens, "items": len(seqs)}
    return _Source(seqs, pad, desc), tokenizer


# ---------------------------------------------------------------------------------------------
# Logging
# ---------------------------------------------------------------------------------------------
class _Log:
    """``metrics.jsonl`` plus optional TensorBoard / W&B, main process only."""

    def __init__(self, out: Path, resume_step: int, cfg: TrainConfig, enabled: bool) -> None:
        self.enabled = enabled
        self.path = out / "metrics.jsonl"
        self.tb = self.wandb = None
        if not enabled:
            return
        if self.path.exists():  # drop lines past the checkpoint we resume from
            keep = [ln for ln in self.path.read_text().splitlines() if ln and json.loads(ln)["step"] <= resume_step]
            atomic_write_text(self.path, "".join(ln + "\n" for ln in keep))
        self.file = self.path.open("a")
        if cfg.tensorboard:
            with contextlib.suppress(ImportError):
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(out / "tensorboard"))
        if cfg.wandb:
            with contextlib.suppress(ImportError):
                import wandb

                self.wandb = wandb.init(project="headprobe", dir=str(out), config=cfg.to_dict())

    def write(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        for key, value in row.items():
            if self.tb is not None and isinstance(value, (int, float)) and key != "step":
                self.tb.add_scalar(key, value, row["step"])
        if self.wandb is not None:
            self.wandb.log(row, step=row["step"])

    def close(self) -> None:
        if self.enabled:
            self.file.close()
            if self.tb is not None:
                self.tb.close()
            if self.wandb is not None:
                self.wandb.finish()


@contextlib.contextmanager
def _interrupt_flag() -> Iterator[list[bool]]:
    """First Ctrl-C / SIGTERM sets the flag (the loop saves and stops); a second Ctrl-C aborts."""
    flag = [False]

    def handler(signum, frame):
        if flag[0] and signum == signal.SIGINT:
            raise KeyboardInterrupt
        flag[0] = True
        print(
            "\ninterrupt received: finishing this step, saving, then stopping (Ctrl-C again to abort)",
            file=sys.stderr,
            flush=True,
        )

    previous = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
    except ValueError:  # not in the main thread: no signal handling
        pass
    try:
        yield flag
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _progress(total: int, start: int, enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    progress = Progress(
        TextColumn("[bold]train"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
        disable=not enabled,
        transient=False,
    )
    task = progress.add_task("train", total=total, completed=start, info="")
    return progress, task


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------
def _gpu_memory(world: World) -> dict[str, float]:
    if world.device.type != "cuda":
        return {}
    return {"peak_gpu_mem_gib": torch.cuda.max_memory_allocated(world.device) / 2**30}


def _resolve_steps(cfg: TrainConfig, seq_len: int) -> int:
    if (cfg.steps is None) == (cfg.tokens is None):
        raise TrainError("give exactly one of --steps or --tokens")
    if cfg.steps is not None:
        if cfg.steps < 1:
            raise TrainError("--steps must be >= 1")
        return cfg.steps
    per_step = cfg.batch_size * seq_len
    return max(1, math.ceil(cfg.tokens / per_step))  # type: ignore[operator]


def train(cfg: TrainConfig) -> TrainResult:
    """Run one stage; see the module docstring. Safe to interrupt (Ctrl-C / SIGTERM save and stop)."""
    world = init_world(cfg.device)
    try:
        return _train(cfg, world)
    finally:
        shutdown()


def _train(cfg: TrainConfig, world: World) -> TrainResult:
    out = Path(cfg.out)
    if cfg.batch_size < 1:
        raise TrainError("--batch-size must be >= 1")
    if cfg.batch_size % world.size:
        raise TrainError(f"--batch-size {cfg.batch_size} is not divisible by {world.size} processes")
    per_rank = cfg.batch_size // world.size
    micro = cfg.micro_batch_size or per_rank
    if per_rank % micro:
        raise TrainError(f"--micro-batch-size {micro} does not divide the {per_rank} sequences per process")
    parallel: Parallel = ("ddp" if world.distributed else "none") if cfg.parallel == "auto" else cfg.parallel

    existing = train_state.list_steps(out)
    if existing and not cfg.resume:
        raise TrainError(
            f"{out} already holds step checkpoints ({existing[-1][1].name}); pass --resume to "
            "continue that run or choose another --out"
        )
    model, tokenizer = _model_and_tokenizer(cfg)
    model_cfg = model.cfg
    seq_len = cfg.seq_len or model_cfg.max_seq_len
    total_steps = _resolve_steps(cfg, seq_len)
    source, tokenizer = _data_source(
        cfg, seq_len, total_steps * cfg.batch_size * (seq_len + 1), tokenizer, model_cfg, world
    )
    if tokenizer.vocab_size > model_cfg.vocab_size:
        raise TrainError(
            f"tokenizer {tokenizer.name} has {tokenizer.vocab_size} ids, more than the model's "
            f"vocab_size={model_cfg.vocab_size}"
        )

    frozen = apply_freeze(model, cfg.freeze)
    model.set_attention_backend(cfg.attention_backend)
    model.activation_checkpointing = cfg.activation_checkpointing
    model.to(world.device)
    use_bf16 = cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and world.device.type == "cuda")
    if cfg.compile:
        for block in model.blocks:
            block.compile()
    wrapped = wrap(model, parallel, world, mixed_precision=use_bf16)
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2))
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else round(0.05 * total_steps)
    schedule = Schedule(cfg.schedule, cfg.lr, total_steps, warmup, cfg.min_lr_ratio, cfg.decay_fraction)
    sampler = Sampler(len(source.items), cfg.batch_size, cfg.seed)
    data_identity = {**source.describe, "seq_len": seq_len, "batch_size": cfg.batch_size, "seed": cfg.seed}

    start_step, tokens_seen = 0, 0
    if cfg.resume and existing:
        state = train_state.load_step(existing[-1][1], wrapped, optimizer, world)
        saved = state["data"]
        if saved != data_identity:
            raise TrainError(
                f"cannot resume from {existing[-1][1]}: data settings differ (saved {saved}, now "
                f"{data_identity}); the run would not read the same batches"
            )
        start_step, tokens_seen = state["step"], state["tokens"]
    if world.is_main:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(
            out / "train_config.json",
            json.dumps(
                {
                    **cfg.to_dict(),
                    "model_config": model_cfg.to_dict(),
                    "world_size": world.size,
                    "frozen": frozen,
                    "data_identity": data_identity,
                },
                indent=2,
            ),
        )

    flops_per_token = budget(model_cfg, seq_len).flops_per_token
    peak = peak_flops(world.device, cfg.peak_flops)
    log = _Log(out, start_step, cfg, world.is_main)
    autocast = (
        torch.autocast(world.device.type, dtype=torch.bfloat16)
        if use_bf16 and parallel != "fsdp"
        else contextlib.nullcontext()
    )
    show = cfg.progress and world.is_main and sys.stderr.isatty()
    progress, task = _progress(total_steps, start_step, show)
    last_loss: float | None = None
    interrupted = False

    def save(step: int) -> None:
        state = {
            "step": step,
            "tokens": tokens_seen,
            "data": data_identity,
            "stage": cfg.stage,
            "model_config": model_cfg.to_dict(),
            "tokenizer": tokenizer_spec(tokenizer),
            "train_config": cfg.to_dict(),
        }
        train_state.save_step(out, step, wrapped, optimizer, state, world, cfg.keep)

    wrapped.train()
    with _interrupt_flag() as stop, progress:
        step = start_step
        while step < total_steps:
            t0 = time.perf_counter()
            lr = schedule(step)
            for group in optimizer.param_groups:
                group["lr"] = lr
            indices = sampler.shard(step, world.rank, world.size)
            micro_batches = [source.batch(indices[i : i + micro]) for i in range(0, len(indices), micro)]
            local_targets = sum(b.target_tokens for b in micro_batches)
            global_targets = all_reduce_sum(float(local_targets), world)
            positions = all_reduce_sum(float(sum(b.inputs.size for b in micro_batches)), world)
            loss_sum = 0.0
            for i, b in enumerate(micro_batches):
                last = i == len(micro_batches) - 1
                sync = contextlib.nullcontext() if last or parallel != "ddp" else wrapped.no_sync()
                with sync, autocast:
                    x = torch.from_numpy(b.inputs).to(world.device)
                    y = torch.from_numpy(b.targets).to(world.device)
                    m = torch.from_numpy(b.loss_mask).to(world.device)
                    part = wrapped(x, targets=y, loss_mask=m)
                    # DDP/FSDP average gradients over processes: scale so the result is sum / global
                    (part * (world.size / max(global_targets, 1.0))).backward()
                loss_sum += float(part.detach())
            max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor
                grad_norm = grad_norm.full_tensor()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            step_tokens = cfg.batch_size * seq_len if cfg.stage != "sft" else int(global_targets)
            tokens_seen += step_tokens
            last_loss = all_reduce_sum(loss_sum, world) / max(global_targets, 1.0)
            dt = time.perf_counter() - t0
            tps = positions / dt  # token positions processed (padding included for sft)
            if step % cfg.log_every == 0 or step == total_steps:
                log.write(
                    {
                        "step": step,
                        "tokens": tokens_seen,
                        "loss": last_loss,
                        "lr": lr,
                        "grad_norm": float(grad_norm),
                        "tokens_per_s": tps,
                        "mfu": mfu(flops_per_token, tps, peak, world.size),
                        "step_time_s": dt,
                        "stage": cfg.stage,
                        **_gpu_memory(world),
                    }
                )
            progress.update(task, completed=step, info=f"loss {last_loss:.4f}  {tps:,.0f} tok/s")
            stop_now = all_reduce_sum(float(stop[0]), world) > 0
            if stop_now and step < total_steps:
                save(step)
                interrupted = True
                break
            if cfg.save_every and step % cfg.save_every == 0 and step < total_steps:
                save(step)
    log.close()
    result = TrainResult(out, step, tokens_seen, last_loss, interrupted)
    if not interrupted:
        save(step)  # a resumable end state (the next stage starts from final/)
        export_final(wrapped, model_cfg, tokenizer, out / "final", world)
        if world.is_main:
            atomic_write_text(out / RESULT_FILE, json.dumps(result.to_dict(), indent=2))
    return result


def tokenizer_spec(tokenizer: ByteTokenizer | HFTokenizer) -> str:
    return "byte" if isinstance(tokenizer, ByteTokenizer) else str(tokenizer.path)


def export_final(model: torch.nn.Module, cfg: ModelConfig, tokenizer, path: Path, world: World) -> None:
    """Gather the full weights (FSDP) and write ``final/`` as a plain checkpoint on the main process."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if world.is_main:
        plain = Transformer(cfg)
        plain.load_state_dict(weights)
        save_checkpoint(plain, path, None if isinstance(tokenizer, ByteTokenizer) else tokenizer)
    if world.distributed:
        torch.distributed.barrier()
