"""One config drives a training run: :class:`TrainConfig`, a plain dataclass whose fields are the command
line's flags (``headprobe train --batch-size 16 ...``: :mod:`headprobe.cli.train` derives the options, their
defaults and help from the fields below, so a default lives in one place).

Imports nothing heavy (no torch), so the command line builds quickly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from headprobe.core.choice import Choice
from headprobe.core.errors import HeadprobeError
from headprobe.model.config import Backend, LayerType


class TrainError(HeadprobeError, ValueError):
    """A training option is missing or inconsistent; the message names it (in backticks) and the fix."""


class Stage(Choice, what="stage"):
    PT = "pt"  # pretraining from scratch
    CPT = "cpt"  # long-context continual pretraining from a checkpoint
    SFT = "sft"  # fine-tuning on prompt/response pairs


class ScheduleKind(Choice, what="schedule"):
    COSINE = "cosine"
    WSD = "wsd"  # warmup, stable, decay


class Freeze(Choice, what="freeze"):
    """Which attention projections (q, k, v, o) stay fixed: the study's frozen-attention CPT."""

    ATTENTION = "attention"  # every layer's
    ATTENTION_FULL = "attention-full"  # the full-attention layers'
    ATTENTION_SWA = "attention-swa"  # the sliding-window layers'

    @property
    def layer_types(self) -> tuple[LayerType, ...]:
        if self is Freeze.ATTENTION:
            return (LayerType.FULL, LayerType.SLIDING)
        return (LayerType.FULL,) if self is Freeze.ATTENTION_FULL else (LayerType.SLIDING,)


class Parallel(Choice, what="parallelism"):
    AUTO = "auto"  # ddp when launched with more than one process
    NONE = "none"
    DDP = "ddp"
    FSDP = "fsdp"  # FSDP2


class Precision(Choice, what="precision"):
    AUTO = "auto"  # bf16 autocast on CUDA, float32 on CPU
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"


def _help(text: str) -> dict[str, str]:
    """A field's metadata: its command-line help."""
    return {"help": text}


@dataclass
class TrainConfig:
    """Every option of one training stage; each field's help is in its metadata."""

    stage: Stage = field(
        default=Stage.PT, metadata=_help("pt (from scratch), cpt (continue at a longer seq_len) or sft")
    )
    preset: str | None = field(default=None, metadata=_help("model preset for pt, e.g. toy-d32"))
    config: str | None = field(default=None, metadata=_help("model config.json for pt"))
    init: str | None = field(default=None, metadata=_help("our checkpoint to start cpt/sft from (not a .gguf file)"))
    out: str = field(default="runs/default", metadata=_help("run folder"))
    data: str | None = field(
        default=None, metadata=_help("data folder (pt/cpt) or JSONL (sft); default: the built-in corpus/set")
    )
    curriculum: str | None = field(
        default=None,
        metadata=_help("curriculum JSON: synthetic tasks on the fly, growing harder (trainer/curriculum.py)"),
    )
    probes: str | None = field(
        default=None, metadata=_help("held-out probes logged to metrics.jsonl, e.g. needle@200,needle@1000")
    )
    probe_every: int = field(default=0, metadata=_help("steps between probes (0 = the curriculum's, or never)"))
    tokenizer: str | None = field(
        default=None, metadata=_help("byte or a tokenizer.json (default: from init or the data)")
    )
    steps: int | None = field(default=None, metadata=_help("optimizer steps"))
    tokens: int | None = field(
        default=None, metadata=_help("tokens to train on (instead of steps; rounded up to whole steps)")
    )
    batch_size: int = field(default=8, metadata=_help("global batch in sequences per optimizer step"))
    micro_batch_size: int | None = field(
        default=None, metadata=_help("sequences per forward pass per process (default: no accumulation)")
    )
    seq_len: int | None = field(default=None, metadata=_help("tokens per sequence (default: the model's max_seq_len)"))
    lr: float = field(default=3e-3, metadata=_help("peak learning rate"))
    min_lr_ratio: float = field(default=0.1, metadata=_help("final learning rate / peak"))
    warmup_steps: int | None = field(default=None, metadata=_help("linear warmup steps (default: 5% of the steps)"))
    schedule: ScheduleKind = field(default=ScheduleKind.COSINE, metadata=_help("cosine or wsd"))
    decay_fraction: float = field(default=0.2, metadata=_help("wsd: fraction of the steps spent decaying"))
    weight_decay: float = field(default=0.1, metadata=_help("AdamW weight decay"))
    beta1: float = field(default=0.9, metadata=_help("AdamW beta1"))
    beta2: float = field(default=0.95, metadata=_help("AdamW beta2"))
    grad_clip: float = field(default=1.0, metadata=_help("global grad-norm clip (0 = off)"))
    freeze: Freeze | None = field(
        default=None, metadata=_help("freeze attention projections: attention, attention-full or attention-swa")
    )
    rope_theta_full: float | None = field(
        default=None, metadata=_help("cpt: a new RoPE base for the full-attention layers")
    )
    seed: int = field(default=0, metadata=_help("initialisation and data order seed"))
    save_every: int = field(
        default=0, metadata=_help("steps between step checkpoints (0 = only when interrupted and at the end)")
    )
    keep: int = field(default=2, metadata=_help("step checkpoints to keep"))
    resume: bool = field(default=False, metadata=_help("continue from the newest step checkpoint in out"))
    parallel: Parallel = field(default=Parallel.AUTO, metadata=_help("auto, none, ddp or fsdp"))
    compile: bool = field(default=False, metadata=_help("torch.compile each block"))
    activation_checkpointing: bool = field(default=False, metadata=_help("recompute blocks in backward (less memory)"))
    attention_backend: Backend = field(default=Backend.AUTO, metadata=_help("auto, sdpa, flex, flash or reference"))
    device: str = field(default="auto", metadata=_help("auto, cpu or cuda"))
    threads: int | None = field(
        default=None, metadata=_help("CPU threads per process for torch (default: torch's choice)")
    )
    dtype: Precision = field(
        default=Precision.AUTO, metadata=_help("auto (bf16 autocast on CUDA), float32 or bfloat16")
    )
    peak_flops: float | None = field(
        default=None, metadata=_help("FLOP/s per device for MFU when the GPU is not in the table")
    )
    log_every: int = field(default=1, metadata=_help("steps between metrics.jsonl lines"))
    progress: bool = field(default=True, metadata=_help("show a progress bar on a terminal"))
    tensorboard: bool = field(default=False, metadata=_help("also log to TensorBoard (when installed)"))
    wandb: bool = field(default=False, metadata=_help("also log to Weights & Biases (when installed)"))

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # text values (from JSON recipes) become their enums
            kind = _ENUM_FIELDS.get(f.name)
            value = getattr(self, f.name)
            if kind is not None and value is not None and not isinstance(value, kind):
                try:
                    setattr(self, f.name, kind(value))
                except ValueError as err:
                    raise TrainError(f"`{f.name}`: {err}") from None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (enums as their values)."""
        return {k: v.value if isinstance(v, Enum) else v for k, v in dataclasses.asdict(self).items()}


_ENUM_FIELDS: dict[str, type[Enum]] = {
    "stage": Stage,
    "schedule": ScheduleKind,
    "freeze": Freeze,
    "parallel": Parallel,
    "attention_backend": Backend,
    "dtype": Precision,
}

RESULT_FILE = "result.json"

# how long work tells its count: (units done, units in all, one-line status); a progress bar's `report`
ReportCount = Callable[[int, int, str], None]


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
