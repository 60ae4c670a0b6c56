"""The explorer's local web app: a FastAPI app over one or two :class:`ModelView` s.

Endpoints (all ``GET``; errors answer 4xx with ``{"detail": message}``):

=================  ==========================================================================================
``/``              the page (``static/index.html``)
``/static/NAME``   a shipped asset, looked up by exact name in :data:`ASSETS` (no path is ever joined)
``/api/info``      every model: layers (type, heads, widths, window), input, metrics, the tile size
``/api/overview``  ``model, metric``: one per-head metric as ``[layers][heads]``
``/api/tile``      ``model, layer, head, level, row, col``: one map tile, float32 little-endian in base64
``/api/row``       ``model, layer, head, pos, k``: a query row's top-k keys, probabilities, entropy
``/api/tokens``    ``model, start, end``: token texts
``/api/needle``    ``model``: the generated answer with each head's argmax key per step, copy scores
=================  ==========================================================================================

``model`` is an index into the loaded models or a model's name. :func:`api_answer` computes every answer
without the web framework, so the static export (:mod:`headprobe.explore.export`) embeds exactly what
the server would send.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from headprobe.explore.pooling import TILE, TileSpec
from headprobe.explore.session import ExploreError, ModelView

STATIC = resources.files("headprobe.explore") / "static"
ASSETS = {
    "index.html": "text/html",
    "explore.js": "text/javascript",
    "explore.css": "text/css",
    "colormap.json": "application/json",
}


class NotFound(ExploreError):
    """A request for something that does not exist (a model, an asset): answered 404."""


def asset(name: str) -> bytes:
    """The shipped asset ``name`` (one of :data:`ASSETS`)."""
    if name not in ASSETS:
        raise NotFound(f"no asset {name!r}; the explorer serves {', '.join(ASSETS)}")
    return (STATIC / name).read_bytes()


def _view(views: Sequence[ModelView], model: str) -> ModelView:
    for i, view in enumerate(views):
        if model in (str(i), view.name):
            return view
    names = ", ".join(f"{i} ({v.name})" for i, v in enumerate(views))
    raise NotFound(f"unknown model {model!r}; loaded: {names}")


def _int(params: dict[str, str], name: str, default: int | None = None) -> int:
    if name not in params:
        if default is None:
            raise ExploreError(f"missing parameter {name!r}")
        return default
    try:
        return int(params[name])
    except ValueError:
        raise ExploreError(f"parameter {name}={params[name]!r} is not an integer") from None


def _tile(view: ModelView, p: dict[str, str]) -> dict[str, Any]:
    layer, head = _int(p, "layer"), _int(p, "head")
    spec = TileSpec(_int(p, "level"), _int(p, "row"), _int(p, "col"))
    values = view.tile(layer, head, spec)
    q0, k0 = spec.queries(view.input.length)[0], spec.keys(view.input.length)[0]
    return {
        "level": spec.level,
        "row": spec.row,
        "col": spec.col,
        "block": spec.block,
        "q0": q0,
        "k0": k0,
        "rows": int(values.shape[0]),
        "cols": int(values.shape[1]),
        "max": float(values.max()) if values.size else 0.0,
        "data": base64.b64encode(values.astype("<f4").tobytes()).decode(),
    }


ROUTES: dict[str, Callable[[Sequence[ModelView], dict[str, str]], Any]] = {
    "info": lambda views, p: {"models": [v.info() for v in views], "tile": TILE},
    "overview": lambda views, p: {
        "metric": p.get("metric", "entropy"),
        "values": _view(views, p.get("model", "0")).metric(p.get("metric", "entropy")),
    },
    "tile": lambda views, p: _tile(_view(views, p.get("model", "0")), p),
    "row": lambda views, p: _view(views, p.get("model", "0")).row(
        _int(p, "layer"), _int(p, "head"), _int(p, "pos"), _int(p, "k", 10)
    ),
    "tokens": lambda views, p: {
        "start": _int(p, "start", 0),
        "tokens": _view(views, p.get("model", "0")).tokens(_int(p, "start", 0), _int(p, "end")),
    },
    "needle": lambda views, p: _view(views, p.get("model", "0")).needle(),
}


def api_answer(views: Sequence[ModelView], route: str, params: dict[str, str]) -> Any:
    """The JSON answer of ``/api/<route>`` with query ``params`` (raises :class:`ExploreError`)."""
    if route not in ROUTES:
        raise NotFound(f"no endpoint /api/{route}; the API has {', '.join('/api/' + r for r in ROUTES)}")
    return ROUTES[route](views, params)


def create_app(views: Sequence[ModelView]):
    """The FastAPI app serving ``views``."""
    app = FastAPI(title="headprobe explore", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ExploreError)
    async def _explore_error(request: Request, err: ExploreError) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=404 if isinstance(err, NotFound) else 400)

    @app.get("/")
    def index() -> Response:
        return Response(asset("index.html"), media_type=ASSETS["index.html"])

    @app.get("/static/{name}")
    def static(name: str) -> Response:
        return Response(asset(name), media_type=ASSETS[name])

    @app.get("/api/{route}")
    def api(route: str, request: Request) -> Any:
        return api_answer(views, route, dict(request.query_params))

    return app
