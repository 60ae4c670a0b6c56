"""``headprobe train grid``: every member x seed of a recipe through its runs, resumable.

A *recipe* (JSON: the built-in ``trainer/configs/<scale>.json`` or any file) says what to train::

    {
      "scale": "toy",
      "seeds": [0, 1, 2],
      "runs": {
        "pt":         {"stage": "pt", "curriculum": "curricula/toy-pt.json", "steps": 1500, ...},
        "cpt":        {"stage": "cpt", "from": "pt", "seq_len": 2048, ...},
        "cpt-frozen": {"like": "cpt", "freeze": "attention"},
        "sft":        {"stage": "sft", "from": "cpt", ...}
      },
      "profiles": {"demo": {"seeds": [0], "runs": {"pt": {"steps": 300}}}}
    }

* ``runs``, in order: each is one training run (:class:`trainer.config.TrainConfig` fields) with
  ``stage`` (default: its name), ``from`` (the run whose ``final/`` checkpoint it starts from; pt
  starts from the member's preset) and ``like`` (take another run's settings, then change some).
  A relative ``curriculum``/``data`` path is read beside the recipe file when it exists there.
* ``profiles``: named changes to the recipe (``seeds``, any run's settings), e.g. a quick ``demo``.

``RUNS/<member>/s<seed>/<run>/`` is one training run (see :mod:`trainer.train`). A run counts as
finished when its ``final/`` checkpoint and ``result.json`` exist; finished runs are skipped,
unfinished ones resume from their newest step checkpoint, so rerunning the command after a crash or an
interrupt continues. ``RUNS/manifest.json`` lists every finished run (member, seed, run, stage, from,
checkpoint, tokens, steps, final loss, status and status reason, the held-out evaluation losses) and is
rewritten atomically after each.
"""

from __future__ import annotations

import contextlib
import copy
import json
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

from headprobe.core.atomic import atomic_write_text
from headprobe.core.cleanup import CLEANUPS
from headprobe.core.outputs import GRID, MANIFEST_FILE, claim
from headprobe.core.paths import read_utf8
from headprobe.model.presets import list_presets
from trainer.config import RESULT_FILE, ReportCount, TrainConfig, TrainError, TrainResult
from trainer.train import train
from trainer.train_state import saved_training, training_differences

_RUN_KEYS = {"stage", "from", "like"}
RESULT_COLUMNS = ("status", "status_reason", "eval_loss", "eval_loss_local", "eval_loss_retrieval")
_PATH_KEYS = ("curriculum", "data", "tokenizer")


