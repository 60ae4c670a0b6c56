"""Hardening, third round (issue 37): every number a command takes has its range declared with it and checked
by one rule before any work (``headprobe train --lr -1`` ended in torch's ValueError traceback; counts were
checked, floats were not). Each refusal is one ``error:`` line naming the flag, what it allows and what it
got, exit code 2, and nothing is written."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from pathlib import Path

import click
import pytest
import typer.main
from cli_checks import invoke, refused

from headprobe.ablation.settings import AblateSettings
from headprobe.analysis.settings import AnalyzeError, AnalyzeSettings
from headprobe.cli import app
from headprobe.core.settings import Range, check_ranges
from headprobe.evals.ruler.settings import RulerSettings
from headprobe.evals.shortctx.settings import ShortCtxSettings
from headprobe.graft.settings import GraftSettings
from headprobe.study.settings import StudySettings
from headprobe.testing import tiny_checkpoint
from headprobe.text.tasks import TaskSettings
from trainer.config import TrainConfig, TrainError

TRAIN = ["train", "--preset", "toy-d16", "--steps", "2", "--batch-size", "2", "--seq-len", "64", "--no-progress"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("ck") / "tiny", vocab_size=264, max_seq_len=1024)


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--lr", "-1", "--lr: give a value above 0, got -1.0"),
        ("--lr", "0", "--lr: give a value above 0, got 0.0"),
        ("--min-lr-ratio", "1.5", "--min-lr-ratio: give a value from 0 to 1, got 1.5"),
        ("--warmup-steps", "-1", "--warmup-steps: give at least 0, got -1"),
        ("--decay-fraction", "-0.1", "--decay-fraction: give a value from 0 to 1, got -0.1"),
        ("--weight-decay", "-0.01", "--weight-decay: give at least 0, got -0.01"),
        ("--beta1", "1", "--beta1: give a value of at least 0 and below 1, got 1.0"),
        ("--beta2", "-0.5", "--beta2: give a value of at least 0 and below 1, got -0.5"),
        ("--grad-clip", "-1", "--grad-clip: give at least 0, got -1.0"),
        ("--rope-theta-full", "0", "--rope-theta-full: give a value above 0, got 0.0"),
        ("--peak-flops", "-5e12", "--peak-flops: give a value above 0, got -5000000000000.0"),
        ("--seed", "-1", "--seed: give at least 0, got -1"),  # numpy's data order refused it with a traceback
        ("--log-every", "0", "--log-every: give at least 1, got 0"),  # a ZeroDivisionError
        ("--keep", "-1", "--keep: give at least 0, got -1"),
        ("--save-every", "-2", "--save-every: give at least 0, got -2"),
        ("--probe-every", "-1", "--probe-every: give at least 0, got -1"),
        ("--threads", "0", "--threads: give at least 1, got 0"),
        ("--batch-size", "0", "--batch-size: give at least 1, got 0"),
        ("--micro-batch-size", "0", "--micro-batch-size: give at least 1, got 0"),
        ("--steps", "0", "--steps: give at least 1, got 0"),
        ("--seq-len", "0", "--seq-len: give at least 1, got 0"),
    ],
)
def test_every_number_of_train_is_refused_outside_its_range_before_any_work(tmp_path, option, value, says):
    out = tmp_path / "run"
    refused(invoke(*TRAIN, "--out", out, option, value), says)
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["analyze", "{ckpt}", "--memory-limit", "0"], "--memory-limit: give a value above 0, got 0.0"),
        (["analyze", "{ckpt}", "--lengths", "8,4096"], "--lengths: give a value from 16 to 16777216, got 8"),
        (["ablate", "{ckpt}", "--heads", "1.0", "--memory-limit", "-1"],
         "--memory-limit: give a value above 0, got -1.0"),
        (["ablate", "{ckpt}", "--heads", "1.0", "--depths", "-5,50"], "--depths: give a value from 0 to 100, got -5.0"),
        (["ablate", "{ckpt}", "--heads", "1.0", "--max-new-tokens", "0"], "--max-new-tokens: give at least 1, got 0"),
        (["ruler", "eval", "{ckpt}", "--memory-limit", "-0.5"], "--memory-limit: give a value above 0, got -0.5"),
        (["explore", "{ckpt}", "--needle", "--length", "256", "--depth", "101", "--export", "{out}/p.html"],
         "--depth: give a value from 0 to 100, got 101.0"),
        (["explore", "{ckpt}", "--needle", "--length", "0", "--export", "{out}/p.html"],
         "--length: give a value from 1 to 16777216, got 0"),
        (["explore", "{ckpt}", "--needle", "--length", "256", "--port", "70000"],
         "--port: give a value from 0 to 65535, got 70000"),
        (["show", "{out}", "--top", "0"], "--top: give at least 1, got 0"),
        (["data", "synth", "--tokens", "100", "--tasks", "recall=1", "--queries", "0", "--out", "{out}/d"],
         "--queries: give at least 1, got 0"),
        (["data", "synth", "--tokens", "100", "--tasks", "recall=1", "--pairs", "0:3", "--out", "{out}/d"],
         "--pairs: give at least 1, got 0"),
    ],
)  # fmt: skip
def test_the_numbers_of_every_command_go_through_the_same_rule(tmp_path, ckpt, args, says):
    out = tmp_path / "out"
    args = [a.format(ckpt=ckpt, out=tmp_path) for a in args]
    if args[0] in ("analyze", "ablate", "ruler"):
        args += ["--out", str(out)]
    refused(invoke(*args), says)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_recipe_with_a_number_out_of_range_is_refused_before_its_first_run(tmp_path):
    """A grid made each run's config only when that run began: a bad cpt setting failed after pt had trained."""
    recipe = tmp_path / "recipe.json"
    pt = {"stage": "pt", "steps": 2, "batch_size": 2, "seq_len": 64}
    recipe.write_text(f'{{"scale": "toy", "seeds": [0], "runs": {{"pt": {pt}, "cpt": {{"from": "pt", "lr": -1}}}}}}'
                      .replace("'", '"'))  # fmt: skip
    runs = tmp_path / "runs"
    refused(invoke("train", "grid", "--recipe", recipe, "--members", "d16", "--out", runs),
            "run 'cpt' of toy-d16 seed 0: lr: give a value above 0, got -1")  # fmt: skip
    assert not runs.exists()


