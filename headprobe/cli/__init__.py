"""The ``headprobe`` command line: typer only, no logic. Each command lives in its own module and calls
the library; library errors name settings in backticks and :func:`headprobe.cli.common.fail` shows them
as this command's flags.

==========  =========================================================================================
analyze     ``headprobe analyze``
ruler       ``headprobe ruler generate|eval``
shortctx    ``headprobe shortctx eval``
plan        ``headprobe plan``
study       ``headprobe study``, ``headprobe demo`` (the study's demo profile)
figures     ``headprobe figures`` and ``headprobe report``: the study's figures and tables, and one HTML page of
            them all (the ``figures`` package)
explore     ``headprobe explore``: the attention-map explorer (a local web app, or ``--export`` one page)
train       ``headprobe train ...``, ``headprobe data ...``: the trainer plugin's commands
common      error display, option parsing, consoles
progress    the one progress bar (implements :class:`headprobe.runs.Progress`)
==========  =========================================================================================
"""

from __future__ import annotations

import typer

from headprobe.cli import analyze, explore, figures, plan, ruler, shortctx, study
from headprobe.cli.train import add_trainer_commands

app = typer.Typer(
    help="headprobe: how attention-head shape decides long-context retrieval.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
ruler_app = typer.Typer(help="RULER-style long-context evaluation (13 tasks, generated offline).", no_args_is_help=True)
ruler_app.command("generate")(ruler.ruler_generate)
ruler_app.command("eval")(ruler.ruler_eval)
shortctx_app = typer.Typer(help="Short-context multiple-choice evaluation by log-likelihood.", no_args_is_help=True)
shortctx_app.command("eval")(shortctx.shortctx_eval)

app.command("analyze")(analyze.analyze)
app.add_typer(ruler_app, name="ruler")
app.add_typer(shortctx_app, name="shortctx")
app.command("plan")(plan.plan)
app.command("study")(study.study)
app.command("demo")(study.demo)
app.command("figures")(figures.figures)
app.command("report")(figures.report)
app.command("explore")(explore.explore)
add_trainer_commands(app)  # the bundled trainer, found as a plugin (headprobe never imports it)