@dataclass(frozen=True)
class Recipe:
    """A parsed recipe: the scale, the seeds and each run's settings (``from``/``stage`` resolved)."""

    scale: str
    seeds: tuple[int, ...]
    runs: dict[str, dict[str, Any]]
    source: str
    study: dict[str, Any] = field(default_factory=dict)  # what `headprobe study` measures (headprobe.study)

    @classmethod
    def load(cls, spec: str | Path, profile: str | None = None) -> Recipe:
        """``spec``: a built-in scale name (``toy``) or a recipe file; ``profile``: one of its profiles."""
        path = Path(spec)
        builtins = sorted(
            f.name.removesuffix(".json") for f in files("trainer.configs").iterdir() if f.name.endswith(".json")
        )
        if path.suffix != ".json" and len(path.parts) == 1 and spec in builtins:  # a scale name: the built-in recipe
            path = Path(str(files("trainer.configs").joinpath(f"{spec}.json")))
        elif not path.exists():
            raise TrainError(
                f"`recipe` {spec} does not exist, and no built-in recipe has that name; give a recipe JSON file "
                f"(trainer/configs/toy.json is one) or a built-in recipe: {', '.join(builtins)}"
            )
        text = read_utf8(path, "recipe file", TrainError)
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as err:
            raise TrainError(
                f"`recipe` {path} is not a recipe: not valid JSON ({err}); give a recipe JSON file (trainer/configs/"
                f"toy.json is one) or a built-in recipe: {', '.join(builtins)}"
            ) from None
        if not isinstance(raw, dict):
            raise TrainError(f"`recipe` {path} is not a recipe: a recipe is a JSON object naming a scale and its runs")
        return cls.from_dict(raw, path, profile)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], path: Path, profile: str | None = None) -> Recipe:
        raw = copy.deepcopy(raw)
        if profile:
            profiles = raw.get("profiles", {})
            if profile not in profiles:
                raise TrainError(f"{path}: no profile {profile!r}; it has {', '.join(profiles) or 'none'}")
            change = profiles[profile]
            raw["seeds"] = change.get("seeds", raw.get("seeds"))
            raw["study"] = {**raw.get("study", {}), **change.get("study", {})}
            for name, settings in change.get("runs", {}).items():
                if name not in raw.get("runs", {}):
                    raise TrainError(f"{path}: profile {profile!r} changes run {name!r}, which the recipe lacks")
                _replace_length(raw["runs"][name], settings)
        if "scale" not in raw or not raw.get("runs"):
            raise TrainError(f"{path}: a recipe names its `scale` and its `runs`")
        runs: dict[str, dict[str, Any]] = {}
        for name, settings in raw["runs"].items():
            runs[name] = _resolve_run(name, settings, runs, path)
        unknown = sorted(set(raw) - {"scale", "description", "seeds", "runs", "profiles", "study"})
        if unknown:
            raise TrainError(f"{path}: unknown recipe fields {unknown}")
        seeds = tuple(int(s) for s in raw.get("seeds") or [0])
        return cls(str(raw["scale"]), seeds, runs, str(path), dict(raw.get("study", {})))


def _replace_length(settings: dict[str, Any], change: dict[str, Any]) -> None:
    """Apply ``change`` to ``settings``; a change of ``steps``/``tokens`` replaces either."""
    if {"steps", "tokens"} & set(change):
        settings.pop("steps", None)
        settings.pop("tokens", None)
    settings.update(change)


def _resolve_run(name: str, settings: dict[str, Any], earlier: dict[str, dict[str, Any]], path: Path) -> dict[str, Any]:
    settings = dict(settings)
    like = settings.pop("like", None)
    if like is not None:
        if like not in earlier:
            raise TrainError(f"{path}: run {name!r} is like {like!r}, which is not an earlier run")
        base = dict(earlier[like])
        _replace_length(base, settings)
        settings = base
    settings.setdefault("stage", name)
    if settings["stage"] not in ("pt", "cpt", "sft"):
        raise TrainError(f"{path}: run {name!r} has stage {settings['stage']!r}; stages are pt, cpt and sft")
    source = settings.get("from")
    if settings["stage"] == "pt" and source is not None:
        raise TrainError(f"{path}: run {name!r} is pt (from the preset); it has no `from`")
    if settings["stage"] != "pt" and source not in earlier:
        raise TrainError(f"{path}: run {name!r} starts `from` {source!r}, which is not an earlier run")
    for key in _PATH_KEYS:
        value = settings.get(key)
        if isinstance(value, str) and not Path(value).is_absolute() and (path.parent / value).exists():
            settings[key] = str(path.parent / value)
    unknown = set(settings) - _RUN_KEYS - set(TrainConfig.__dataclass_fields__)
    if unknown:
        raise TrainError(f"{path}: run {name!r} has unknown settings {sorted(unknown)}")
    return settings


def run_dir(runs: Path, member: str, seed: int, run: str) -> Path:
    return runs / member / f"s{seed}" / run


def is_finished(folder: Path) -> bool:
    return (folder / "final" / "config.json").is_file() and (folder / RESULT_FILE).is_file()


