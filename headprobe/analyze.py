"""``headprobe analyze``: every requested metric of every checkpoint at every length, resumable.

Output for each checkpoint, in ``OUT/<name>/``:

* ``entropy.parquet``, ``reordering.parquet``: one row per layer x head x length x sample;
* ``erank.parquet``: one row per residual site x length (positions pooled over the samples);
* ``retrieval.parquet``: one row per layer x head x length (mean copy score over kept samples, with
  ``n_kept``/``n_samples``), and ``retrieval_samples.parquet`` (every needle sample);
* ``summary.json``: per metric and length, means over heads per layer type, retrieval-head counts and
  fractions, per-layer effective rank, plus the exact command, settings and library versions.

Work is split into items (checkpoint, metric, length), each written atomically to ``parts/`` with the
settings that produced it; a rerun skips items whose settings match. A checkpoint that fails to load
is reported and skipped. Memory is estimated before any work and the run refuses when it would not fit.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from headprobe.metrics import (
    GramAccumulator,
    StreamingAnalysis,
    parse_rows,
    retrieval_heads,
    score_prompts,
)
from headprobe.model.atomic import atomic_write_text
from headprobe.probe import ModelLoadError, ProbedModel, load_model, parse_dtype
from headprobe.text.haystack import text_inputs
from headprobe.text.needles import NEEDLES, needle_prompt

METRICS = ("retrieval", "entropy", "reordering", "erank")


class AnalysisError(ValueError):
    """Bad analysis settings, or a run that would not fit in memory."""


@dataclass
class AnalyzeSettings:
    """Everything that determines the numbers (stored with every result)."""

    metrics: list[str] = field(default_factory=lambda: list(METRICS))
    lengths: list[int] = field(default_factory=lambda: [4096])
    samples: int = 4
    rows: str = "all"
    topk: int = 16
    seed: int = 0
    max_new_tokens: int = 50
    haystack: list[str] | None = None
    dtype: str | None = None  # model dtype (headprobe.probe.DTYPES); None = as saved

    def validate(self) -> None:
        try:
            parse_dtype(self.dtype)
        except ValueError as err:
            raise AnalysisError(str(err)) from None
        unknown = [m for m in self.metrics if m not in METRICS]
        if unknown:
            raise AnalysisError(f"unknown metric(s) {unknown}; choose from {', '.join(METRICS)}")
        if not self.metrics:
            raise AnalysisError("no metric requested")
        if not self.lengths or min(self.lengths) < 16:
            raise AnalysisError("--lengths must be positive token counts of at least 16")
        if self.samples < 1:
            raise AnalysisError("--samples must be >= 1")
        for length in self.lengths:
            parse_rows(self.rows, length)  # raises on bad syntax
        if "reordering" in self.metrics and self.topk < 2:
            raise AnalysisError("token reordering needs --topk >= 2")

    def item_key(self, metric: str, length: int) -> dict[str, Any]:
        keep = {
            "metric": metric,
            "length": length,
            "samples": self.samples,
            "seed": self.seed,
            "haystack": self.haystack,
            "dtype": self.dtype,
        }
        if metric in ("entropy", "reordering", "erank"):
            keep["rows"] = self.rows
        if metric == "reordering":
            keep["topk"] = self.topk
        if metric == "retrieval":
            keep["max_new_tokens"] = self.max_new_tokens
        return keep


def checkpoint_name(path: Path) -> str:
    """The folder name, with its parents when it is generic (``final``, ``step_...``)."""
    if path.name == "final" or path.name.startswith("step_"):
        return "-".join(path.resolve().parts[-3:])
    return path.name


# ---------------------------------------------------------------------------------------------
# Memory estimate
# ---------------------------------------------------------------------------------------------
@dataclass
class MemoryEstimate:
    weights: int
    activations: int
    statistics: int
    kv_cache: int

    @property
    def total(self) -> int:
        return self.weights + self.activations + self.statistics + self.kv_cache

    def describe(self) -> str:
        gib = 2**30
        return (
            f"{self.total / gib:.2f} GiB (weights {self.weights / gib:.2f}, activations {self.activations / gib:.2f}, "
            f"statistics {self.statistics / gib:.2f}, KV cache {self.kv_cache / gib:.2f})"
        )


def estimate_memory(model: ProbedModel, length: int, settings: AnalyzeSettings) -> MemoryEstimate:
    """Peak bytes of one analysis pass over ``length`` tokens (batch 1), from the model's shapes.

    Activations: the residual stream, one layer's q/k/v/o and MLP hidden states (float32, a safety
    factor of 2 for temporaries). Statistics: the score tiles of the streaming pass plus the per-row
    outputs. KV cache: retrieval decoding keeps every layer's keys and values.
    """
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    d_model, d_ff = _widths(model)
    widest = max(info.n_heads * info.qk_dim for info in model.layers)
    rows = parse_rows(settings.rows, length)
    n_rows = length if rows is None else len(rows)
    activations = 2 * 4 * length * (3 * d_model + 4 * widest + 3 * d_ff)
    heads = max(info.n_heads for info in model.layers)
    tile = 6 * 4 * heads * min(n_rows, 1024) * 8192  # a few float32 tiles of the streaming pass
    per_row = 8 * heads * n_rows * (10 + 2 * settings.topk)
    kv = 0
    if "retrieval" in settings.metrics:
        kv = sum(4 * info.n_kv_heads * 2 * info.qk_dim * (length + settings.max_new_tokens) for info in model.layers)
    return MemoryEstimate(params, activations, tile + per_row, kv)


def _widths(model: ProbedModel) -> tuple[int, int]:
    inner = getattr(model, "model", None)
    if inner is not None and hasattr(inner, "cfg"):
        return inner.cfg.d_model, inner.cfg.d_ff
    cfg = model.hf.config  # type: ignore[attr-defined]
    return cfg.hidden_size, getattr(cfg, "intermediate_size", 4 * cfg.hidden_size)


def available_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


# ---------------------------------------------------------------------------------------------
# Result files
# ---------------------------------------------------------------------------------------------
def write_parquet(frame: pd.DataFrame, path: Path, meta: dict[str, Any]) -> None:
    """Atomically write ``frame`` with ``meta`` (JSON) in the Parquet schema metadata under ``headprobe``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(frame, preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), b"headprobe": json.dumps(meta).encode()})
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_meta(path: Path) -> dict[str, Any] | None:
    import pyarrow.parquet as pq

    try:
        raw = (pq.read_schema(path).metadata or {}).get(b"headprobe")
    except (OSError, ValueError):
        return None
    return json.loads(raw) if raw else None


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version(), "torch": torch.__version__}
    for pkg in ("headprobe", "transformers", "transformer-lens"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[pkg] = md.version(pkg)
    return out


# ---------------------------------------------------------------------------------------------
# One checkpoint
# ---------------------------------------------------------------------------------------------
def _tag(frame: pd.DataFrame, **columns: Any) -> pd.DataFrame:
    for name, value in columns.items():
        frame[name] = value
    return frame


def _attention_items(model: ProbedModel, length: int, s: AnalyzeSettings, todo: set[str]) -> dict[str, pd.DataFrame]:
    """entropy / reordering (per sample) and erank (pooled) for one length, in one pass per sample."""
    inputs = text_inputs(
        model.tokenizer, length, s.samples, seed=s.seed, files=[Path(f) for f in s.haystack] if s.haystack else None
    )
    rows = parse_rows(s.rows, length)
    grams: dict[int, GramAccumulator] = {}
    frames: dict[str, list[pd.DataFrame]] = {m: [] for m in todo}
    heads = bool(todo & {"entropy", "reordering"})
    k = s.topk if "reordering" in todo else 0
    for sample in range(s.samples):
        run = StreamingAnalysis(model, rows, k=k, heads=heads, residual="erank" in todo, grams=grams)
        run.add(inputs[sample : sample + 1])
        if "entropy" in todo:
            frames["entropy"].append(_tag(run.entropy(), length=length, sample=sample))
        if "reordering" in todo:
            frames["reordering"].append(_tag(run.reordering(), length=length, sample=sample))
    out = {m: pd.concat(f, ignore_index=True) for m, f in frames.items() if m != "erank"}
    if "erank" in todo:
        out["erank"] = _tag(StreamingAnalysis(model, grams=grams).erank(), length=length, samples=s.samples)
    return out


def _retrieval_item(model: ProbedModel, length: int, s: AnalyzeSettings) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Retrieval scores at one length: ``samples`` needle prompts at evenly spaced depths, needles in turn."""
    depths = np.linspace(0, 100, s.samples).round().tolist() if s.samples > 1 else [50.0]
    files = [Path(f) for f in s.haystack] if s.haystack else None
    prompts = [
        needle_prompt(model.tokenizer, NEEDLES[i % len(NEEDLES)], length, depth, seed=s.seed + i, files=files)
        for i, depth in enumerate(depths)
    ]
    frame = score_prompts(model, prompts, s.max_new_tokens)
    samples = frame.attrs.pop("samples")
    return _tag(frame, length=length), samples


def summarize(folder: Path, settings: AnalyzeSettings, threshold: float = 0.1) -> dict[str, Any]:
    """The per-metric, per-length summary from the result files in ``folder``."""
    out: dict[str, Any] = {}
    for metric in ("entropy", "reordering"):
        path = folder / f"{metric}.parquet"
        if path.exists():
            frame = pd.read_parquet(path)
            out[metric] = {}
            for length, part in frame.groupby("length"):
                entry = {
                    "mean": float(part["value"].mean()),
                    "by_layer_type": {t: float(g["value"].mean()) for t, g in part.groupby("layer_type")},
                }
                if "norm_value" in part:
                    entry["norm_mean"] = float(part["norm_value"].mean())
                    entry["norm_by_layer_type"] = {
                        t: float(g["norm_value"].mean()) for t, g in part.groupby("layer_type")
                    }
                out[metric][str(length)] = entry
    path = folder / "retrieval.parquet"
    if path.exists():
        frame = pd.read_parquet(path)
        out["retrieval"] = {}
        for length, part in frame.groupby("length"):
            heads = retrieval_heads(part, threshold)
            out["retrieval"][str(length)] = {
                "n_kept": int(part["n_kept"].iloc[0]),
                "n_samples": int(part["n_samples"].iloc[0]),
                "mean_score": None if part["value"].isna().all() else float(part["value"].mean()),
                "threshold": threshold,
                "retrieval_heads": {
                    r.layer_type: {
                        "count": int(r.retrieval_heads),
                        "heads": int(r.heads),
                        "fraction": float(r.fraction),
                    }
                    for r in heads.itertuples()
                },
            }
    path = folder / "erank.parquet"
    if path.exists():
        frame = pd.read_parquet(path)
        out["erank"] = {
            str(length): {
                "per_layer": {str(int(r.layer)): float(r.value) for r in part.itertuples()},
                "per_layer_uncentered": {str(int(r.layer)): float(r.uncentered) for r in part.itertuples()},
            }
            for length, part in frame.groupby("length")
        }
    return out


def analyze_checkpoint(
    path: Path,
    out: Path,
    settings: AnalyzeSettings,
    device: str = "cpu",
    memory_limit: int | None = None,
    report: Callable[[str], None] = print,
    advance: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """All items of one checkpoint; returns its summary."""
    model = load_model(path, device=device, dtype=parse_dtype(settings.dtype))
    name = checkpoint_name(path)
    folder = out / name
    budget = memory_limit or available_memory(torch.device(device))
    for length in settings.lengths:
        model.check_length(length + (settings.max_new_tokens if "retrieval" in settings.metrics else 0))
        if "retrieval" in settings.metrics:  # every needle prompt must fit, before any work starts
            for needle in NEEDLES:
                try:
                    needle_prompt(model.tokenizer, needle, length, 50.0)
                except ValueError as err:
                    raise AnalysisError(f"{name}: {err}; use longer --lengths for retrieval") from None
        est = estimate_memory(model, length, settings)
        if est.total > 0.9 * budget:
            raise AnalysisError(
                f"{name} at {length:,} tokens needs about {est.describe()}, but only {budget / 2**30:.2f} GiB is "
                "available; use --rows last:N or stride:N, shorter --lengths, fewer metrics, or a larger machine"
            )
    parts = folder / "parts"
    for length in settings.lengths:
        todo = set()
        for metric in settings.metrics:
            part = parts / f"{metric}-{length}.parquet"
            if read_meta(part) == settings.item_key(metric, length):
                report(f"{name} {metric} @ {length}: done earlier, skipped")
                advance()
            else:
                todo.add(metric)
        if todo & {"entropy", "reordering", "erank"}:
            report(f"{name} {', '.join(sorted(todo - {'retrieval'}))} @ {length}: running")
            frames = _attention_items(model, length, settings, todo - {"retrieval"})
            for metric, frame in frames.items():
                write_parquet(frame, parts / f"{metric}-{length}.parquet", settings.item_key(metric, length))
                advance()
        if "retrieval" in todo:
            report(f"{name} retrieval @ {length}: running {settings.samples} needle samples")
            frame, samples = _retrieval_item(model, length, settings)
            write_parquet(
                samples, parts / f"retrieval_samples-{length}.parquet", settings.item_key("retrieval", length)
            )
            write_parquet(frame, parts / f"retrieval-{length}.parquet", settings.item_key("retrieval", length))
            advance()
    for metric in settings.metrics:
        names = [metric] + (["retrieval_samples"] if metric == "retrieval" else [])
        for table in names:
            frame = pd.concat(
                [pd.read_parquet(parts / f"{table}-{n}.parquet") for n in settings.lengths], ignore_index=True
            )
            write_parquet(frame, folder / f"{table}.parquet", {"checkpoint": str(path), **asdict(settings)})
    summary = {
        "checkpoint": str(path),
        "name": name,
        "command": sys.argv,
        "settings": asdict(settings),
        "versions": versions(),
        "metrics": summarize(folder, settings),
    }
    atomic_write_text(folder / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


def analyze(
    checkpoints: Sequence[str | Path],
    out: str | Path,
    settings: AnalyzeSettings,
    device: str = "cpu",
    memory_limit: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Analyze every checkpoint (see module docstring); returns ``{"checkpoints": {name: summary},
    "errors": {name: message}}`` and writes the same to ``OUT/summary.json`` (unless all failed)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    settings.validate()
    out = Path(out)
    console = Console(stderr=True)
    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    items = len(settings.metrics) * len(settings.lengths)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not progress,
        transient=False,
    ) as bar:
        task = bar.add_task("analyze", total=items * len(checkpoints))
        for ckpt in checkpoints:
            path = Path(ckpt)
            try:
                results[checkpoint_name(path)] = analyze_checkpoint(
                    path,
                    out,
                    settings,
                    device,
                    memory_limit,
                    report=bar.console.print,
                    advance=lambda: bar.advance(task),
                )
            except (ModelLoadError, AnalysisError, ValueError, FileNotFoundError) as err:
                console.print(f"[red]{path}: {err}[/red]")
                errors[checkpoint_name(path)] = str(err)
                bar.advance(task, items)
    if results:  # nothing is written when every checkpoint failed
        atomic_write_text(out / "summary.json", json.dumps({"checkpoints": results, "errors": errors}, indent=2) + "\n")
    return {"checkpoints": results, "errors": errors}
