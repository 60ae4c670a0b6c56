"""Load the models and the input the command line names, as :class:`~headprobe.explore.session.ModelView` s."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from headprobe.core.progress import Progress
from headprobe.explore.inputs import ExploreInput, InputError, needle_input, ruler_input, text_input
from headprobe.explore.session import ModelView
from headprobe.hooked import HookedModel, check_trained_lengths, load_model, parse_dtype
from headprobe.jobs.checkpoints import checkpoint_name
from headprobe.metrics.rows import Rows


def make_input(
    model: HookedModel,
    *,
    text: Path | None = None,
    ruler: str | None = None,
    needle: bool = False,
    length: int | None = None,
    depth: float = 50.0,
    seed: int = 0,
    needles: str = "builtin",
    prompt_format: str = "auto",
) -> ExploreInput:
    """The one input the options name, tokenised by ``model`` (needle and RULER inputs in its ``prompt_format``)."""
    if text is not None:
        return text_input(model, text, length)
    if length is None:
        raise InputError("--ruler and --needle need --length N")
    if ruler is not None:
        return ruler_input(model, ruler, length, seed, prompt_format)
    if needle:
        return needle_input(model, length, depth, seed, needles, prompt_format)
    raise InputError("give one input: --text FILE, --ruler TASK or --needle")


def build_views(
    checkpoints: Sequence[str | Path],
    *,
    layers: list[int] | None = None,
    rows: Rows | None = None,
    results: Path | None = None,
    device: str = "cpu",
    dtype: str | None = None,
    progress: Progress | None = None,
    allow_beyond_trained: bool = False,
    before_capture: Callable[[list[tuple[HookedModel, ExploreInput]]], None] | None = None,
    **input_options,
) -> list[ModelView]:
    """One :class:`ModelView` per checkpoint (names made unique), each on the input of ``input_options``
    (:func:`make_input`). An input ``length`` beyond what a model was trained on is refused before any
    model loads, as ``analyze`` and ``ruler eval`` refuse it, unless ``allow_beyond_trained``. Every model
    is loaded and tokenises the input before the first forward pass; ``before_capture`` sees them then
    (each model with its input) and may refuse the work by raising (e.g. a page too large to export)."""
    length = input_options.get("length")
    for path in checkpoints:
        warning = check_trained_lengths(path, [length] if length else [], allow_beyond_trained)
        if warning and progress is not None:
            progress.log(warning)
    loaded: list[tuple[HookedModel, ExploreInput]] = []
    for path in checkpoints:
        name = checkpoint_name(path)
        if any(model.name == name for model, _ in loaded):
            name = f"{name}#{len(loaded) + 1}"
        model = load_model(path, device=device, dtype=parse_dtype(dtype), log=progress.log if progress else None)
        model.name = name
        loaded.append((model, make_input(model, **input_options)))
    if before_capture is not None:
        before_capture(loaded)
    return [
        ModelView(model, inp, model.name, rows=rows, layers=layers, results=results, progress=progress)
        for model, inp in loaded
    ]