def _run_config(
    member: str, seed: int, settings: dict[str, Any], folder: Path, previous: Path | None,
    overrides: dict[str, Any] | None,
) -> TrainConfig:  # fmt: skip
    settings = {k: v for k, v in settings.items() if k not in _RUN_KEYS - {"stage"}}
    _replace_length(settings, dict(overrides or {}))
    pt = settings["stage"] == "pt"
    return TrainConfig(
        preset=member if pt else None,
        init=None if pt else str(previous),
        out=str(folder),
        resume=True,
        seed=seed,
        **settings,
    )


def _check_configs(
    plan: Recipe, runs: Path, chains: list[tuple[int, str]], order: list[str], overrides: dict[str, Any] | None
) -> None:
    """Make every run's config once before any run trains: a setting the config refuses (a number out of its
    range, an unknown choice) is refused before the first run, naming the run, not after the runs before it."""
    for seed, member in chains:
        for name in order:
            try:
                _run_config(member, seed, plan.runs[name], run_dir(runs, member, seed, name), None, overrides)
            except TrainError as err:
                raise TrainError(f"{plan.source}: run {name!r} of {member} seed {seed}: {err}") from None


def _check_trained(
    plan: Recipe, runs: Path, chains: list[tuple[int, str]], order: list[str], overrides: dict[str, Any] | None,
    profile: str | None,
) -> None:  # fmt: skip
    """Refuse, before any run trains, a grid whose runs already in ``runs`` (finished, or stopped with step
    checkpoints) were trained with other settings than this recipe, profile and overrides ask for
    (:func:`trainer.train_state.training_differences`): a finished run would be kept and a stopped one
    continued as if trained with these, and the grid's manifest would name a recipe its runs did not follow.
    The message names the run, each setting (saved vs now), the recipe and profile the grid was made with,
    and the fix."""
    made = {}
    with contextlib.suppress(OSError, ValueError):
        made = json.loads((runs / MANIFEST_FILE).read_text())
    for seed, member in chains:
        for name in order:
            folder = run_dir(runs, member, seed, name)
            now = _run_config(member, seed, plan.runs[name], folder, None, overrides).to_dict()
            differs = training_differences(saved_training(folder), now)
            if not differs:
                continue
            before = f"recipe {made.get('recipe')}" if made.get("recipe") else "another recipe"
            before += f", profile {made['profile']}" if made.get("profile") else ""
            asked = f"recipe {plan.source}" + (f", profile {profile}" if profile else "")
            that = "that recipe and profile" if made.get("profile") else "that recipe"
            raise TrainError(
                f"{folder} was trained with other settings than {asked} asks (saved vs now: {'; '.join(differs)}); "
                f"the grid in {runs} was made with {before}. Give {that} to continue it, or give the grid another "
                "`out` to train this recipe from scratch"
            )


def _members(scale: str, members: list[str] | None) -> list[str]:
    names = list_presets(scale)
    chosen = names if not members else [m if m.startswith(f"{scale}-") else f"{scale}-{m}" for m in members]
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        raise TrainError(f"unknown members {unknown} for scale {scale}; available: {', '.join(names)}")
    return chosen


def _needed(recipe: Recipe, chosen: list[str] | None) -> list[str]:
    """The runs to do: the chosen ones (default all) and every run they start from, in recipe order."""
    if chosen is None:
        return list(recipe.runs)
    unknown = sorted(set(chosen) - set(recipe.runs))
    if unknown:
        raise TrainError(f"unknown runs {unknown}; the recipe has {', '.join(recipe.runs)}")
    need, todo = set(), list(chosen)
    while todo:
        name = todo.pop()
        if name not in need:
            need.add(name)
            if recipe.runs[name].get("from"):
                todo.append(recipe.runs[name]["from"])
    return [r for r in recipe.runs if r in need]


