"""Where a command may write: the one rule for everything headprobe writes.

A command names its target (a folder or a file), what it writes there (an :class:`Output`) and the paths
it reads; :func:`claim` looks at what the target holds (:func:`found_at`) and refuses, before any work,
whatever would lose data:

* **Never an input.** A target that is an input, holds one, or lies inside one is refused, ``overwrite``
  or not: ``train export RUN/step_6 RUN`` would replace the run it reads, ``export hf par/final par
  --overwrite`` the checkpoint it exports. Only a page or figures may sit inside the results they show
  (:attr:`Output.nests`), as new files or their own earlier ones, never over one of the results.
* **Nothing but its own kind.** A target is written when it is missing or empty, or holds what this
  command writes: a command that adds to its output (a results folder, a training run, a grid, a study,
  a figures folder) adds there, and its own checks decide what a rerun may change; a command that
  replaces its output (a checkpoint, a Hugging Face export, a data folder, a sample file) replaces only
  with ``overwrite``; a page (a report, an explorer page) is made anew over headprobe's own page.
* **A file it did not write** (notes, a stray file where a folder goes, a link) is replaced only with
  ``overwrite``; a link is replaced as a link, never what it points to.
* **Anything else** (another command's results, a checkpoint where results go, a training run, a folder
  of other files) is refused even with ``overwrite``: ``overwrite`` replaces the command's own kind of
  output, never something else that happens to sit at that path.

Every refusal is one :class:`OutputRefused` naming the target, what it holds and the fix. What a folder
holds is read from the files each kind always has (module constants below), never from its name.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from headprobe.core.atomic import is_leftover
from headprobe.core.errors import HeadprobeError
from headprobe.core.steps import is_step_folder

RUN_FILE = "run.json"  # a results folder's record: {"job": "analyze", ...} (headprobe.jobs.record)
# the files each kind always has, named here once (headprobe.model.checkpoint, the trainer and export use these)
CONFIG_FILE = "config.json"  # a checkpoint's config; a Hugging Face folder's too
WEIGHTS_FILE = "model.safetensors"  # a checkpoint's weights
RUN_FILES = ("train_config.json", "metrics.jsonl", "result.json")  # a training run's records (trainer.train)
MANIFEST_FILE = "manifest.json"  # a data folder's ("shards") or a training grid's ("runs") manifest
PAGE_MARK = '<meta name="generator" content="headprobe'  # in the head of every page headprobe writes
FIGURES_FILE = "figures.json"  # a figures folder's index of what it holds, and of which results (figures.draw)
EXPORT_KEY = "headprobe"  # in the config.json of a Hugging Face folder exported from one of ours (export.hf)
# what a folder of each replaceable kind consists of: anything else in it is someone's, and keeps it from
# being replaced (names, or name prefixes ending in "*")
KIND_FILES = {
    "checkpoint": ("config.json", "model.safetensors", "tokenizer.json"),
    "hf_model": ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json", "configuration_headshape.py",
                 "modeling_headshape.py"),
    "data": ("manifest.json", "shard_*"),
}  # fmt: skip
CONTAINERS = ("study", "real-demo")  # results that hold other kinds of output (a grid, exports) by design

Kind = Literal[
    "nothing", "checkpoint", "hf_model", "hf_other", "step", "run", "grid", "data", "results", "page", "figures",
    "gguf", "file", "link", "folder",
]  # fmt: skip
Mode = Literal["add", "replace", "renew"]


class OutputRefused(HeadprobeError, FileExistsError):
    """A command's target would lose data: it is or holds an input, or holds something this command did not
    write. The message names the target, what it holds and the fix (settings in backticks)."""


@dataclass(frozen=True)
class Found:
    """What a path holds. ``kind`` (:data:`Kind`), ``words`` (how a message names it: "a headprobe
    checkpoint"), and for results folders the ``job`` that wrote them (``analyze``, ``ruler eval``, ...)."""

    kind: Kind
    words: str
    job: str | None = None

    @property
    def empty(self) -> bool:
        return self.kind == "nothing"


@dataclass(frozen=True)
class Output:
    """What a command writes at its target.

    Attributes:
        kind: the :class:`Found` kind its output is once written.
        words: how a message names it ("a checkpoint", "the results of `headprobe analyze`").
        mode: ``add`` (reruns add to it: results, runs, grids, studies, figures), ``replace`` (an existing
            one is replaced with ``overwrite`` only) or ``renew`` (a page, made anew over its own kind).
        job: the command, for results folders (:data:`RUN_FILE`'s ``job``).
        nests: may lie inside an input as a new file or its own kind (a report page or figures inside the
            results folder they show); other outputs never lie inside what they read.
    """

    kind: Kind
    words: str
    mode: Mode
    job: str | None = None
    nests: bool = False

    def owns(self, found: Found) -> bool:
        """Whether ``found`` is this command's own kind of output (results: of the same job)."""
        return found.kind == self.kind and (self.job is None or found.job == self.job)


CHECKPOINT = Output("checkpoint", "a checkpoint", "replace")
HF_MODEL = Output("hf_model", "a Hugging Face export of a headprobe checkpoint", "replace")
DATA = Output("data", "a data folder", "replace")
SAMPLES = Output("file", "a sample file", "replace")
PAGE = Output("page", "a page", "renew", nests=True)
FIGURES = Output("figures", "a figures folder", "add", nests=True)
RUN = Output("run", "a training run", "add")
GRID = Output("grid", "a training grid", "add")


COMMANDS = {"real-demo": "demo --real"}  # the command of a job not named as its command


def command_of(job: str) -> str:
    """The command that runs ``job``, as messages name it: ``headprobe analyze``, ``headprobe demo --real``."""
    return f"headprobe {COMMANDS.get(job, job)}"


def job_results(job: str) -> Output:
    """The results folder of ``job`` (``analyze``, ``ruler eval``, ``shortctx eval``, ``ablate``, ``study``,
    ``real-demo``): its :data:`RUN_FILE` names the job."""
    return Output("results", f"the results of `{command_of(job)}`", "add", job)


# ---------------------------------------------------------------------------------------------
# What a path holds
# ---------------------------------------------------------------------------------------------
def _json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _entries(folder: Path) -> list[Path]:
    """``folder``'s entries, without a run's lock or a killed writer's temporaries."""
    return sorted(p for p in folder.iterdir() if not is_leftover(p.name))


def _is_page(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return PAGE_MARK.encode() in head


def _folder(path: Path) -> Found:
    entries = _entries(path)
    if not entries:
        return Found("nothing", "an empty folder")
    names = {p.name for p in entries}
    record = _json(path / RUN_FILE) if RUN_FILE in names else None
    if isinstance(record, dict) and isinstance(record.get("job"), str):
        return Found("results", f"the results of `{command_of(record['job'])}`", record["job"])
    if RUN_FILE in names:
        return Found("results", f"a results folder whose record {RUN_FILE} cannot be read (restore it, or delete it to "
                     "let the command that wrote the folder write it again)")  # fmt: skip
    if is_step_folder(path):
        return Found("step", "a training step folder")
    if CONFIG_FILE in names:
        config = _json(path / CONFIG_FILE)
        if isinstance(config, dict) and EXPORT_KEY in config and "model_type" in config:
            return Found("hf_model", "a Hugging Face export of a headprobe checkpoint")
        if isinstance(config, dict) and "model_type" in config:
            return Found("hf_other", "a Hugging Face model folder headprobe did not write")
        if WEIGHTS_FILE in names:
            return Found("checkpoint", "a headprobe checkpoint")
    if names & set(RUN_FILES):  # train_config.json is written before the first step
        return Found("run", "a training run")
    if MANIFEST_FILE in names:
        manifest = _json(path / MANIFEST_FILE)
        if isinstance(manifest, dict) and "runs" in manifest:
            return Found("grid", "a training grid")
        if isinstance(manifest, dict) and "shards" in manifest:
            return Found("data", "a data folder")
    if (path / "runs" / MANIFEST_FILE).is_file() or (path / "tables" / "study_runs.parquet").is_file():
        return Found("results", "the results of `headprobe study`", "study")  # written before studies had a record
    if FIGURES_FILE in names:
        return Found("figures", "a folder of figures and tables")
    shown = ", ".join(p.name + ("/" if p.is_dir() else "") for p in entries[:4])
    more = f" and {len(entries) - 4} more" if len(entries) > 4 else ""
    return Found("folder", f"a folder of other files ({shown}{more})")


def found_at(path: str | Path) -> Found:
    """What ``path`` holds (see :data:`Kind`); a link is named as a link to what it points to."""
    path = Path(path)
    if path.is_symlink():
        inner = found_at(path.resolve()) if path.exists() else Found("nothing", "nothing")
        return Found("link", f"a link to {inner.words}" if path.exists() else "a broken link")
    if path.is_dir():
        return _folder(path)
    if path.is_file():
        if path.suffix == ".gguf":
            return Found("gguf", "a GGUF model file")
        if _is_page(path):
            return Found("page", "a page headprobe wrote")
        return Found("file", "a file")
    if path.exists():
        return Found("file", "a special file")
    return Found("nothing", "nothing")


# ---------------------------------------------------------------------------------------------
# The rule
# ---------------------------------------------------------------------------------------------
def input_conflict(target: Path, output: Output, inputs: Iterable[str | Path]) -> str | None:
    """How ``target`` collides with an input: it is one, holds one, or lies inside one where ``output`` may
    not (:attr:`Output.nests`); in words, ``None`` when it does not."""
    where = target.expanduser().resolve()
    for given in inputs:
        source = Path(given).expanduser().resolve()
        if where == source:
            return f"is the input {given} itself (writing it would replace what this command reads)"
        if where in source.parents:
            return f"holds the input {given} (writing it would replace what this command reads)"
        if source in where.parents and not output.nests:
            return f"lies inside the input {given} (a command never writes into what it reads)"
    return None


def _inside(target: Path, inputs: Iterable[str | Path]) -> str | None:
    """The input ``target`` lies inside, as given; ``None`` when none."""
    where = target.expanduser().resolve()
    return next((str(g) for g in inputs if Path(g).expanduser().resolve() in where.parents), None)


def _holder(target: Path) -> tuple[Path, Found] | None:
    """The nearest folder above ``target`` that is a kind of headprobe's (a checkpoint, a run, results ...),
    with what it is; ``None`` when there is none."""
    for parent in target.expanduser().absolute().parents:
        found = found_at(parent)
        if found.kind not in ("nothing", "folder", "figures", "file", "link"):
            return parent, found
    return None


def _extras(target: Path, found: Found) -> list[str]:
    """The entries of the folder ``target`` that its kind (:data:`KIND_FILES`) does not consist of."""
    own = KIND_FILES.get(found.kind)
    if own is None or not target.is_dir():
        return []
    names = [p.name + ("/" if p.is_dir() else "") for p in _entries(target)]
    return [n for n in names if not any(n == o or (o.endswith("*") and n.startswith(o[:-1])) for o in own)]


def _part_of(target: Path, name: str, fix: str) -> None:
    """Refuse replacing ``target`` when it is part of a checkpoint, a run, results ... (other than a study's
    or a demo's folder, which hold other kinds of output by design)."""
    held = _holder(target)
    if held is not None and held[1].job not in CONTAINERS:
        raise OutputRefused(f"{name} is part of {held[1].words} ({held[0]}), which this command does not write; {fix}")


def claim(
    target: str | Path,
    output: Output,
    *,
    inputs: Iterable[str | Path] = (),
    overwrite: bool = False,
    option: str = "out",
    fix: str | None = None,
) -> Found:
    """Check, before any work, that ``output`` may be written at ``target`` (module docstring), reading
    ``inputs``; return what the target holds now (``empty`` when nothing: a fresh start). Raises
    :class:`OutputRefused` naming the setting ``option`` (shown as its flag) and the fix; ``fix`` replaces
    the generic "give another `option`"."""
    target = Path(target)
    name = f"`{option}` {target}"
    fix = fix or f"give another `{option}`"
    if why := input_conflict(target, output, inputs):
        raise OutputRefused(f"{name} {why}; {fix}")
    found = found_at(target)
    if found.empty:
        return found
    if found.kind == "link" and output.mode != "add":
        if overwrite:
            return found  # replaced as a link; what it points to is left alone
        raise OutputRefused(f"{name} is {found.words}; {fix}, or `overwrite` to replace the link (not its target)")
    if output.owns(found) or (found.kind == "link" and output.owns(found_at(target.resolve()))):
        if output.mode == "replace":
            if extras := _extras(target, found):
                shown = ", ".join(extras[:4]) + (f" and {len(extras) - 4} more" if len(extras) > 4 else "")
                raise OutputRefused(
                    f"{name} is {found.words} that also holds {shown}, which replacing it would delete; move them "
                    f"out first, or {fix}"
                )
            _part_of(target, name, fix)
            if not overwrite:
                raise OutputRefused(f"{name} exists ({found.words}); {fix}, or add `overwrite` to replace it")
        return found
    if found.kind in ("file", "page", "link") and not target.is_dir():
        if output.mode != "add" and (inside := _inside(target, inputs)):  # a page beside results, never over one
            raise OutputRefused(
                f"{name} is {found.words} inside the input {inside}, part of what this command reads; {fix}"
            )
        if output.mode != "add":
            _part_of(target, name, fix)  # a file of a checkpoint, a run, results ... is never replaced
        if overwrite and output.mode != "add":
            return found
        if output.mode == "add":
            raise OutputRefused(f"{name} is {found.words}, not a folder; {fix} (a folder: it is created when missing)")
        raise OutputRefused(f"{name} is {found.words} headprobe did not write; {fix}, or add `overwrite` to replace it")
    never = "" if output.mode == "add" else f" (`overwrite` replaces only {output.words}, never anything else)"
    raise OutputRefused(f"{name} holds {found.words}, not {output.words}; {fix}{never}")
