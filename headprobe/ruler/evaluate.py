"""``headprobe ruler eval``: run a model on RULER-style samples and score them as RULER does.

Files in ``OUT``:

* ``predictions/<task>-<length>.jsonl``: one line per sample (``index``, ``pred``, ``outputs``,
  ``token_count``); appended as samples finish, so a rerun continues where it stopped;
* ``scores.json``: score per task x length, the per-length mean over the tasks, the overall mean over
  lengths (the "RULER-style score"), sample counts, data sources, settings and versions.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from headprobe.model.atomic import atomic_write_text
from headprobe.model.tokenizer import prompt_start, with_prompt_start
from headprobe.probe import ProbedModel, load_model, parse_dtype
from headprobe.ruler.generate import RulerError, RulerGenerator
from headprobe.ruler.scoring import METRICS, postprocess
from headprobe.ruler.tasks import TASKS, resolve_tasks
from headprobe.ruler.templates import resolve_wrapper
from headprobe.text.jsonl import jsonl_records


@dataclass
class RulerSettings:
    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    lengths: list[int] = field(default_factory=lambda: [4096])
    samples: int = 25
    seed: int = 42
    haystack_files: list[str] | None = None
    qa_files: list[str] | None = None
    data: str | None = None
    wrapper: str = "base"  # base | chat | a wrapper string or file (see headprobe.ruler.templates)
    dtype: str | None = None  # model dtype (headprobe.probe.DTYPES); None = as saved


def qa_file_kinds(paths: list[str] | None) -> dict[str, Path]:
    """Tell SQuAD (an object with ``data``) from HotpotQA (a list) by their original formats."""
    out: dict[str, Path] = {}
    for p in paths or []:
        path = Path(p)
        if not path.is_file():
            raise RulerError(f"QA file {path} does not exist")
        with path.open(encoding="utf-8") as f:
            head = f.read(1 << 16).lstrip()
        kind = "hotpotqa" if head.startswith("[") else "squad" if head.startswith("{") else None
        if kind is None:
            raise RulerError(f"{path} is neither SQuAD v2 (a JSON object) nor HotpotQA (a JSON list)")
        out[kind] = path
    return out


def read_samples(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise RulerError(f"data file {path} does not exist")
    samples = []
    for lineno, sample in jsonl_records(path.read_text(encoding="utf-8"), path, RulerError):
        missing = {"index", "input", "outputs", "length", "answer_prefix", "task"} - set(sample)
        if missing:
            raise RulerError(f"{path}:{lineno}: missing RULER fields {sorted(missing)}")
        samples.append(sample)
    return samples


def _done(path: Path) -> dict[int, dict[str, Any]]:
    """Predictions already written (a torn last line from an interruption is dropped)."""
    if not path.exists():
        return {}
    rows, good = {}, []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        rows[row["index"]] = row
        good.append(line)
    atomic_write_text(path, "".join(g + "\n" for g in good))
    return rows


MAX_BATCH = 32


def decode_batch_size(model: ProbedModel, length: int, memory_limit: int | None, requested: int | None = None) -> int:
    """How many samples of ``length`` tokens decode together: the KV caches of a batch must fit in
    half of what one prefill pass leaves free (at most ``MAX_BATCH``); ``requested`` is checked the same
    way. Raises with the numbers when not even one sample fits."""
    from headprobe.analyze import AnalysisError, AnalyzeSettings, available_memory, estimate_memory

    est = estimate_memory(model, length, AnalyzeSettings(metrics=["entropy"], rows="last:1"))
    budget = memory_limit or available_memory(model.device)
    per_sample = model.kv_cache_bytes(length + max(t.tokens_to_generate for t in TASKS.values()))
    if est.total + per_sample > 0.9 * budget:
        raise AnalysisError(
            f"{model.name} at {length:,} tokens needs about {(est.total + per_sample) / 2**30:.2f} GiB "
            f"({est.describe()} + KV cache {per_sample / 2**30:.2f} GiB), but only {budget / 2**30:.2f} GiB is "
            "available; use shorter --lengths or a larger machine"
        )
    fits = max(1, int((0.9 * budget - est.total) * 0.5 // per_sample))
    if requested is None:
        return min(fits, MAX_BATCH)
    if requested > fits:
        raise AnalysisError(
            f"--batch-size {requested} at {length:,} tokens needs {requested * per_sample / 2**30:.2f} GiB of KV "
            f"cache; at most {fits} fit in {budget / 2**30:.2f} GiB; use a smaller --batch-size (0 = automatic)"
        )
    return requested


def evaluate(
    checkpoint: str | Path,
    out: str | Path,
    settings: RulerSettings,
    device: str = "cpu",
    memory_limit: int | None = None,
    progress: bool = True,
    on_sample: Callable[[dict[str, Any]], None] | None = None,
    batch_size: int | None = None,
) -> dict[str, Any]:
    """Generate (or read) the samples, decode greedily, score; see the module docstring.

    Samples of one task and length decode together in batches of ``batch_size`` (``None``: as many as
    the memory allows, see :func:`decode_batch_size`); a batch's predictions are appended when it ends.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    tasks = resolve_tasks(settings.tasks)
    out = Path(out)
    model = load_model(checkpoint, device=device, dtype=parse_dtype(settings.dtype))
    batch: dict[int, int] = {}
    for length in settings.lengths:
        model.check_length(length)
        batch[length] = decode_batch_size(model, length, memory_limit, batch_size)
    _claim_predictions(out, checkpoint, settings)  # before generating samples: a refusal costs nothing
    tok = model.tokenizer
    if settings.data:
        wanted = {t.name for t in tasks}
        samples = [s for s in read_samples(settings.data) if s["task"] in wanted and s["length"] in settings.lengths]
        samples = [s for s in samples if s["index"] < settings.samples]
    else:
        gen = RulerGenerator(
            tok,
            settings.seed,
            [Path(f) for f in settings.haystack_files or []] or None,
            qa_file_kinds(settings.qa_files),
            reserve=len(prompt_start(tok)),
            wrapper=resolve_wrapper(settings.wrapper, checkpoint),
        )
        samples = list(gen.samples(tasks, settings.lengths, settings.samples))
    stop = [tok.eos_id] if tok.eos_id is not None else None
    console = Console(stderr=True)
    trained = getattr(model, "trained_length", None)
    if trained and max(settings.lengths) > trained:
        console.print(
            f"[yellow]note: {model.name} was trained on {trained:,}-token sequences; lengths above that "
            "measure extrapolation"
        )
    with Progress(
        TextColumn("[bold]ruler {task.fields[what]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not progress,
    ) as bar:
        job = bar.add_task("ruler", total=len(samples), what="")
        groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for sample in samples:
            groups.setdefault((sample["task"], sample["length"]), []).append(sample)
        for (task, length), group in groups.items():
            path = out / "predictions" / f"{task}-{length}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            done = _done(path)
            bar.update(job, what=f"{task} @ {length}")
            bar.advance(job, sum(s["index"] in done for s in group))
            pending = [s for s in group if s["index"] not in done]
            for start in range(0, len(pending), batch[length]):
                chunk = pending[start : start + batch[length]]
                prompts = [
                    torch.tensor([with_prompt_start(tok, tok.encode(s["input"] + s["answer_prefix"]))]) for s in chunk
                ]
                outputs = model.decode_batch(prompts, TASKS[task].tokens_to_generate, stop)
                rows = [
                    {
                        "index": s["index"],
                        "pred": postprocess(tok.decode(new)),
                        "outputs": s["outputs"],
                        "token_count": ids.shape[1],
                        "source": s.get("source"),
                        "haystack": s.get("haystack"),
                    }
                    for s, ids, new in zip(chunk, prompts, outputs, strict=True)
                ]
                with path.open("a", encoding="utf-8") as f:
                    f.write("".join(json.dumps(row) + "\n" for row in rows))
                for row in rows:
                    if on_sample:
                        on_sample(row)
                bar.advance(job, len(rows))
    scores = score_predictions(out, tasks, settings)
    scores.update(
        {"checkpoint": str(checkpoint), "command": sys.argv, "settings": asdict(settings), "versions": _versions()}
    )
    atomic_write_text(out / "scores.json", json.dumps(scores, indent=2) + "\n")
    return scores


RUN_FILE = "predictions/run.json"


def _claim_predictions(out: Path, checkpoint: str | Path, settings: RulerSettings) -> None:
    """Record what the predictions in ``out`` are made from, or refuse to add to predictions made from
    something else (a resumed run must not mix checkpoints, seeds, wrappers or dtypes)."""
    key = {
        "checkpoint": str(Path(checkpoint).resolve()),
        "seed": settings.seed,
        "wrapper": settings.wrapper,
        "dtype": settings.dtype,
        "data": settings.data,
        "haystack_files": settings.haystack_files,
        "qa_files": settings.qa_files,
    }
    path = out / RUN_FILE
    if path.exists():
        old = json.loads(path.read_text(encoding="utf-8"))
        differ = sorted(k for k in key if old.get(k) != key[k])
        if differ:
            raise RulerError(
                f"{out} holds predictions made with other settings ({', '.join(differ)} differ); use another "
                f"--out, or delete {out / 'predictions'} to start over"
            )
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(key, indent=2) + "\n")