def _run_chain(
    plan: Recipe, runs: Path, member: str, seed: int, order: list[str], overrides: dict[str, Any] | None,
    run_stage: Callable[[TrainConfig], TrainResult] = train, log: Callable[[str], None] = print,
) -> tuple[list[dict[str, Any]], bool]:  # fmt: skip
    """One member x seed through its runs in order: the finished runs' manifest entries, and whether a
    run was interrupted (then the later runs are not started)."""
    entries = []
    for name in order:
        settings = plan.runs[name]
        folder = run_dir(runs, member, seed, name)
        previous = run_dir(runs, member, seed, settings["from"]) / "final" if settings.get("from") else None
        where = f"{member} seed {seed} {name}"
        if is_finished(folder):
            log(f"{where}: finished earlier, skipping")
        else:
            log(f"{where}: training into {folder}")
            began = time.perf_counter()
            result = run_stage(_run_config(member, seed, settings, folder, previous, overrides))
            if result.interrupted:
                log(f"{where}: interrupted; rerun the same command to continue")
                return entries, True
            loss = "n/a" if result.final_loss is None else f"{result.final_loss:.3f}"
            held = "n/a" if result.eval_loss is None else f"{result.eval_loss:.3f}"
            status = "" if result.status_reason is None else f", {result.status}: {result.status_reason}"
            took = time.perf_counter() - began
            log(f"{where}: done, {result.steps} steps, last loss {loss}, eval loss {held}, {took:.0f} s{status}")
        entries.append(_entry(member, seed, name, settings, folder))
    return entries, False


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Ask every worker of ``pool`` to save and stop (SIGTERM, which the training loop handles)."""
    for process in list((pool._processes or {}).values()):  # the executor exposes its processes no other way
        if process.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)


_STEPS: Any = None  # in a parallel grid's worker: the queue its runs' steps go to (``(run folder, step, total)``)


def _init_worker(steps: Any) -> None:
    global _STEPS
    _STEPS = steps


def _train_reporting(cfg: TrainConfig) -> TrainResult:
    """:func:`trainer.train.train`, each step told to the grid's process (:func:`_relay`)."""
    if _STEPS is None:
        return train(cfg)
    return train(cfg, lambda step, total, _info: _STEPS.put((cfg.out, step, total)))


def _chain_worker(args: tuple) -> tuple[list[dict[str, Any]], bool]:
    """A process of a parallel grid: one chain, logging to its own stdout (flushed: lines show as they come)."""
    return _run_chain(*args, run_stage=_train_reporting, log=lambda message: print(message, flush=True))


def _relay(steps: Any, planned: dict[str, int], on_step: ReportCount) -> None:
    """In the grid's process, while its workers train: one count over every run still to train (``planned``:
    run folder -> its steps), ``on_step(steps done, steps in all, status)`` after each step of any worker, so
    that the phase's progress and ETA cover all chains at once. Ends at a ``None``."""
    done: dict[str, int] = {}
    while (item := steps.get()) is not None:
        folder, step, total = item
        done[folder], planned[folder] = step, total  # the run's own count (a resumed run starts past 0)
        on_step(sum(done.values()), sum(planned.values()), f"{len(planned)} runs, {len(done)} started")


@contextlib.contextmanager
def _step_relay(
    context: Any, plan: Recipe, runs: Path, chains: list[tuple[int, str]], order: list[str],
    overrides: dict[str, Any] | None, on_step: ReportCount | None,
) -> Iterator[Any]:  # fmt: skip
    """The queue a parallel grid's workers tell their steps to, relayed to ``on_step`` as one count over every
    run still to train (:func:`_relay`) until the block ends; ``None`` without ``on_step``."""
    if on_step is None:
        yield None
        return
    planned = {  # the steps of every run still to train (a run given in tokens counts once it starts)
        str(folder): _run_config(member, seed, plan.runs[name], folder, None, overrides).steps or 0
        for seed, member in chains
        for name in order
        if not is_finished(folder := run_dir(runs, member, seed, name))
    }
    steps = context.Queue()
    relay = threading.Thread(target=_relay, args=(steps, planned, on_step), daemon=True)
    relay.start()
    try:
        yield steps
    finally:
        steps.put(None)  # the relay ends, after the last step it was told of
        relay.join(timeout=10)


