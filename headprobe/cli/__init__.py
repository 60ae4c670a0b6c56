"""The ``headprobe`` command line: typer only, no logic. Each command lives in its own module and calls
the library; library errors name settings in backticks, and an error of headprobe's own raised anywhere in a
command is shown in one place, :class:`_Context`, as one line with those settings as the failing command's
flags (:func:`headprobe.cli.common.refused`).

==========  =========================================================================================
analyze     ``headprobe analyze``
ablate      ``headprobe ablate``: needle accuracy with heads ablated
graft       ``headprobe graft``: a checkpoint's parts grafted into another, each hybrid measured
ruler       ``headprobe ruler generate|eval``
shortctx    ``headprobe shortctx eval``
plan        ``headprobe plan``
study       ``headprobe study``, ``headprobe demo`` (the study's demo profile)
figures     ``headprobe figures`` and ``headprobe report``: the study's figures and tables, and one HTML page of
            them all (the ``figures`` package)
show        ``headprobe show``: a results folder as tables on the terminal
explore     ``headprobe explore``: the attention-map explorer (a local web app, or ``--export`` one page)
export      ``headprobe export hf``: our checkpoint as a Hugging Face model folder
train       ``headprobe train ...``, ``headprobe data ...``: the trainer plugin's commands
common      error display, option parsing, consoles
progress    the one progress bar (implements :class:`headprobe.core.progress.Progress`)
==========  =========================================================================================
"""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

import typer
from typer.core import DEFAULT_MARKUP_MODE, TyperGroup

from headprobe.cli import ablate, analyze, explore, export, figures, graft, plan, ruler, shortctx, show, study
from headprobe.cli.common import (
    Session,
    check_options,
    fail,
    plain_help,
    refused,
    say_error,
    say_interrupted,
    session_of,
    usage_arguments,
)
from headprobe.cli.train import add_trainer_commands
from headprobe.core.cleanup import run_cleanups

GRACE = 5.0  # seconds an interrupted command has to unwind before it is ended outright


def _watch(fd: int, handler: Callable[[int, object], None], session: Session) -> None:
    """The watchdog: Python runs a signal's handler only between bytecodes of the main thread, so a long
    native call (a compile, one huge kernel, a training step's backward pass) could hold a stop back for
    minutes. The C-level handler writes each signal's number to ``fd`` at once; :data:`GRACE` seconds after
    one that ``handler`` handles, the process is ended outright (:func:`_end_interrupted`, which runs the
    cleanups of :mod:`headprobe.core.cleanup`). While someone else handles the signal (the trainer finishing
    its step, the explorer's server) it waits, until a second Ctrl-C: that one means now, whoever handles it."""
    presses = 0
    while data := os.read(fd, 1):
        presses += data[0] == signal.SIGINT
        if signal.getsignal(data[0]) is not handler and presses < 2:
            continue
        threading.Event().wait(GRACE)
        if session.ended is not None:  # the command ended meanwhile (the explorer's server stopped): its own code
            _flush()
            os._exit(session.ended)
        session.interrupted = True
        _end_interrupted(session)


def install_interrupts(session: Session | None = None) -> None:
    """Ctrl-C and SIGTERM (``timeout``, a cluster's scheduler) stop a command the same way: a
    ``KeyboardInterrupt`` unwinds every ``finally`` (temporary files and folder locks removed, finished parts
    kept), and ``session`` notes that it came. Routes both signals so (unless the process ignores them or
    handles them otherwise) and starts the :func:`_watch` watchdog. Main thread only; a no-op elsewhere."""
    if threading.current_thread() is not threading.main_thread():
        return
    session = session or Session()

    def terminated(signum: int, frame: object) -> None:
        if session.ended is not None:  # the command has ended: nothing is left to stop
            _flush()
            os._exit(session.ended)
        session.interrupted = True
        raise KeyboardInterrupt

    ours = False
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, terminated)
        ours = True
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # SIG_IGN (a background job) stays
        signal.signal(signal.SIGINT, terminated)
        ours = True
    if ours:
        read, write = os.pipe()
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        watchdog = threading.Thread(
            target=_watch, args=(read, terminated, session), daemon=True, name="headprobe-interrupt-watchdog"
        )
        watchdog.start()


_ENDING = threading.Lock()  # one end: the main thread's or the watchdog's
_HANDLER = "install_interrupts.<locals>.terminated"  # the handler install_interrupts routes both signals to


def _end_interrupted(session: Session, message: object = None) -> NoReturn:
    """End a command that a Ctrl-C or SIGTERM stopped, once everything has unwound (its ``finally`` blocks
    ran): the cleanups still registered run, ``message`` (``sys.exit("message")``) and the last line, what was
    kept and how to go on (:func:`headprobe.cli.common.say_interrupted`), are said, output is flushed, then
    ``os._exit(130)``, whatever exit code the command was on its way to: one exit code for an interrupt. Not
    ``SystemExit``: CPython ends a process by SIGINT at exit, whatever its exit code, when a KeyboardInterrupt
    ever left code that a C extension ran through ``PyRun_String`` (an import of torch or transformers), even
    one the command then handled (``_PyRuntime.signals.unhandled_keyboard_interrupt``; CPython gh-128130). An
    interrupt during start-up ended about 1 run in 5 that way (killed by SIGINT, no message) instead of with 130;
    and a signal during the seconds that finalising torch takes printed "Exception ignored in atexit callback".
    A further signal is ignored from its first line on (:func:`_keep_exit_code`): it cannot cut the end short."""
    _keep_exit_code()
    _ENDING.acquire()
    run_cleanups()
    if isinstance(message, str):
        print(message, file=sys.stderr)
    say_interrupted(session)
    _flush()
    os._exit(130)


