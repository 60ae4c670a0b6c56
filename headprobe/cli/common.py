"""What every command shares: error display (library setting names shown as flags: :func:`refused` decides
which errors a command shows as one line, :class:`headprobe.cli._Context` shows them, :func:`fail` refuses
in a command's own words), option parsing, a console that keeps wide tables wide."""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import typing
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from headprobe.core.errors import HeadprobeError
from headprobe.core.settings import MAX_TOKENS, Range

# what a command shows as one line with its fix (exit code 2); any other exception is a bug, with its traceback.
# typer.BadParameter: a command's own check of an option's text (a malformed list); click's parser shows those
# it raises itself with the usage panel, before any command runs
USER_ERRORS = (
    HeadprobeError,
    FileNotFoundError,
    NotADirectoryError,
    IsADirectoryError,
    PermissionError,
    typer.BadParameter,
)


@dataclass
class Session:
    """What one ``headprobe`` process knows besides its options. The command owns it (``app.session``) and
    hands it to each command as ``ctx.obj``.

    Attributes:
        debug: ``--debug``: an error shows its traceback instead of one line.
        interrupted: a Ctrl-C or SIGTERM stopped the command: whatever it breaks on the way out is no bug, and
            it ends with exit code 130 and :func:`say_interrupted`'s line.
        kept: what the command keeps when it is stopped, asked once it has unwound: a sentence ("the
            finished work is kept in OUT"), or ``None`` for nothing (:func:`on_interrupt` sets it).
        resume: how to go on from what was kept.
        ended: the exit code of a command that has ended (a signal then ends the process at once).
        user_errors: the exceptions shown as one line with exit code 2 (:func:`refused`): :data:`USER_ERRORS`,
            and those a plugin declares as bad input (the trainer's ``errors``).
    """

    debug: bool = False
    interrupted: bool = False
    kept: Callable[[], str | None] = lambda: None
    resume: str = ""
    ended: int | None = None
    user_errors: tuple[type[Exception], ...] = USER_ERRORS


_SETTING = re.compile(r"`([a-z][a-z0-9_]*)`")


def flagify(message: str, flags: dict[str, str]) -> str:
    """Library messages name settings in backticks (`max_new_tokens`); on the command line those that are
    the command's options read as its flags (``flags``: setting name -> flag, e.g. --max-new-tokens)."""
    return _SETTING.sub(lambda m: flags.get(m.group(1), m.group(1)), message)


_LITERAL = re.compile(r"``(.+?)``")
_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_USAGE_ARGUMENT = re.compile(r"\{([a-z][a-z0-9_]*)\}")


def plain_help(text: str) -> str:
    """Help text as a terminal shows it: docstrings' reST markup plain (``x`` and :func:`x` as `x`)."""
    return _LITERAL.sub(r"`\1`", _ROLE.sub(r"`\1`", text))


def usage_arguments(args: str) -> str:
    """A usage line's arguments as click writes them, in capitals (``CHECKPOINTS...``), not as typer's
    ``{checkpoints}...``; click's choices (``{a|b}``) stay."""
    return _USAGE_ARGUMENT.sub(lambda m: m.group(1).upper(), args)


def command_flags(ctx: typer.Context | None) -> dict[str, str]:
    """Setting name -> how the command ``ctx`` runs takes it: an option's flag (``--max-new-tokens``), an
    argument's name in capitals (``OUT``); empty without a command."""
    if ctx is None:
        return {}
    flags = {}
    for p in ctx.command.params:
        kind = getattr(p, "param_type_name", "")
        if p.name and kind == "option":
            flags[p.name] = p.opts[0]
        elif p.name and kind == "argument":
            flags[p.name] = p.name.upper()
    return flags


def say_error(err: Exception | str, ctx: typer.Context | None) -> None:
    """Print ``err`` in red, settings in backticks shown as the flags of ``ctx``'s command."""
    typer.secho(f"error: {flagify(str(err), command_flags(ctx))}", fg=typer.colors.RED, err=True)


RESUME = "rerun the same command to resume"


def say_interrupted(session: Session | None) -> None:
    """The last line of every command that a Ctrl-C or SIGTERM stopped (exit code 130): what it kept and how
    to go on from it, as the command declared (:func:`on_interrupt`), or that nothing was kept."""
    try:
        kept = session.kept() if session is not None else None
    except Exception:  # a look at the disk that failed: claim nothing
        kept = None
    said = f"{kept}; {session.resume or RESUME}" if kept and session else "nothing was kept; rerun the same command"
    print(f"interrupted: {said}", file=sys.stderr, flush=True)


def kept_in(out: Path) -> str | None:
    """What a stopped command that writes into the folder ``out`` kept: its finished work if ``out`` holds
    any file (every file is written whole, under a temporary name first), else nothing (``None``)."""
    return f"the finished work is kept in {out}" if out.is_dir() and any(p.is_file() for p in out.rglob("*")) else None