def _estimated_tokens(settings: dict[str, Any], overrides: dict[str, Any] | None) -> int:
    """A run's size for scheduling: its tokens, or steps x batch x sequence length (1 where not given)."""
    settings = {**settings}
    _replace_length(settings, dict(overrides or {}))
    if settings.get("tokens"):
        return int(settings["tokens"])
    return int(settings.get("steps") or 1) * int(settings.get("batch_size") or 1) * int(settings.get("seq_len") or 1)


def _run_parallel(
    pool: ProcessPoolExecutor, jobs: int, plan: Recipe, runs: Path, chains: list[tuple[int, str]], order: list[str],
    overrides: dict[str, Any] | None, record: Callable[[list[dict[str, Any]]], None],
) -> bool:  # fmt: skip
    """Every run of every chain as its own task on ``pool``'s ``jobs`` processes: a run starts once the run it
    starts ``from`` has finished, and of the runs ready the one with the longest estimated work still ahead in
    its chain goes first (so the long pt runs of all chains start before the short runs that follow them, and
    those fill the processes while the last pt runs train: no process idles while a run could start). Each
    run trains alone in its process, exactly as in one process. Returns whether a run was interrupted (then
    no further run starts; the running ones finish or save)."""
    ahead: dict[str, int] = {}  # a run's tokens plus the longest chain of runs that start from it
    for name in reversed(order):
        later = [ahead[n] for n in order if plan.runs[n].get("from") == name]
        ahead[name] = _estimated_tokens(plan.runs[name], overrides) + max(later, default=0)
    waiting = [(chain, name) for chain in range(len(chains)) for name in order]
    finished: set[tuple[int, str]] = set()
    running: dict[Future, tuple[int, str]] = {}
    interrupted = False
    while running or (waiting and not interrupted):
        ready = [t for t in waiting if plan.runs[t[1]].get("from") in (None, *[n for c, n in finished if c == t[0]])]
        ready.sort(key=lambda t: (-ahead[t[1]], t[0], order.index(t[1])))
        for chain, name in ready[: 0 if interrupted else jobs - len(running)]:
            seed, member = chains[chain]
            waiting.remove((chain, name))
            running[pool.submit(_chain_worker, (plan, runs, member, seed, [name], overrides))] = (chain, name)
        done, _ = wait(running, return_when=FIRST_COMPLETED)
        for future in done:
            task = running.pop(future)
            entries, stopped = future.result()
            record(entries)
            interrupted |= stopped
            if not stopped:
                finished.add(task)
    return interrupted