def _keep_exit_code() -> None:
    """A command that has ended keeps its exit code: a Ctrl-C or SIGTERM from now on is ignored. Python hands
    the signals it handles back to their default action while it finalises, before modules such as torch are
    torn down (seconds), and a signal then ended the process as killed by it, with no word: a command whose work
    was complete and said so exited 130 to the shell. (Until then the handler ends the process with the
    command's own exit code: :func:`install_interrupts`.) Signals the process ignored or that someone else
    handles are left as they are. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        if getattr(signal.getsignal(sig), "__qualname__", "") == _HANDLER:
            signal.signal(sig, signal.SIG_IGN)


def _flush() -> None:
    """Flush stdout and stderr, whatever state they are in."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


class _Formatter(typer.Context.formatter_class):  # type: ignore[name-defined, misc]
    """click's help formatter, showing docstrings' markup as plain text (``x`` as `x`) and arguments as click
    names them, in capitals, in the usage line (``CHECKPOINTS...``, not typer's ``{checkpoints}...``) and the
    Arguments section alike (as errors name them)."""

    section_name = ""

    def write_usage(self, prog: str, args: str = "", prefix: str | None = None) -> None:
        super().write_usage(prog, usage_arguments(args), prefix)

    def write_text(self, text: str) -> None:
        super().write_text(plain_help(text))

    @contextlib.contextmanager
    def section(self, name: str):
        self.section_name = name
        try:
            with super().section(name):
                yield
        finally:
            self.section_name = ""

    def write_dl(self, rows, col_max: int = 30, col_spacing: int = 2) -> None:
        if self.section_name == "Arguments":
            rows = [(_capitalised(term), text) for term, text in rows]
        super().write_dl([(term, plain_help(text)) for term, text in rows], col_max, col_spacing)


def _capitalised(term: str) -> str:
    """An argument's help term with its name in capitals: ``checkpoints... <list[Path]>`` ->
    ``CHECKPOINTS... <list[Path]>``."""
    name, space, kind = term.partition(" ")
    return name.upper() + space + kind


class _Context(typer.Context):
    """The context of every headprobe command and group: its help through :class:`_Formatter`, its options'
    ranges checked before it runs (:func:`headprobe.cli.common.check_options`), and its errors shown.

    Errors become flags here, in one place: an error of headprobe's own (or a missing or unwritable file) that
    leaves the command's callback is shown as one red line, the settings its message names in backticks written
    as this command's flags (``--max-new-tokens``, ``OUT``), exit code 2 (:func:`headprobe.cli.common.fail`);
    ``--debug`` lets it through with its traceback, and so does an interrupt (the command then ends as
    interrupted: :class:`_App`). Any other exception is a bug and keeps its traceback. Each command's callback
    runs in its own context's :meth:`invoke` (a group's callback in the group's, a subcommand's in its own,
    which click makes after the group's callback has returned), so the flags named are always those of the
    command that failed (``ruler eval``'s, not ``ruler generate``'s or the group's)."""

    formatter_class = _Formatter

    def invoke(self, callback, /, *args, **kwargs):
        if callback is None or callback is not getattr(self.command, "callback", None):
            return super().invoke(callback, *args, **kwargs)
        check_options(self, callback, kwargs)
        try:
            return super().invoke(callback, *args, **kwargs)
        except Exception as err:
            if not refused(err, session_of(self)):
                raise
            raise fail(err, self) from None