def _versions() -> dict[str, str]:
    from headprobe.analyze import versions

    return versions()


def score_predictions(out: Path, tasks, settings: RulerSettings) -> dict[str, Any]:
    """Scores from the prediction files: per task x length, per-length means, overall mean."""
    per_task: dict[str, dict[str, float]] = {}
    counts: dict[str, dict[str, int]] = {}
    sources: dict[str, set[str]] = {}
    for task in tasks:
        for length in settings.lengths:
            path = out / "predictions" / f"{task.name}-{length}.jsonl"
            rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []
            rows = [r for r in rows if r["index"] < settings.samples]
            if not rows:
                continue
            metric = METRICS[task.metric]
            per_task.setdefault(task.name, {})[str(length)] = metric(
                [r["pred"] for r in rows], [r["outputs"] for r in rows]
            )
            counts.setdefault(task.name, {})[str(length)] = len(rows)
            sources.setdefault(task.name, set()).update(str(r.get("source")) for r in rows)
    per_length = {}
    for length in settings.lengths:
        values = [per_task[t.name][str(length)] for t in tasks if str(length) in per_task.get(t.name, {})]
        if values:
            per_length[str(length)] = round(sum(values) / len(values), 2)
    overall = round(sum(per_length.values()) / len(per_length), 2) if per_length else None
    return {
        "label": "RULER-style",
        "tasks": per_task,
        "samples": counts,
        "per_length_mean": per_length,
        "tasks_per_length": {str(n): sum(str(n) in per_task.get(t.name, {}) for t in tasks) for n in settings.lengths},
        "ruler_style_score": overall,
        "sources": {k: sorted(v) for k, v in sources.items()},
    }