def on_interrupt(ctx: typer.Context | None, kept: Callable[[], str | None], resume: str = RESUME) -> None:
    """Declare, before its work, what the command ``ctx`` runs keeps when a Ctrl-C or SIGTERM stops it:
    ``kept()``, asked once the command has unwound (a sentence, or ``None`` for nothing), and ``resume``, how
    to go on from it; its last line says both (:func:`say_interrupted`). Without a declaration a stopped
    command says that nothing was kept."""
    session = session_of(ctx)
    if session is not None:
        session.kept, session.resume = kept, resume


def stopped(ctx: typer.Context | None) -> typer.Exit:
    """The end of a command that stopped because of a Ctrl-C or SIGTERM (its work cut short, or a training that
    saved and stopped at the signal): marks its session interrupted and returns the exit (code 130) to raise;
    the command line then says what was kept (:func:`say_interrupted`)."""
    session = session_of(ctx)
    if session is not None:
        session.interrupted = True
    return typer.Exit(130)


def session_of(ctx: typer.Context | None) -> Session | None:
    """The :class:`Session` of the command ``ctx`` runs (``None`` outside the command, e.g. in tests)."""
    session = ctx.find_root().obj if ctx is not None else None
    return session if isinstance(session, Session) else None


def interrupted(ctx: typer.Context | None) -> bool:
    """Whether a Ctrl-C or SIGTERM reached the command ``ctx`` runs (its :class:`Session`)."""
    session = session_of(ctx)
    return session is not None and session.interrupted


def served(ctx: typer.Context | None) -> None:
    """A command that runs until a Ctrl-C or SIGTERM (the explorer's server) ended as it should: that signal
    was its end, not an interrupt (exit code 0)."""
    session = session_of(ctx)
    if session is not None:
        session.interrupted = False


@contextmanager
def resumable(
    out: Path,
    ctx: typer.Context | None = None,
    kept: Callable[[], str | None] | None = None,
    resume: str = RESUME,
) -> Iterator[None]:
    """A block of resumable work writing into ``out``: stopped by Ctrl-C or SIGTERM, it ends the command with
    exit code 130 (:func:`stopped`), whose last line says what was kept (``kept``, by default the finished
    work in ``out``: :func:`kept_in`) and ``resume``. So does a block that an interrupt ended otherwise
    (``ctx``'s session saw it): C code that a KeyboardInterrupt reaches may turn it into another error (a
    half-read checkpoint "could not determine the shape"), which is then no fault of the input."""
    on_interrupt(ctx, kept or (lambda: kept_in(out)), resume)
    try:
        yield
    except KeyboardInterrupt:
        pass
    except Exception:
        if not interrupted(ctx):
            raise
    else:
        if not interrupted(ctx):
            return
    raise stopped(ctx)


def say_warning(message: str, ctx: typer.Context | None) -> None:
    """Print ``message`` in yellow on stderr (settings in backticks shown as flags)."""
    typer.secho(flagify(message, command_flags(ctx)), fg=typer.colors.YELLOW, err=True)


def refused(err: BaseException, session: Session | None) -> bool:
    """Whether a command of ``session`` shows ``err`` as one line and exit code 2 (:class:`headprobe.cli._Context`
    does, settings named as the command's flags, for every command, whatever raised it; :class:`headprobe.cli._App`
    for one raised outside any command): an error of headprobe's own or a missing or unwritable file
    (:attr:`Session.user_errors`). Not under ``--debug``, which shows its traceback, nor once a Ctrl-C or SIGTERM
    came (the error is the interrupt's doing: the command ends as interrupted). Any other exception is a bug and
    keeps its traceback. ``session`` ``None`` (a command run outside the program, e.g. in tests):
    :data:`USER_ERRORS`."""
    if session is not None and (session.debug or session.interrupted):
        return False
    return isinstance(err, session.user_errors if session is not None else USER_ERRORS)


def fail(err: Exception | str, ctx: typer.Context | None, code: int = 2) -> Exception:
    """Print ``err`` (see :func:`say_error`) and return the exit to raise; under ``--debug`` return ``err``
    itself instead, so that raising it shows its traceback.

    A command refuses in its own words with it (``raise fail("--model goes with --real", ctx)``). An error of
    headprobe's own, or a ``typer.BadParameter`` of a command's own check of an option's text, needs no
    ``fail``: raised from anywhere in a command, it is shown the same way with that command's flags
    (:func:`refused`)."""
    session = session_of(ctx)
    if isinstance(err, Exception) and session is not None and session.debug:
        return err
    say_error(err, ctx)
    return typer.Exit(code)