def run_grid(
    recipe: str | Path | Recipe,
    runs: str | Path,
    members: list[str] | None = None,
    stages: list[str] | None = None,
    seeds: list[int] | None = None,
    profile: str | None = None,
    overrides: dict[str, Any] | None = None,
    run_stage: Callable[[TrainConfig], TrainResult] = train,
    log: Callable[[str], None] = print,
    jobs: int = 1,
    on_step: ReportCount | None = None,
) -> dict[str, Any]:
    """Run (or continue) the grid; returns the manifest (with ``"interrupted": True`` when a run was).

    ``stages`` names runs of the recipe (their ``from`` runs are done first); ``seeds`` replaces the
    recipe's; ``overrides`` apply to every run. ``jobs`` > 1 trains that many runs at once, each in its
    own process, a run as soon as the run it starts from is finished (:func:`_run_parallel`; CPU grids:
    give each run ``threads``; ``run_stage`` is then
    :func:`trainer.train.train`, and ``on_step(done, total, status)`` follows the steps of all chains as one
    count, besides the processes' log lines). Under ``torchrun`` every
    process walks the same plan (each run is a collective training run); only the main process logs and
    writes the manifest.
    """
    plan = recipe if isinstance(recipe, Recipe) else Recipe.load(recipe, profile)
    runs = Path(runs)
    main = int(os.environ.get("RANK", "0")) == 0
    if not main:
        log = lambda _msg: None  # noqa: E731
    chosen, order = _members(plan.scale, members), _needed(plan, stages)
    chains = [(seed, member) for seed in (seeds if seeds is not None else plan.seeds) for member in chosen]
    _check_configs(plan, runs, chains, order, overrides)
    _check_trained(plan, runs, chains, order, overrides, profile)
    manifest_path = runs / MANIFEST_FILE
    manifest: dict[str, Any] = {"recipe": plan.source, "scale": plan.scale, "profile": profile, "runs": []}
    claim(runs, GRID, fix="give the grid another `out`")  # a new folder, or this grid's to continue
    if manifest_path.is_file():
        manifest["runs"] = json.loads(manifest_path.read_text()).get("runs", [])
    elif main:  # the folder is known as a grid from its first run on, even if that run is stopped
        atomic_write_text(manifest_path, json.dumps(manifest, indent=2) + "\n")

    def _place(entry: dict[str, Any]) -> tuple[int, int, int]:  # chain order, then recipe order; others last
        chain = (entry["seed"], entry["member"])
        known = chain in chains and entry["run"] in order
        return (0, chains.index(chain), order.index(entry["run"])) if known else (1, 0, 0)

    def record(entries: list[dict[str, Any]]) -> None:
        done = {(e["member"], e["seed"], e["run"]) for e in entries}
        kept = [r for r in manifest["runs"] if (r["member"], r["seed"], r["run"]) not in done]
        manifest["runs"] = sorted(kept + entries, key=_place)  # the same order however the runs were scheduled
        if main:
            atomic_write_text(manifest_path, json.dumps(manifest, indent=2) + "\n")

    interrupted = False
    if jobs > 1 and len(chains) > 1:
        context = multiprocessing.get_context("spawn")
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the workers save and stop on Ctrl-C
        try:
            with (
                _step_relay(context, plan, runs, chains, order, overrides, on_step) as steps,
                ProcessPoolExecutor(jobs, mp_context=context, initializer=_init_worker, initargs=(steps,)) as pool,
            ):
                CLEANUPS[id(pool)] = lambda: _stop_workers(pool)  # even if this process is ended outright
                try:
                    interrupted = _run_parallel(pool, jobs, plan, runs, chains, order, overrides, record)
                except KeyboardInterrupt:  # a SIGTERM to this process alone reaches no worker: pass it on
                    _stop_workers(pool)
                    pool.shutdown(wait=True, cancel_futures=True)  # they save and stop; no new run starts
                    raise
                finally:
                    CLEANUPS.pop(id(pool), None)
        finally:
            signal.signal(signal.SIGINT, previous)
    else:
        for seed, member in chains:
            entries, interrupted = _run_chain(plan, runs, member, seed, order, overrides, run_stage, log)
            record(entries)
            if interrupted:
                break
    return {**manifest, "interrupted": True} if interrupted else manifest


def _entry(member: str, seed: int, name: str, settings: dict[str, Any], folder: Path) -> dict[str, Any]:
    result = json.loads((folder / RESULT_FILE).read_text())
    return {
        "member": member,
        "seed": seed,
        "run": name,
        "stage": settings["stage"],
        "from": settings.get("from"),
        "freeze": settings.get("freeze"),
        "checkpoint": str(folder / "final"),
        "tokens": result["tokens"],
        "steps": result["steps"],
        "final_loss": result["final_loss"],
        # a result.json written before runs had a status and evaluation losses: missing (the study measures them)
        **{key: result.get(key) for key in RESULT_COLUMNS},
    }
