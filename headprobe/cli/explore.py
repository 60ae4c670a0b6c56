"""``headprobe explore``: the interactive attention-map explorer (a local web app), or a static page of it."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated, Any

import typer

from headprobe.cli.common import check_run, command_flags, fail, flagify, ints, served
from headprobe.core.settings import DTYPE_HELP, MAX_TOKENS, PROMPT_FORMAT_HELP, Range

# what an --export page holds (headprobe.explore.export.ExportSettings, which checks them, defaults the same)
ExportLevels = Annotated[int, typer.Option(help="--export: how many of the coarsest zoom levels to embed")]
Overwrite = Annotated[
    bool, typer.Option(help="--export: replace a file headprobe did not write (its own page is redone)")
]
ExportHeads = Annotated[
    str,
    typer.Option(help="--export: the heads whose maps to embed: top:K (by --export-metric), all, or LAYER.HEAD,..."),
]
ExportMetric = Annotated[
    str,
    typer.Option(
        help="--export: the per-head metric top:K ranks by, highest first (auto: retrieval score, then needle span "
        "mass, for --needle/--ruler; mean distance for --text)"
    ),
]
ExportMaxMib = Annotated[
    float, typer.Option(help="--export: refuse, before the work, a page estimated above this many MiB")
]

Length = Annotated[
    int | None,
    typer.Option(help="input tokens (needed by --ruler and --needle; cuts --text)"),
    Range(minimum=1, maximum=MAX_TOKENS),
]


def explore(
    ctx: typer.Context,
    checkpoints: Annotated[
        list[Path], typer.Argument(help="one model (our checkpoint, a Hugging Face folder or a .gguf file), or two")
    ],
    text: Annotated[Path | None, typer.Option(help="explore this UTF-8 text file")] = None,
    ruler: Annotated[
        str | None, typer.Option(help="explore sample 0 of this RULER-style task (e.g. niah_single_1)")
    ] = None,
    needle: Annotated[bool, typer.Option("--needle", help="explore a needle-in-a-haystack prompt")] = False,
    length: Length = None,
    depth: Annotated[
        float, typer.Option(help="--needle: needle depth in percent of the haystack"), Range(minimum=0, maximum=100)
    ] = 50.0,
    seed: Annotated[int, typer.Option(help="--needle/--ruler: which sample")] = 0,
    needles: Annotated[str, typer.Option(help="--needle: needle set, builtin | codes (the toy models')")] = "builtin",
    prompt_format: Annotated[str, typer.Option(help=f"--needle/--ruler: {PROMPT_FORMAT_HELP}")] = "auto",
    results: Annotated[
        Path | None, typer.Option(help="a `headprobe analyze` output folder: its per-head tables become metrics")
    ] = None,
    layers: Annotated[
        str | None, typer.Option(help="comma list of layers to capture (default all; fewer saves memory)")
    ] = None,
    rows: Annotated[
        str | None, typer.Option(help="rows the per-head means use: all | last:N | stride:N (default: about 2,048)")
    ] = None,
    host: Annotated[
        str, typer.Option(help="address to bind; anything but 127.0.0.1 exposes the inputs to the network")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port (0: any free one)"), Range(minimum=0, maximum=65535)] = 0,
    open_browser: Annotated[bool, typer.Option("--open/--no-open", help="open the page in a browser")] = True,
    export: Annotated[
        Path | None, typer.Option(help="write a self-contained static page here instead of serving")
    ] = None,
    export_levels: ExportLevels = 2,
    export_heads: ExportHeads = "top:8",
    export_metric: ExportMetric = "auto",
    export_max_mib: ExportMaxMib = 20.0,
    overwrite: Overwrite = False,
    device: Annotated[str, typer.Option(help="torch device for the models")] = "cpu",
    dtype: Annotated[str | None, typer.Option(help=DTYPE_HELP)] = None,
    allow_beyond_trained: Annotated[
        bool, typer.Option(help="an input --length beyond what a model was trained on (refused otherwise)")
    ] = False,
) -> None:
    """Explore exact attention maps of one model (or two side by side) on one input, in the browser, offline.

    Views: a layers x heads overview coloured by a per-head metric; the map of one head at any zoom
    (each pixel the exact mean attention mass of its query block on its key block, down to single
    tokens); the input's tokens with a query row's top keys; the needle view (the answer and each head's
    argmax per step) for --needle and --ruler inputs."""
    from headprobe.metrics.rows import Rows
    from headprobe.text.prompt_format import parse_prompt_format

    _check_options(ctx, checkpoints, text, ruler, needle, length, results, export, overwrite)
    settings = _export_settings(ctx, export, export_heads, export_metric, export_levels, export_max_mib)
    check_run(ctx, device=device)
    row_spec = Rows.parse(rows) if rows else None
    parse_prompt_format(prompt_format)  # as every command reads it, before any model loads
    inputs = dict(
        text=text, ruler=ruler, needle=needle, length=length, depth=depth, seed=seed, needles=needles,
        prompt_format=prompt_format,
    )  # fmt: skip
    loading = dict(
        results=results, layers=ints(layers) if layers else None, rows=row_spec, device=device, dtype=dtype,
        allow_beyond_trained=allow_beyond_trained,
    )  # fmt: skip
    if export is None:
        with bind(host, port) as sock:  # a port in use is refused before any model loads
            serve(_load(ctx, checkpoints, inputs | loading, export, settings), sock, host, open_browser)
        served(ctx)  # the server runs until a Ctrl-C or SIGTERM: that is its end, not an interrupt
        return
    _load(ctx, checkpoints, inputs | loading, export, settings)
    typer.echo(f"wrote {export} ({export.stat().st_size / 2**20:.1f} MiB): open it in any browser, no server needed")


def _load(ctx: typer.Context, checkpoints: list[Path], options: dict, export: Path | None, settings: Any) -> list:
    """The models on the input (``options``: :func:`headprobe.explore.build_views`'s), with progress; and
    the export page when asked for (``settings``: its :class:`~headprobe.explore.export.ExportSettings`):
    its size estimated before the forward passes and again once the heads are chosen, said, and a page
    over the limit refused before anything is written."""
    from headprobe.cli.progress import progress_bar
    from headprobe.explore import build_views

    with progress_bar("explore", ctx) as progress:
        if export is not None:
            from headprobe.explore.export import export_page, plan_export, precheck_export

            def precheck(pairs: list) -> None:
                precheck_export(pairs, settings, export, options["layers"], options["results"] is not None)

            options = options | {"before_capture": precheck}
        views = build_views(checkpoints, progress=progress, **options)
        if export is not None:
            plan = plan_export(views, settings)
            progress.log(f"export: {plan.summary()}")
            plan.check(export)

            def tick(done: int, total: int) -> None:
                if done == 1:
                    progress.start(total, "export")
                progress.advance()

            export_page(views, export, plan, progress=tick)
    return views


def _check_options(
    ctx: typer.Context,
    checkpoints: list[Path],
    text: Path | None,
    ruler: str | None,
    needle: bool,
    length: int | None,
    results: Path | None,
    export: Path | None,
    overwrite: bool,
) -> None:
    """Refuse bad options before any model loads, and an ``export`` page where it may not go
    (:func:`headprobe.core.outputs.claim`: never over an input; a file headprobe did not write only with
    ``overwrite``)."""
    if len(checkpoints) > 2:
        raise fail(f"give one checkpoint, or two to compare; got {len(checkpoints)}", ctx)
    chosen = [
        name for name, on in (("--text", text is not None), ("--ruler", ruler is not None), ("--needle", needle)) if on
    ]
    if len(chosen) != 1:
        raise fail(
            "give exactly one input: --text FILE, --ruler TASK --length N, or --needle --length N "
            f"(got {', '.join(chosen) or 'none'})",
            ctx,
        )
    if ruler is not None:
        from headprobe.evals.ruler.tasks import TASKS

        if ruler not in TASKS:
            raise fail(f"--ruler {ruler} is not a RULER-style task; choose one of {', '.join(TASKS)}", ctx)
    if (ruler or needle) and length is None:
        raise fail(f"{chosen[0]} needs --length N (input tokens)", ctx)
    from headprobe.core.paths import not_a

    if text is not None and (why := not_a(text, "file")):
        raise fail(f"--text {text} {why}; give a UTF-8 text file", ctx)
    if results is not None and (why := not_a(results, "folder")):
        raise fail(f"--results {results} {why}; give a `headprobe analyze` output folder", ctx)
    if export is not None and (export.is_dir() or not export.parent.is_dir()):
        raise fail(f"--export {export}: give an HTML file path in an existing folder", ctx)
    if overwrite and export is None:
        raise fail("--overwrite: only for a page written with --export PAGE.html", ctx)
    if export is not None:
        from headprobe.core.outputs import PAGE, claim

        read = [*checkpoints, *(p for p in (text, results) if p is not None)]
        claim(export, PAGE, inputs=read, overwrite=overwrite, option="export")
    from headprobe.hooked import check_model

    for path in checkpoints:
        check_model(path)


def _export_settings(
    ctx: typer.Context, export: Path | None, heads: str, metric: str, levels: int, max_mib: float
) -> Any:
    """The export's :class:`~headprobe.explore.export.ExportSettings`, checked before any model loads;
    ``None`` without ``--export``, when the export options given are refused."""
    names = ("export_heads", "export_metric", "export_levels", "export_max_mib")
    given = [name for name in names if getattr(ctx.get_parameter_source(name), "name", "") == "COMMANDLINE"]
    if export is None:
        if given:
            flags = ", ".join(flagify(f"`{name}`", command_flags(ctx)) for name in given)
            raise fail(f"{flags}: only for a page written with --export PAGE.html", ctx)
        return None
    from headprobe.explore.export import ExportSettings

    settings = ExportSettings(export_heads=heads, export_metric=metric, export_levels=levels, export_max_mib=max_mib)
    settings.validate()
    return settings


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` (0: any free port) and listening, or the refusal naming the port:
    taken before the models load, so a port in use costs seconds, not the whole computation."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise fail(f"cannot bind {host}:{port} ({err.strerror}); choose another --port or --host", None) from None
    sock.listen(2048)  # connections made as soon as the URL is printed wait in the backlog, not refused
    return sock


def serve(views, sock: socket.socket, host: str, open_browser: bool) -> None:
    """Serve the explorer on the bound ``sock`` (:func:`bind`) until Ctrl-C."""
    import uvicorn

    from headprobe.explore import create_app

    bound = sock.getsockname()[1]
    if host not in ("127.0.0.1", "localhost", "::1"):
        typer.secho(
            f"warning: serving on {host}, not only this machine: anyone who can reach it can read the loaded inputs",
            fg=typer.colors.YELLOW,
            err=True,
        )
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{bound}/"
    typer.echo(f"headprobe explore: {url}  (Ctrl-C stops it)", err=False)
    if open_browser:
        import webbrowser

        webbrowser.open(url)
    config = uvicorn.Config(create_app(views), log_level="warning")
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn shuts down gracefully, then re-raises the Ctrl-C it caught
        pass
    finally:
        sock.close()
    typer.echo("stopped")
