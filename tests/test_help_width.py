"""``--help`` of every command at 80 columns (issue 28): every option name and every default in full, no line
wider than the terminal, no ``<bool>`` on flags. The commands are read from the click command tree, so a new
command or subcommand is checked without a word here."""

from __future__ import annotations

import inspect
import re
from enum import Enum

import pytest
import typer.main
from typer.testing import CliRunner

from headprobe.cli import app
from headprobe.cli.common import plain_help, usage_arguments

WIDTH = 80


def _commands(command, path=()):
    """``(path, command)`` for ``command`` and everything under it, ``path`` the words that name it."""
    yield path, command
    for name, sub in (getattr(command, "commands", None) or {}).items():
        yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(typer.main.get_command(app)))


def _nospace(text: str) -> str:
    """``text`` without any whitespace: a wrapped line may break between words or at a hyphen."""
    return "".join(text.split())


def _shown_default(param, ctx) -> str | None:
    """The default ``param`` declares to show, in typer's words (``None``: it shows none)."""
    if isinstance(param.show_default, str):
        return f"({param.show_default})"
    if not (param.show_default or ctx.show_default):
        return None
    value = param.get_default(ctx, call=False)
    if value is None:
        return None
    if getattr(param, "is_bool_flag", False):
        if param.secondary_opts:  # --x / --no-x: the one that is on by default
            return (param.opts if value else param.secondary_opts)[0].lstrip("-")
        return str(value) if value else None
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v.value if isinstance(v, Enum) else v) for v in value) or None
    if isinstance(value, Enum):
        return str(value.value)
    if callable(value):
        return "(dynamic)"
    return str(value) or None


def _summary(command) -> str:
    """What a group lists for ``command``: its short help, or its help's first paragraph, markup plain."""
    text = command.short_help or inspect.cleandoc(command.help or "").partition("\f")[0].split("\n\n")[0]
    return plain_help(text.replace("\b", ""))


@pytest.mark.parametrize("path, command", COMMANDS, ids=[" ".join(p) or "headprobe" for p, _ in COMMANDS])
def test_help_fits_80_columns_in_full(path, command):
    res = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH)})
    assert res.exit_code == 0, res.output
    text = res.output
    wide = [line for line in text.splitlines() if len(line) > WIDTH]
    assert not wide, "\n".join(wide)
    assert "…" not in text, text
    assert "<bool>" not in text, text
    whole = _nospace(text)
    ctx = command.context_class(command, info_name=path[-1] if path else "headprobe")
    for param in command.get_params(ctx):
        if param.param_type_name != "option" or getattr(param, "hidden", False):
            continue
        for name in (*param.opts, *param.secondary_opts):
            if name.startswith("--"):
                assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text), (name, text)
        default = _shown_default(param, ctx)
        if default:
            said = f"[default:{_nospace(default)}"
            assert f"{said}]" in whole or f"{said};" in whole, (param.name, default, text)
    for name, sub in (getattr(command, "commands", None) or {}).items():
        if not sub.hidden:
            assert _nospace(f"{name}{_summary(sub)}") in whole, (name, text)


GROUPS = [(p, c) for p, c in COMMANDS if getattr(c, "commands", None) and c.no_args_is_help]


@pytest.mark.parametrize("path, command", GROUPS, ids=[" ".join(p) or "headprobe" for p, _ in GROUPS])
def test_a_group_without_a_command_shows_its_help(path, command):
    """As before: the help on stdout, exit code 2."""
    res = CliRunner().invoke(app, list(path), env={"COLUMNS": str(WIDTH)})
    assert res.exit_code == 2, res.output
    shown = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH)}).stdout
    assert "Usage:" in res.stdout and res.stdout.strip() == shown.strip(), res.output


@pytest.mark.parametrize("path, command", COMMANDS, ids=[" ".join(p) or "headprobe" for p, _ in COMMANDS])
def test_help_is_plain_text_with_readable_usage(path, command):
    """Docstrings' reST markup shows plain (``x`` as `x`), and arguments read as click names them, in
    capitals (CHECKPOINTS...), in the usage line and the Arguments section (typer writes {checkpoints}...)."""
    text = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "300"}).output
    assert "``" not in text and not re.search(r":(func|class|mod|meth|attr):`", text), text
    usage = text.splitlines()[0]
    assert usage.startswith("Usage: ") and "{" not in usage, usage
    ctx = command.context_class(command, info_name=path[-1] if path else "headprobe")
    for param in command.get_params(ctx):
        if param.param_type_name == "argument":
            assert re.search(rf"(?<![\w-]){param.name.upper()}\b", usage), (param.name, usage)
            assert re.search(rf"^  {param.name.upper()}\b", text, re.M), (param.name, text)


def test_help_markup_and_usage_are_rewritten():
    """What the two rules above hold, on text where they could fail."""
    assert plain_help("Tables ``ablation`` and :func:`headprobe.ablate`; `--from`") == (
        "Tables `ablation` and `headprobe.ablate`; `--from`"
    )
    assert (
        usage_arguments("[OPTIONS] {checkpoints}... {step_folder} {a|b}")
        == "[OPTIONS] CHECKPOINTS... STEP_FOLDER {a|b}"
    )
