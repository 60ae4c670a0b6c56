"""The training loop behind ``headprobe train`` (``torchrun -m headprobe train`` on many processes):
stages ``pt``, ``cpt``, ``sft``.

One :class:`~trainer.config.TrainConfig` drives a run. The loop is the same at every scale: a global
batch of ``batch_size`` sequences per optimizer step, split over the processes and into micro-batches
of ``micro_batch_size``; the loss is the sum of token losses over the global batch divided by its
number of target tokens, so 1 process with accumulation and N processes give the same update.

Files in ``OUT``: ``metrics.jsonl`` (one JSON line per step; every ``eval_every`` steps with the held-out
evaluation losses, :mod:`headprobe.text.heldout`), ``train_config.json``, ``step_XXXXXX/`` (resumable, see
:mod:`trainer.train_state`), ``final/`` (a plain checkpoint that ``headprobe`` analysis loads directly) and
``result.json`` (:class:`~trainer.config.TrainResult`: the final weights' evaluation losses and the run's
``status``, ``"diverged"`` when it ended collapsed: :mod:`trainer.divergence`).
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from headprobe.core.atomic import atomic_write_text, folder_lock, missing_folders, remove_if_empty
from headprobe.core.outputs import RUN, claim
from headprobe.core.steps import list_steps
from headprobe.model.answers import answer_loss, exact_share
from headprobe.model.budget import budget
from headprobe.model.checkpoint import save_checkpoint
from headprobe.model.config import ModelConfig
from headprobe.model.eval_loss import split_losses
from headprobe.model.tokenizer import ByteTokenizer
from headprobe.model.transformer import Transformer
from headprobe.text.heldout import eval_rows
from headprobe.text.probes import Probe, TaskProbeError
from trainer import train_state
from trainer.config import RESULT_FILE, Parallel, Precision, ReportCount, Stage, TrainConfig, TrainError, TrainResult
from trainer.curriculum import CurriculumSource, CurriculumState
from trainer.distributed import World, all_reduce_sum, init_world, shutdown, wrap
from trainer.divergence import RunStatus, chance_accuracy, inherited_status, run_status
from trainer.interrupt import interrupt_flag
from trainer.logbook import MetricsLog
from trainer.mfu import mfu, peak_flops
from trainer.optim import Schedule, build_optimizer
from trainer.setup import apply_freeze, data_source, model_and_tokenizer, tokenizer_sha256, tokenizer_spec


@dataclass(frozen=True)
class StepStats:
    """One optimizer step: mean loss per target token, the share of targets the greedy prediction got
    right, gradient norm before clipping, tokens counted, token positions processed (padding included for
    sft), wall seconds."""

    loss: float
    accuracy: float
    grad_norm: float
    tokens: int
    positions: float
    seconds: float


def _resolve_steps(cfg: TrainConfig, seq_len: int) -> int:
    if (cfg.steps is None) == (cfg.tokens is None):
        raise TrainError("give exactly one of `steps` or `tokens`")
    if cfg.steps is not None:  # its range is TrainConfig's (at least 1)
        return cfg.steps
    return max(1, math.ceil(cfg.tokens / (cfg.batch_size * seq_len)))  # type: ignore[operator]


class Trainer:
    """One training stage: :meth:`setup` builds the model, data and optimizer (and resumes),
    :meth:`train_step` runs one optimizer step, :meth:`run` loops with logging, step checkpoints and safe
    interruption, then writes ``final/``. ``on_step`` (main process only) hears of every step."""

    def __init__(self, cfg: TrainConfig, world: World, on_step: ReportCount | None = None) -> None:
        self.cfg, self.world, self.out = cfg, world, Path(cfg.out)
        self.on_step = on_step if world.is_main else None

    # -- setup -------------------------------------------------------------------------------------
    def _micro_batch(self) -> int:
        cfg, world = self.cfg, self.world
        if cfg.batch_size % world.size:  # its range is TrainConfig's (at least 1)
            raise TrainError(f"`batch_size` {cfg.batch_size} is not divisible by {world.size} processes")
        per_rank = cfg.batch_size // world.size
        micro = cfg.micro_batch_size or per_rank
        if per_rank % micro:
            raise TrainError(f"`micro_batch_size` {micro} does not divide the {per_rank} sequences per process")
        return micro

    def setup(self) -> Trainer:
        cfg, world = self.cfg, self.world
        self.micro = self._micro_batch()
        self.parallel = Parallel.DDP if world.distributed else Parallel.NONE
        self.parallel = self.parallel if cfg.parallel is Parallel.AUTO else cfg.parallel
        existing = list_steps(self.out)
        if existing and not cfg.resume:
            raise TrainError(
                f"{self.out} already holds step checkpoints ({existing[-1][1].name}); pass `resume` to "
                "continue that run or choose another `out`"
            )
        if not existing and (self.out / "final").is_dir():  # its steps deleted: nothing to continue from
            raise TrainError(
                f"{self.out} already holds a finished run (final/) without step checkpoints to continue from; "
                "training again would replace it: choose another `out`"
            )
        model, tokenizer = model_and_tokenizer(cfg)
        self.model_cfg: ModelConfig = model.cfg
        self.seq_len = cfg.seq_len or self.model_cfg.max_seq_len
        self.total_steps = _resolve_steps(cfg, self.seq_len)
        need = self.total_steps * cfg.batch_size * (self.seq_len + 1)
        self.source, self.tokenizer = data_source(cfg, self.seq_len, need, tokenizer, self.model_cfg, world)
        if self.tokenizer.vocab_size > self.model_cfg.vocab_size:
            raise TrainError(
                f"tokenizer {self.tokenizer.name} has {self.tokenizer.vocab_size} ids, more than the model's "
                f"vocab_size={self.model_cfg.vocab_size}"
            )
        self.frozen = apply_freeze(model, cfg.freeze)
        self._place(model)
        self.start_step, self.tokens_seen = self._resume(existing)
        self._write_config()
        return self

    def _place(self, model: Transformer) -> None:
        """Backend, device, compilation, parallel wrapping, optimizer, schedule and sampler."""
        cfg, world = self.cfg, self.world
        model.set_attention_backend(cfg.attention_backend)
        model.activation_checkpointing = cfg.activation_checkpointing
        model.to(world.device)
        self.bf16 = cfg.dtype is Precision.BFLOAT16 or (cfg.dtype is Precision.AUTO and world.device.type == "cuda")
        if cfg.compile:
            for block in model.blocks:
                block.compile()
        self.model = model
        self.wrapped = wrap(model, self.parallel, world, mixed_precision=self.bf16)
        self.optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2))
        self.warmup = cfg.warmup_steps if cfg.warmup_steps is not None else round(0.05 * self.total_steps)
        self.schedule = Schedule(
            cfg.schedule, cfg.lr, self.total_steps, self.warmup, cfg.min_lr_ratio, cfg.decay_fraction
        )
        self.data_identity = {**self.source.describe(), "seq_len": self.seq_len, "batch_size": cfg.batch_size}
        self.data_identity["seed"] = cfg.seed
        self.probes = self._probes()
        self.eval_rows = eval_rows(self.tokenizer) if cfg.eval_every else ()  # the held-out set, built once

    def _resume(self, existing: list[tuple[int, Path]]) -> tuple[int, int]:
        if not (self.cfg.resume and existing):
            return 0, 0
        folder = existing[-1][1]
        saved = train_state.read_step(folder)  # checked before any weights load: nothing is changed if refused
        differs = train_state.model_differences(saved.get("model_config"), self.model_cfg)
        if differs:
            same = {Stage.PT: "`preset`/`config`", Stage.CPT: "`init`, `seq_len` and `rope_theta_full`"}.get(
                self.cfg.stage, "`init` and `seq_len`"
            )
            raise TrainError(
                f"cannot resume from {folder}: model settings differ (saved vs now: {'; '.join(differs)}); the run "
                f"would continue the saved weights as another model. Give the same {same} as that run, or another "
                "`out` to train this model from scratch"
            )
        differs = train_state.training_differences(saved.get("train_config"), self.cfg.to_dict())
        if differs:
            raise TrainError(
                f"cannot resume from {folder}: training settings differ (saved vs now: {'; '.join(differs)}); the "
                f"run would go on with other settings than its first {saved['step']} steps trained with. Give the "
                f"same settings as that run ({self.out / train_state.CONFIG_FILE} lists them), or another `out` to "
                "train with these from scratch"
            )
        if saved["data"] != self.data_identity:
            raise TrainError(
                f"cannot resume from {folder}: data settings differ (saved {saved['data']}, now "
                f"{self.data_identity}); the run would not read the same batches"
            )
        state = train_state.load_step(folder, self.wrapped, self.optimizer, self.world)
        if isinstance(self.source, CurriculumSource):
            self.source.state = CurriculumState.from_dict(state["curriculum"])
        return state["step"], state["tokens"]

    def _probes(self) -> list[Probe]:
        spec = self.cfg.probes
        curriculum = self.source.c if isinstance(self.source, CurriculumSource) else None
        names = spec.split(",") if spec else list(curriculum.probes if curriculum else ())
        self.probe_every = self.cfg.probe_every or (curriculum.probe_every if curriculum else 0)
        try:
            return [Probe.parse(n) for n in names if n.strip()]
        except TaskProbeError as err:
            raise TrainError(str(err)) from None

    def _write_config(self) -> None:
        """``train_config.json``: the settings the run trains with, written as it starts; a resumed run keeps
        its record (:meth:`_resume` made sure that it goes on with those settings)."""
        if not self.world.is_main or (self.start_step and (self.out / train_state.CONFIG_FILE).is_file()):
            return
        self.out.mkdir(parents=True, exist_ok=True)
        record = {
            **self.cfg.to_dict(),
            "model_config": self.model_cfg.to_dict(),
            "world_size": self.world.size,
            "frozen": self.frozen,
            "data_identity": self.data_identity,
        }
        atomic_write_text(self.out / train_state.CONFIG_FILE, json.dumps(record, indent=2))

    # -- one step ----------------------------------------------------------------------------------
    def train_step(self, step: int) -> StepStats:
        """Optimizer step ``step`` (0-based): its global batch, split over processes and micro-batches."""
        cfg, world = self.cfg, self.world
        t0 = time.perf_counter()
        for group in self.optimizer.param_groups:
            group["lr"] = self.schedule(step)
        batches = self.source.micro_batches(step, world.rank, world.size, cfg.batch_size, self.micro)
        targets = all_reduce_sum(float(sum(b.target_tokens for b in batches)), world)
        positions = all_reduce_sum(float(sum(b.inputs.size for b in batches)), world)
        autocast = (
            torch.autocast(world.device.type, dtype=torch.bfloat16)
            if self.bf16 and self.parallel is not Parallel.FSDP
            else contextlib.nullcontext()
        )
        loss_sum, correct = 0.0, 0
        for i, b in enumerate(batches):
            last = i == len(batches) - 1
            sync = contextlib.nullcontext() if last or self.parallel is not Parallel.DDP else self.wrapped.no_sync()
            with sync, autocast:
                x, y, m = (torch.from_numpy(a).to(world.device) for a in (b.inputs, b.targets, b.loss_mask))
                part = self.wrapped(x, targets=y, loss_mask=m, count_correct=True)
                # DDP/FSDP average gradients over processes: scale so the result is sum / global
                (part.loss * (world.size / max(targets, 1.0))).backward()
            loss_sum += float(part.loss.detach())
            correct += int(part.correct)
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor
            grad_norm = grad_norm.full_tensor()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        tokens = cfg.batch_size * self.seq_len if cfg.stage is not Stage.SFT else int(targets)
        loss = all_reduce_sum(loss_sum, world) / max(targets, 1.0)
        accuracy = all_reduce_sum(float(correct), world) / max(targets, 1.0)
        return StepStats(loss, accuracy, float(grad_norm), tokens, positions, time.perf_counter() - t0)

    def save(self, step: int) -> None:
        """A resumable step checkpoint (every process writes its part)."""
        state = {
            "step": step,
            "tokens": self.tokens_seen,
            "data": self.data_identity,
            "stage": self.cfg.stage.value,
            "model_config": self.model_cfg.to_dict(),
            "tokenizer": tokenizer_spec(self.tokenizer),
            "tokenizer_sha256": tokenizer_sha256(self.tokenizer),
            "train_config": self.cfg.to_dict(),
        }
        if isinstance(self.source, CurriculumSource):
            state["curriculum"] = self.source.state.to_dict()
        train_state.save_step(self.out, step, self.wrapped, self.optimizer, state, self.world, self.cfg.keep)

    # -- the loop ----------------------------------------------------------------------------------
    def _probing(self, step: int) -> bool:
        return bool(self.probes) and self.probe_every > 0 and step % self.probe_every == 0

    def _evaluating(self, step: int) -> bool:
        return self.cfg.eval_every > 0 and step % self.cfg.eval_every == 0

    def eval_losses(self) -> dict[str, float]:
        """The model's loss on the held-out set now: ``eval_loss``, ``eval_loss_local``, ``eval_loss_retrieval``
        (nats per target token; no gradients, eval mode, then back; every process: FSDP forwards need them all)."""
        return split_losses(self.model, self.eval_rows)

    def probe_score(self, probe: Probe) -> float:
        """The share of ``probe``'s held-out examples the model answers exactly (greedy)."""
        return exact_share(self.model, probe.prompts(self.tokenizer))

    def _advance(self, step: int, accuracy: float) -> dict[str, Any]:
        """Move the curriculum on after ``step`` steps, whose training accuracy was ``accuracy`` (by that, by
        a schedule, or every ``every`` steps by the level's held-out advance probe); returns what to log of
        an advance probe that ran."""
        if not isinstance(self.source, CurriculumSource):
            return {}
        c, state = self.source.c, self.source.state
        state.observe(step - 1, accuracy, c)
        probe = c.advance_probe(state.level)
        if probe is None or step % c.probe_check_every or state.level >= len(c.levels) - 1:
            return {}
        score = self.probe_score(probe)  # every process: FSDP forwards need them all
        level = state.level
        state.observe_probe(step - 1, score, c)
        return {"advance_probe": probe.name, "advance_score": score, "advance_level": level}

    def _row(self, step: int, stats: StepStats, lr: float, flops: float, peak: float | None) -> dict[str, Any]:
        tps = stats.positions / stats.seconds
        row = {
            "step": step,
            "tokens": self.tokens_seen,
            "loss": stats.loss,
            "accuracy": stats.accuracy,
            "lr": lr,
            "grad_norm": stats.grad_norm,
            "tokens_per_s": tps,
            "mfu": mfu(flops, tps, peak, self.world.size),
            "step_time_s": stats.seconds,
            "stage": self.cfg.stage.value,
        }
        if isinstance(self.source, CurriculumSource):
            row["level"] = self.source.state.level
        if self._evaluating(step):
            row.update(self.eval_losses())
        if self._probing(step):
            for p in self.probes:
                row[p.name] = self.probe_score(p)
                row[p.loss_name] = answer_loss(self.model, p.prompts(self.tokenizer))
        if self.world.device.type == "cuda":
            row["peak_gpu_mem_gib"] = torch.cuda.max_memory_allocated(self.world.device) / 2**30
        return row

    def _check_finite(self, step: int, loss: float) -> None:
        """Refuse to end a run whose loss or weights are no longer finite numbers (it diverged: a learning rate
        too high for the model), naming the step and the fix; nothing of it is written (no ``final/``)."""
        shards = (p.to_local() if hasattr(p, "to_local") else p for p in self.model.parameters())  # FSDP2: DTensors
        bad = sum(not bool(torch.isfinite(shard).all()) for shard in shards)
        if math.isfinite(loss) and all_reduce_sum(float(bad), self.world) == 0:
            return
        at = f"at step {step} of {self.total_steps}"
        what = f"the training loss became {loss} {at}"
        if math.isfinite(loss):
            what = f"the weights stopped being finite numbers {at} (its loss: {loss:.4f})"
        kept = list_steps(self.out)
        default = TrainConfig.__dataclass_fields__["lr"].default
        raise TrainError(
            f"{what}: the run diverged, so no final/ was written"
            + (f" (its step checkpoints up to {kept[-1][1].name} are kept)" if kept else "")
            + f"; train again with a lower `lr` than {self.cfg.lr:g} (the default is {default:g})"
            + (", into a new `out`" if kept else "")
        )

    def run(self) -> TrainResult:
        """Train to the last step (or until interrupted: then save and stop), then write ``final/``; a loss that
        stops being a finite number ends the run with :class:`TrainError` instead (:meth:`_check_finite`)."""
        cfg, world = self.cfg, self.world
        flops = budget(self.model_cfg, self.seq_len).flops_per_token
        peak = peak_flops(world.device, cfg.peak_flops)
        log = MetricsLog(self.out, self.start_step, cfg, world.is_main)
        step, last_loss, interrupted = self.start_step, log.last_loss, False
        self.wrapped.train()
        with interrupt_flag() as stop:
            while step < self.total_steps:
                lr = self.schedule(step)
                stats = self.train_step(step)
                step += 1
                self.tokens_seen += stats.tokens
                last_loss = stats.loss
                gate = self._advance(step, stats.accuracy)
                logged = step % cfg.log_every == 0 or step == self.total_steps or gate
                if logged or self._probing(step) or self._evaluating(step):
                    log.write({**self._row(step, stats, lr, flops, peak), **gate})
                if self.on_step:
                    speed = stats.positions / stats.seconds
                    self.on_step(step, self.total_steps, f"loss {stats.loss:.4f}  {speed:,.0f} tok/s")
                if not math.isfinite(stats.loss):  # diverged: nothing after this step is worth training or saving
                    break
                if all_reduce_sum(float(stop[0]), world) > 0 and step < self.total_steps:
                    self.save(step)
                    interrupted = True
                    break
                if cfg.save_every and step % cfg.save_every == 0 and step < self.total_steps:
                    self.save(step)
        log.close()
        if not interrupted:
            self._check_finite(step, last_loss)  # never a final/ (nor a step to resume) of NaN weights
        result = TrainResult(self.out, step, self.tokens_seen, last_loss, interrupted)
        if not interrupted:  # a collapsed run still ends with final/ (it is data); its status says so
            status = self._status(log.rows)
            result.status, result.status_reason = status.status, status.reason
            if self.cfg.eval_every:
                for name, value in self._final_losses(log.rows).items():
                    setattr(result, name, value if math.isfinite(value) else None)
            self.save(step)  # a resumable end state (the next stage starts from final/)
            export_final(self.wrapped, self.model_cfg, self.tokenizer, self.out / "final", world)
            if world.is_main:
                atomic_write_text(self.out / RESULT_FILE, json.dumps(result.to_dict(), indent=2))
        return result

    def _final_losses(self, rows: list[dict[str, Any]]) -> dict[str, float]:
        """The final weights' held-out losses: the last step's logged ones when it was evaluated, else measured."""
        last = rows[-1] if rows else {}
        if last.get("step") == self.total_steps and "eval_loss" in last:
            return {k: v for k, v in last.items() if k.startswith("eval_loss")}
        return self.eval_losses()

    def _status(self, rows: list[dict[str, Any]]) -> RunStatus:
        """Whether the run ended collapsed (:mod:`trainer.divergence`), judged from its logged steps, or
        started from the final weights of a run that did (``init``'s run folder says so in its result)."""
        scratch = self.cfg.stage is Stage.PT
        chance = chance_accuracy(rows, self.tokenizer.vocab_size, self.warmup, from_scratch=scratch)
        source = Path(self.cfg.init).parent / RESULT_FILE if self.cfg.init else None  # init: RUN/final
        return inherited_status(source, run_status(rows, self.warmup, chance))


def train(cfg: TrainConfig, on_step: ReportCount | None = None) -> TrainResult:
    """Run one stage; see the module docstring. Safe to interrupt (Ctrl-C / SIGTERM save and stop)."""
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    world = init_world(cfg.device)
    out = Path(cfg.out)
    inputs = [p for p in (cfg.init, cfg.config, cfg.data, cfg.curriculum, cfg.tokenizer) if p and Path(p).exists()]
    claim(out, RUN, inputs=inputs, fix="choose another `out`")  # a new folder, or a training run to resume
    created = missing_folders(out)
    try:
        with folder_lock(out) if world.is_main else contextlib.nullcontext():  # one run per folder
            return Trainer(cfg, world, on_step if cfg.progress else None).setup().run()
    except BaseException:
        if created and world.is_main and out.is_dir() and not list_steps(out):
            shutil.rmtree(out, ignore_errors=True)  # a run that failed before its first checkpoint leaves nothing
            remove_if_empty(created[1:])  # nor the folders made for it
        raise
    finally:
        shutdown()
        torch.set_num_threads(threads)  # a library call leaves the process as it found it


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