def ints(text: str) -> list[int]:
    """A comma list of integers."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected a comma list of integers, got {text!r}") from None


_COUNT = re.compile(r"(\d+)\s*([kK]?)")


def token_counts(text: str, option: str = "--lengths") -> list[int]:
    """A comma list of token counts, ``k``/``K`` meaning x1024 (``4096,16k,128K``), each once in the order
    first given (``1k,1K,1024`` is ``[1024]``), none above :data:`~headprobe.core.settings.MAX_TOKENS`; errors
    name ``option``."""
    counts = []
    for item in (x.strip() for x in text.split(",")):
        m = _COUNT.fullmatch(item)
        if not m or int(m.group(1)) == 0:
            raise typer.BadParameter(
                f"{option} {text!r}: {item!r} is not a positive token count; write e.g. 4096,16k,128K (k = 1,024)"
            )
        count = int(m.group(1)) * (1024 if m.group(2) else 1)
        if count > MAX_TOKENS:
            raise typer.BadParameter(
                f"{option} {text!r}: {count:,} tokens is more than any command takes (at most {MAX_TOKENS:,}, "
                f"{MAX_TOKENS // 1024}k, per length); write e.g. 4096,16k,128K (k = 1,024)"
            )
        counts.append(count)
    return list(dict.fromkeys(counts))  # 1k,1K,1024 is one length: measured once


def check_options(ctx: typer.Context | None, command: Callable[..., Any], values: dict[str, Any]) -> None:
    """The one range rule on the command line (:meth:`headprobe.core.settings.Range.refusal`), run for every
    command before its work: each option of ``command`` whose annotation declares a :class:`Range`
    (``Annotated[int, typer.Option(...), Range(minimum=1)]``) and whose value in ``values`` lies outside it is
    refused in one line naming its flag, what it allows and what it got (``--jobs: give at least 1, got 0``),
    exit code 2. Options made from a settings dataclass's fields are checked with it, by the same rule
    (:func:`headprobe.core.settings.check_ranges`)."""
    for name, param in inspect.signature(command, eval_str=True).parameters.items():
        for bounds in getattr(param.annotation, "__metadata__", ()):
            if isinstance(bounds, Range) and (why := bounds.refusal(values.get(name))):
                raise fail(f"`{name}`: {why}", ctx)


def int_range(text: str) -> tuple[int, int]:
    """``MIN:MAX`` (or one integer for both) as a pair of integers."""
    lo, _, hi = text.partition(":")
    try:
        return int(lo), int(hi or lo)
    except ValueError:
        raise typer.BadParameter(f"expected MIN:MAX integers, got {text!r}") from None


def words(text: str) -> list[str]:
    """A comma list of names."""
    return [x.strip() for x in text.split(",") if x.strip()]


# ``--memory-limit``, as every command that runs models takes it
MemoryLimit = Annotated[float | None, typer.Option(help="GiB the run may use (default: what is free)"), Range(above=0)]


def gib(value: float | None) -> int | None:
    """``--memory-limit`` GiB as bytes."""
    return int(value * 2**30) if value else None


def wide_console() -> Console:
    """A console that does not squeeze wide tables into 80 columns when output is piped or logged."""
    return Console() if sys.stdout.isatty() else Console(width=200)


def check_device(device: str) -> None:
    """Refuse, before any work, a ``--device`` this torch cannot use."""
    import torch

    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise typer.BadParameter(f"--device {device!r}: not a torch device; use cpu, cuda or cuda:N") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise typer.BadParameter(
            f"--device {device}: this torch ({torch.__version__}) sees no CUDA GPU; use --device cpu, or install a "
            "CUDA build of torch on a GPU machine (docs/install.md)"
        )


def check_out_folder(path: Path, option: str = "--out") -> None:
    """Refuse, before any work, an output folder that is an existing file."""
    if path.exists() and not path.is_dir():
        raise typer.BadParameter(f"{option} {path} is a file; give a folder (it is created when missing)")


def check_run(ctx: typer.Context | None, out: Path | None = None, device: str | None = None) -> None:
    """A job's output folder and device, checked before any work (:func:`check_out_folder`,
    :func:`check_device`); a problem is one message and exit code 2."""
    if device is not None:
        check_device(device)
    if out is not None:
        check_out_folder(out)


def option_flag(name: str, flag: str | None = None) -> str:
    """The command-line flag of setting ``name``: ``flag`` when the setting declares one, else ``--name`` with
    dashes (``max_new_tokens`` -> ``--max-new-tokens``)."""
    return flag or "--" + name.replace("_", "-")


def _chosen(settings: type, fields: Sequence[str] | None) -> list[dataclasses.Field]:
    """The fields of the settings dataclass ``settings`` that a command takes as options: all of them, or
    those named in ``fields`` (in the dataclass's order); a name that is no field is a bug (``TypeError``)."""
    known = dataclasses.fields(settings)
    if fields is None:
        return list(known)
    if unknown := sorted(set(fields) - {f.name for f in known}):
        raise TypeError(f"{settings.__name__} has no field {', '.join(unknown)}")
    return [f for f in known if f.name in fields]


def _list_text(items: Sequence[Any]) -> str:
    """A list in its comma form, a whole float as an integer (``[0.0, 12.5]`` -> ``0,12.5``)."""
    return ",".join(str(int(x)) if isinstance(x, float) and x.is_integer() else str(x) for x in items)


def _item_type(hint: Any) -> type:
    """The number type of a list annotation's items (``list[int]``, ``list[float] | None``)."""
    for arg in typing.get_args(hint):
        if arg in (int, float):
            return arg
        if typing.get_args(arg):
            return _item_type(arg)
    return float


def numbers(text: str, kind: type, option: str, example: str) -> list[Any]:
    """A comma list of numbers of ``kind`` (``int`` or ``float``), empty items skipped; a malformed item
    raises ``typer.BadParameter`` naming ``option`` and showing ``example``."""
    values = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        try:
            values.append(kind(item))
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise typer.BadParameter(
                f"{option} {text!r}: {item!r} is not {what}; write a comma list, e.g. {example}"
            ) from None
    return values


def settings_options(settings: type, fields: Sequence[str] | None = None) -> list[inspect.Parameter]:
    """One keyword parameter per field of the settings dataclass ``settings`` (declared with
    :func:`headprobe.core.settings.setting`), or per field named in ``fields``: a typer option with the
    field's flag, help and default. A list is taken in its text form (``names``: ``a,b``; ``numbers``:
    ``0,1,2``; ``lengths``: ``4096,16k``; ``paths`` and ``texts``: the option repeated), a ``path`` as a
    path, any other non-scalar default (``Rows``) as its text."""
    hints = typing.get_type_hints(settings)
    chosen = _chosen(settings, fields)
    flags = {f.name: option_flag(f.name, f.metadata.get("flag")) for f in chosen}
    options = []
    for f in chosen:
        meta, form = f.metadata, f.metadata.get("form")
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
        annotation: Any = hints[f.name]
        if form in ("names", "numbers", "lengths"):
            annotation = str if default is not None else str | None
            default = None if default is None else _list_text(default)
        elif form in ("paths", "texts"):
            annotation = list[Path] | None if form == "paths" else list[str] | None
            default = None if default is None else list(default)
        elif form == "path":
            annotation, default = (Path | None, None) if default is None else (Path, Path(default))
        elif form == "count" or not isinstance(default, str | int | float | bool | None):  # `3` or `all`: the
            # text, which the dataclass parses (headprobe.core.settings.parse_count)
            annotation, default = str, str(default)
        decls = (meta["flag"],) if meta.get("flag") else ()
        option = typer.Option(default, *decls, help=flagify(meta.get("help", ""), flags))
        options.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation))
    return options


