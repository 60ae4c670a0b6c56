"""Settings declared once (issues 30, 39): ``headprobe analyze``, ``ablate``, ``ruler eval``, ``ruler generate``
(the settings that make samples) and ``shortctx eval`` take their options, defaults and help from the settings
dataclasses the library takes, so a command line without options gives exactly the library's default settings."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click
import pytest
import typer
from cli_checks import invoke, refused

from headprobe.ablation.settings import AblateSettings
from headprobe.analysis.settings import METRIC_NAMES, AnalyzeSettings
from headprobe.cli import app
from headprobe.cli.common import flagify, settings_from
from headprobe.cli.ruler import GENERATE_SETTINGS
from headprobe.evals.ruler.settings import RulerSettings
from headprobe.evals.shortctx.settings import ShortCtxSettings
from headprobe.graft.settings import GraftSettings

GRAFT_OPTIONS = tuple(f.name for f in dataclasses.fields(GraftSettings) if f.name != "donor")


def _command(*path: str) -> click.Command:
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    return command


@pytest.mark.parametrize(
    "path, settings, names",
    [
        (("analyze",), AnalyzeSettings, None),
        (("ruler", "eval"), RulerSettings, None),
        (("ruler", "generate"), RulerSettings, GENERATE_SETTINGS),  # the settings that make samples
        (("ablate",), AblateSettings, None),
        (("shortctx", "eval"), ShortCtxSettings, None),
        (("graft",), GraftSettings, GRAFT_OPTIONS),  # the donor is an argument
    ],
)
def test_every_setting_is_an_option_and_no_options_give_the_library_defaults(path, settings, names):
    params = {p.name: p for p in _command(*path).params}
    fields = [f for f in dataclasses.fields(settings) if names is None or f.name in names]
    assert names is None or {f.name for f in fields} == set(names)
    left_out = {f.name for f in dataclasses.fields(settings)} - {f.name for f in fields}
    options = {name for name, p in params.items() if getattr(p, "param_type_name", "") == "option"}
    assert not left_out & options, sorted(left_out & options)  # a selection: the other fields are no options
    assert {f.name for f in fields} <= set(params), sorted({f.name for f in fields} - set(params))
    flags = {name: p.opts[0] for name, p in params.items() if getattr(p, "param_type_name", "") == "option"}
    for f in fields:  # the field's help, settings named in backticks shown as the command's flags
        assert params[f.name].help == flagify(f.metadata["help"], flags), f.name
    given = {f.name: params[f.name].default for f in fields}
    assert settings_from(settings, given) == settings()


def test_list_settings_are_read_from_their_text_forms():
    given = {"metrics": "entropy,erank", "lengths": "1k,2048", "haystack_files": ("a.txt", "b.txt"), "rows": "last:8"}
    s = settings_from(AnalyzeSettings, given)
    assert s.metrics == ["entropy", "erank"] and s.lengths == [1024, 2048] and s.haystack_files == ["a.txt", "b.txt"]
    assert s.rows == "last:8" and s.row_selection.n == 8
    with pytest.raises(typer.BadParameter, match="--lengths"):
        settings_from(AnalyzeSettings, {"lengths": "4096,lots"})


def test_ablate_s_lists_are_read_from_their_text_forms():
    given = {"heads": ["top:4", "17.3,18.7"], "from_results": Path("runs/a/"), "modes": "zero,mean"}
    given |= {"seeds": "3, 4,", "tasks": "needle,niah_single_1", "lengths": "1536,2k", "depths": "0,12.5,100"}
    s = settings_from(AblateSettings, given)
    assert s.heads == ["top:4", "17.3,18.7"] and s.from_results == "runs/a" and s.modes == ["zero", "mean"]
    assert s.seeds == [3, 4] and s.tasks == ["needle", "niah_single_1"] and s.lengths == [1536, 2048]
    assert s.depths == [0.0, 12.5, 100.0] and all(isinstance(d, float) for d in s.depths)
    for flag, text, why in [
        ("seeds", "0,x", r"--seeds '0,x': 'x' is not an integer; write a comma list, e.g. 0,1,2"),
        ("seeds", "0,1.5", r"--seeds '0,1.5': '1.5' is not an integer"),
        ("depths", "0,half", r"--depths '0,half': 'half' is not a number; write a comma list, e.g. 0,25,50,75,100"),
        ("lengths", "2k,lots", r"--lengths '2k,lots': 'lots' is not a positive token count"),
    ]:
        with pytest.raises(typer.BadParameter, match=f"^{why}"):
            settings_from(AblateSettings, {flag: text})


@pytest.mark.parametrize("args", [["--seeds", "0,x"], ["--depths", "0,half"], ["--lengths", "2k,lots"]])
def test_a_malformed_list_of_ablate_is_one_line_naming_its_flag(tmp_path, args):
    refused(invoke("ablate", tmp_path, *args, "--out", tmp_path / "out"), f"{args[0]} '{args[1]}': ")


def test_the_metric_names_known_without_torch_are_the_registry_s():
    from headprobe.metrics import METRICS

    assert list(METRIC_NAMES) == list(METRICS)