def evaluate_many(
    checkpoints: list[str | Path], out: str | Path, settings: RulerSettings, **kwargs: Any
) -> dict[str, Any]:
    """:func:`evaluate` for each checkpoint (e.g. the members of a grid) with the same samples.

    One checkpoint writes into ``out`` itself; several write into ``out/<name>/`` each (``name`` as in
    ``headprobe analyze``) plus ``out/comparison.json``. A checkpoint that fails (missing, too short a
    context, out of memory) is reported under ``errors`` and the others still run.

    Returns:
        ``{"checkpoints": {name: scores}, "errors": {name: message}}``.
    """
    from headprobe.analyze import AnalysisError, checkpoint_name
    from headprobe.probe import ModelLoadError

    out = Path(out)
    names = [checkpoint_name(Path(c)) for c in checkpoints]
    if len(set(names)) < len(names):
        raise RulerError(f"two checkpoints would share a results folder: {names}; evaluate them separately")
    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for checkpoint, name in zip(checkpoints, names, strict=True):
        try:
            results[name] = evaluate(checkpoint, out if len(names) == 1 else out / name, settings, **kwargs)
        except (RulerError, ModelLoadError, AnalysisError, ValueError) as err:
            if len(names) == 1:
                raise
            errors[name] = str(err)
    if len(names) > 1:
        comparison = {
            "label": "RULER-style",
            "checkpoints": {
                n: {"ruler_style_score": r["ruler_style_score"], "per_length_mean": r["per_length_mean"]}
                for n, r in results.items()
            },
            "errors": errors,
            "settings": asdict(settings),
        }
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "comparison.json", json.dumps(comparison, indent=2) + "\n")
    return {"checkpoints": results, "errors": errors}


def comparison_table(results: dict[str, dict[str, Any]]):
    """Checkpoints x lengths: the per-length means and the overall RULER-style score."""
    from rich.table import Table

    lengths = sorted({n for r in results.values() for n in r["per_length_mean"]}, key=int)
    table = Table(title="RULER-style scores (0-100), mean over tasks")
    table.add_column("checkpoint")
    for length in lengths:
        table.add_column(f"{int(length):,}", justify="right")
    table.add_column("overall", justify="right")
    for name, r in results.items():
        per = r["per_length_mean"]
        overall = r["ruler_style_score"]
        table.add_row(name, *[f"{per[n]:.2f}" if n in per else "-" for n in lengths], f"{overall:.2f}")
    return table


def score_table(scores: dict[str, Any]):
    from rich.table import Table

    lengths = list(scores["per_length_mean"])
    table = Table(title=f"RULER-style scores (0-100): overall {scores['ruler_style_score']}")
    table.add_column("task")
    for length in lengths:
        table.add_column(f"{int(length):,}", justify="right")
    for task, per in scores["tasks"].items():
        table.add_row(task, *[f"{per[n]:.2f}" if n in per else "-" for n in lengths])
    table.add_row("[bold]mean", *[f"[bold]{scores['per_length_mean'][n]:.2f}" for n in lengths])
    return table