def test_the_library_applies_the_same_rule(tmp_path):
    with pytest.raises(TrainError, match=r"`beta2`: give a value of at least 0 and below 1, got 1.5"):
        TrainConfig(out=str(tmp_path), beta2=1.5)
    with pytest.raises(AnalyzeError, match=r"`topk`: give at least 1, got 0"):
        AnalyzeSettings(topk=0).validate()
    with pytest.raises(ValueError, match=r"`x`: give a value above 0, got -2"):

        @dataclasses.dataclass
        class Made:
            x: int = dataclasses.field(default=-2, metadata={"range": Range(above=0)})

        check_ranges(Made(), ValueError)
    assert Range(minimum=0, below=1).refusal([0.0, 0.5]) is None and Range(above=0).refusal(None) is None


# every number of every settings dataclass that drives a command declares its range; a seed may be any integer
# (Python's and torch's generators take negative seeds; training's data order, numpy's, does not: it declares one)
SETTINGS = [TrainConfig, AnalyzeSettings, RulerSettings, AblateSettings, GraftSettings, StudySettings, ShortCtxSettings,
            TaskSettings]  # fmt: skip
FREE = {"seed", "seeds"}


def _numeric(annotation: typing.Any) -> bool:
    """Whether a type is a number, a number or None, or a list or tuple of numbers."""
    args = typing.get_args(annotation)
    if annotation in (int, float):
        return True
    return bool(args) and all(_numeric(a) or a is type(None) or a is Ellipsis for a in args)


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: s.__name__)
def test_every_number_of_the_settings_declares_its_range(settings):
    hints = typing.get_type_hints(settings)
    unbounded = [
        f.name
        for f in dataclasses.fields(settings)
        if _numeric(hints[f.name]) and f.name not in FREE and f.metadata.get("range") is None
    ]
    assert unbounded == [], f"{settings.__name__}: numbers without a declared range: {unbounded}"


# options each command hands to a settings dataclass, which checks them (by the one rule) as it is made
CHECKED_BY = {
    "train": TrainConfig,
    "analyze": AnalyzeSettings,
    "ruler eval": RulerSettings,
    "ruler generate": RulerSettings,
    "ablate": AblateSettings,
    "graft": GraftSettings,
    "shortctx eval": ShortCtxSettings,
    "data synth": TaskSettings,
}
# the explorer's page settings, checked by headprobe.explore.export.ExportSettings.validate
ELSEWHERE = {("explore", "export_levels"), ("explore", "export_max_mib")}


def _commands(command: click.Command, path: tuple[str, ...] = ()):
    if command.callback is not None:
        yield " ".join(path), command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def test_every_number_of_every_command_declares_its_range():
    """Options are checked by the range their annotation declares (``Annotated[int, typer.Option(...),
    Range(minimum=1)]``) or by the settings dataclass they go to; none is left unchecked."""
    unchecked = []
    for name, command in _commands(typer.main.get_command(app)):
        if not name:
            continue
        fields = {f.name: f for f in dataclasses.fields(CHECKED_BY[name])} if name in CHECKED_BY else {}
        for param in inspect.signature(command.callback, eval_str=True).parameters.values():
            annotation = param.annotation
            bounds = [m for m in getattr(annotation, "__metadata__", ()) if isinstance(m, Range)]
            base = typing.get_args(annotation)[0] if bounds or hasattr(annotation, "__metadata__") else annotation
            if not _numeric(base) or param.name in FREE or bounds or (name, param.name) in ELSEWHERE:
                continue
            if param.name not in fields or fields[param.name].metadata.get("range") is None:
                unchecked.append(f"{name} --{param.name.replace('_', '-')}")
    assert unchecked == [], f"numeric options without a declared range: {unchecked}"