class _Group(TyperGroup):
    """headprobe's groups (the command itself, and each one :meth:`_App.add_typer` adds): ``--help`` as click's
    plain text, which wraps to any terminal. typer's rich panels cut option names and defaults short with "…"
    at 80 columns, put ``<bool>`` on flags and leave the help text a narrow column (issue 28). The app's
    ``rich_markup_mode=None``, which typer hands to every command, makes every command's help plain; usage
    errors keep typer's panel, as the root's :meth:`main` shows them with typer's default mode. The group and
    every command in it format their help through :class:`_Context` (plain text, readable usage lines)."""

    context_class = _Context

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for command in self.commands.values():
            self._plain(command)

    def add_command(self, cmd, name: str | None = None) -> None:
        super().add_command(self._plain(cmd), name)

    @staticmethod
    def _plain(command):
        """``command``, its help formatted as headprobe's (a group of ours already is)."""
        if not isinstance(command, TyperGroup):
            command.context_class = _Context
        return command

    def main(self, *args, **kwargs):
        self.rich_markup_mode = DEFAULT_MARKUP_MODE  # how usage errors are shown; help stays plain (below)
        return super().main(*args, **kwargs)

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        """A group without a command shows its help on stdout, exit code 2 (typer's rich mode printed it
        there; its usage-error panel shows nothing for it)."""
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            typer.echo(ctx.get_help(), color=ctx.color)
            ctx.exit(2)
        return super().parse_args(ctx, args)

    def format_help(self, ctx, formatter) -> None:
        """click's help, whatever ``rich_markup_mode`` says."""
        self.format_usage(ctx, formatter)
        self.format_help_text(ctx, formatter)
        self.format_options(ctx, formatter)
        self.format_epilog(ctx, formatter)

    def format_commands(self, ctx, formatter) -> None:
        """Each command with the first paragraph of its help, in full (click cuts it to a line, with "...")."""
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                text = command.short_help or inspect.cleandoc(command.help or "").partition("\f")[0].split("\n\n")[0]
                rows.append((name, " ".join(text.replace("\b", "").split())))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class _App(typer.Typer):
    """The command: the program's entry (signals, exit codes, interrupts). An error of headprobe's own
    (:class:`~headprobe.core.errors.HeadprobeError`, or a missing or unwritable file) raised in a command is
    shown where that command's context is at hand, :class:`_Context`, with the command's flags; one that reaches
    this far without a command (a command of another group class, or typer building the command) is shown here
    as one line (its settings without flags to name) and exit code 2. ``--debug`` shows the traceback instead.
    Any other exception is a bug and keeps its traceback. ``session`` (:class:`Session`) is what the process
    knows besides its options; the root callback hands it to every command as ``ctx.obj``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.session = Session()

    def __call__(self, *args, **kwargs):
        install_interrupts(self.session)
        try:
            return self._command(*args, **kwargs)
        except KeyboardInterrupt:  # a signal while the command's end was being handled: an interrupt's end
            self.session.interrupted = True
            _end_interrupted(self.session)
        except BaseException as end:  # the command has ended (an exit code, or a bug's traceback: 1)
            code = end.code if isinstance(end, SystemExit) else 1
            self.session.ended = code if isinstance(code, int) else 0 if code is None else 1
            _keep_exit_code()
            raise

    def _command(self, *args, **kwargs):
        """The command, its errors shown as :class:`_App` says."""
        try:
            return super().__call__(*args, **kwargs)  # click ends a KeyboardInterrupt with exit code 130
        except KeyboardInterrupt:  # one outside click's own handling (typer building the command): the same end
            self.session.interrupted = True
            _end_interrupted(self.session)
        except SystemExit as stop:
            if self.session.interrupted:
                _end_interrupted(self.session, stop.code)
            self.session.ended = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
            raise
        except Exception as err:
            if self.session.interrupted:  # e.g. an import cut short by the interrupt failing on the way out
                _end_interrupted(self.session)
            if not refused(err, self.session):
                raise
            say_error(err, None)
            typer.secho("(run `headprobe --debug ...` for the traceback)", err=True)
            raise SystemExit(2) from None

    def add_typer(self, typer_instance: typer.Typer, **kwargs) -> None:
        """A group of subcommands, shown as :class:`_Group` (unless ``cls`` says otherwise)."""
        kwargs.setdefault("cls", _Group)
        super().add_typer(typer_instance, **kwargs)


app = _App(
    help="headprobe: how attention-head shape decides long-context retrieval.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=_Group,
    rich_markup_mode=None,  # --help as plain text (see _Group)
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            number = version("headprobe")
        except PackageNotFoundError:
            number = "unknown (not installed)"
        typer.echo(f"headprobe {number}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_version, help="print the version"),
    debug: bool = typer.Option(False, "--debug", help="show the traceback of an error instead of one line"),
) -> None:
    """headprobe: how attention-head shape decides long-context retrieval."""
    app.session.debug = debug
    ctx.obj = app.session


ruler_app = typer.Typer(help="RULER-style long-context evaluation (13 tasks, generated offline).", no_args_is_help=True)
ruler_app.command("generate")(ruler.ruler_generate)
ruler_app.command("eval")(ruler.ruler_eval)
shortctx_app = typer.Typer(help="Short-context multiple-choice evaluation by log-likelihood.", no_args_is_help=True)
shortctx_app.command("eval")(shortctx.shortctx_eval)
export_app = typer.Typer(help="Our checkpoints in other tools' formats.", no_args_is_help=True)
export_app.command("hf")(export.export_hf)

app.command("analyze")(analyze.analyze)
app.command("ablate")(ablate.ablate)
app.command("graft")(graft.graft)
app.add_typer(ruler_app, name="ruler")
app.add_typer(shortctx_app, name="shortctx")
app.add_typer(export_app, name="export")
app.command("plan")(plan.plan)
app.command("study")(study.study)
app.command("demo")(study.demo)
app.command("figures")(figures.figures)
app.command("report")(figures.report)
app.command("explore")(explore.explore)
app.command("show")(show.show)
add_trainer_commands(app)  # the bundled trainer, found as a plugin (headprobe never imports it)
