"""One config drives a training run: :class:`TrainConfig`, a plain dataclass whose fields are the command
line's flags (``headprobe train --batch-size 16 ...``: :mod:`headprobe.cli.train` derives the options, their
defaults and help from the fields below, so a default lives in one place).

Imports nothing heavy (no torch), so the command line builds quickly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from headprobe.core.choice import Choice
from headprobe.core.errors import HeadprobeError
from headprobe.core.settings import ALL, check_ranges, parse_count, setting
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


@dataclass
class TrainConfig:
    """Every option of one training stage; each field declares its command-line help and, for a number, its
    range (:func:`headprobe.core.settings.setting`), checked when the config is made."""

    stage: Stage = setting(Stage.PT, help="pt (from scratch), cpt (continue at a longer seq_len) or sft")
    preset: str | None = setting(None, help="model preset for pt, e.g. toy-d32")
    config: str | None = setting(None, help="model config.json for pt")
    qk_norm: bool = setting(
        False, help="pt: RMS-normalise each query and key head in every layer (QK-norm) on the preset or config"
    )
    qk_norm_scale: float | None = setting(
        None,
        help="pt, with qk_norm: softmax scale qk_norm_scale / qk_head_dim, one bound on the logits for every "
        "head width (default: 1/sqrt(qk_head_dim))",
        above=0.0,
    )
    init: str | None = setting(None, help="our checkpoint to start cpt/sft from (not a .gguf file)")
    out: str = setting("runs/default", help="run folder")
    data: str | None = setting(None, help="data folder (pt/cpt) or JSONL (sft); default: the built-in corpus/set")
    curriculum: str | None = setting(
        None, help="curriculum JSON: synthetic tasks on the fly, growing harder (trainer/curriculum.py)"
    )
    probes: str | None = setting(None, help="held-out probes logged to metrics.jsonl, e.g. needle@200,needle@1000")
    probe_every: int = setting(0, help="steps between probes (0 = the curriculum's, or never)", minimum=0)
    eval_every: int = setting(
        0,
        help="steps between held-out evaluation losses in metrics.jsonl, and the final weights' in result.json "
        "(0 = neither; the toy recipe: 100)",
        minimum=0,
    )
    tokenizer: str | None = setting(None, help="byte or a tokenizer.json (default: from init or the data)")
    steps: int | None = setting(None, help="optimizer steps", minimum=1)
    tokens: int | None = setting(
        None, help="tokens to train on (instead of steps; rounded up to whole steps)", minimum=1
    )
    batch_size: int = setting(8, help="global batch in sequences per optimizer step", minimum=1)
    micro_batch_size: int | None = setting(
        None, help="sequences per forward pass per process (default: no accumulation)", minimum=1
    )
    seq_len: int | None = setting(None, help="tokens per sequence (default: the model's max_seq_len)", minimum=1)
    lr: float = setting(3e-3, help="peak learning rate", above=0)
    min_lr_ratio: float = setting(0.1, help="final learning rate / peak", minimum=0, maximum=1)
    warmup_steps: int | None = setting(None, help="linear warmup steps (default: 5% of the steps)", minimum=0)
    schedule: ScheduleKind = setting(ScheduleKind.COSINE, help="cosine or wsd")
    decay_fraction: float = setting(0.2, help="wsd: fraction of the steps spent decaying", minimum=0, maximum=1)
    weight_decay: float = setting(0.1, help="AdamW weight decay", minimum=0)
    beta1: float = setting(0.9, help="AdamW beta1", minimum=0, below=1)
    beta2: float = setting(0.95, help="AdamW beta2", minimum=0, below=1)
    grad_clip: float = setting(1.0, help="global grad-norm clip (0 = off)", minimum=0)
    freeze: Freeze | None = setting(
        None, help="freeze attention projections: attention, attention-full or attention-swa"
    )
    rope_theta_full: float | None = setting(None, help="cpt: a new RoPE base for the full-attention layers", above=0)
    seed: int = setting(0, help="initialisation and data order seed", minimum=0)
    save_every: int = setting(
        0, help="steps between step checkpoints (0 = only when interrupted and at the end)", minimum=0
    )
    keep: int = setting(
        2,
        help="step checkpoints to keep: the newest N, or all (every one: a run whose steps headprobe analyze --steps "
        "measures)",
        form="count",
        minimum=0,
    )
    resume: bool = setting(False, help="continue from the newest step checkpoint in out")
    parallel: Parallel = setting(Parallel.AUTO, help="auto, none, ddp or fsdp")
    compile: bool = setting(False, help="torch.compile each block")
    activation_checkpointing: bool = setting(False, help="recompute blocks in backward (less memory)")
    attention_backend: Backend = setting(Backend.AUTO, help="auto, sdpa, flex, flash or reference")
    device: str = setting("auto", help="auto, cpu or cuda")
    threads: int | None = setting(None, help="CPU threads per process for torch (default: torch's choice)", minimum=1)
    dtype: Precision = setting(Precision.AUTO, help="auto (bf16 autocast on CUDA), float32 or bfloat16")
    peak_flops: float | None = setting(None, help="FLOP/s per device for MFU when the GPU is not in the table", above=0)
    log_every: int = setting(1, help="steps between metrics.jsonl lines", minimum=1)
    progress: bool = setting(True, help="show a progress bar on a terminal")
    tensorboard: bool = setting(False, help="also log to TensorBoard (when installed)")
    wandb: bool = setting(False, help="also log to Weights & Biases (when installed)")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # a count given as text ("all", "3": the command line, a recipe)
            if f.metadata.get("form") == "count":
                value = parse_count(getattr(self, f.name))
                if value is None:
                    raise TrainError(
                        f"`{f.name}`: give a whole number, or {ALL} (every one), got {getattr(self, f.name)!r}"
                    )
                setattr(self, f.name, value)
        check_ranges(self, TrainError)  # from the command line or a recipe: refused before any work
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
    """What a stage did; written to ``OUT/result.json`` when it completes.

    ``final_loss``: the training loss of the last step (nats per target token of that step's batch: for a
    curriculum, the targets of the level the run reached, so not comparable across runs). ``status``:
    ``"trained"`` or ``"diverged"`` (:mod:`trainer.divergence`), ``status_reason`` the rules that fired.
    ``eval_loss``, ``eval_loss_local``, ``eval_loss_retrieval``: the final weights' loss on the held-out set
    (:mod:`headprobe.text.heldout`; nats per target token), ``None`` when not measured (interrupted)."""

    out: Path
    steps: int
    tokens: int
    final_loss: float | None
    interrupted: bool
    status: str = "trained"
    status_reason: str | None = None
    eval_loss: float | None = None
    eval_loss_local: float | None = None
    eval_loss_retrieval: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "out": str(self.out)}