def settings_from(settings: type, values: dict[str, Any]) -> Any:
    """The dataclass ``settings`` from the values of :func:`settings_options`' options (lists parsed from
    their text form; a malformed one raises ``typer.BadParameter`` naming its flag); a field without a value
    in ``values`` keeps its default."""
    fields = {f.name: f for f in dataclasses.fields(settings)}
    hints = typing.get_type_hints(settings)
    kwargs = {}
    for name, value in values.items():
        f = fields[name]
        form, flag = f.metadata.get("form"), option_flag(name, f.metadata.get("flag"))
        if value is not None and form == "names":
            value = words(value)
        elif value is not None and form == "numbers":
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
            value = numbers(value, _item_type(hints[name]), flag, _list_text(default) if default else "0,1,2")
        elif value is not None and form == "lengths":
            value = token_counts(value, flag)
        elif form == "paths":
            value = [str(p) for p in value] if value else None
        elif value is not None and form == "texts":
            value = [str(x) for x in value]
        elif value is not None and form == "path":
            value = str(value)
        kwargs[name] = value
    return settings(**kwargs)


def with_settings(
    command: Callable[..., None], settings: type, fields: Sequence[str] | None = None
) -> Callable[..., None]:
    """``command`` (which takes ``**settings``) with the options of ``settings`` (:func:`settings_options`:
    every field, or those named in ``fields``) in its signature, after its arguments and before its own
    options, as typer reads it."""
    own = list(inspect.signature(command, eval_str=True).parameters.values())
    head = [p for p in own if p.kind is not p.VAR_KEYWORD and p.default is p.empty]  # ctx, the arguments
    tail = [p.replace(kind=p.KEYWORD_ONLY) for p in own if p.kind is not p.VAR_KEYWORD and p.default is not p.empty]
    command.__signature__ = inspect.Signature([*head, *settings_options(settings, fields), *tail])  # type: ignore[attr-defined]
    return command
