"""``headprobe explore --export page.html``: one self-contained page to share, no server needed.

The page is the explorer's own (``static/``), with its script and style inlined and the answers the
server would have sent embedded (:func:`headprobe.explore.app.api_answer`, keyed as the page asks for
them): the input's info, every per-head metric, every token, the needle view, the map tiles of every
captured head at the ``levels`` coarsest zoom levels, and the top keys of the question rows (or the
last rows). Deeper zooms draw the finest embedded level and say that the server computes the rest.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from headprobe.core.atomic import atomic_write_text
from headprobe.explore.app import api_answer, asset
from headprobe.explore.pooling import TileSpec, tiles_across, top_level
from headprobe.explore.session import ModelView

TOKEN_CHUNK = 1024  # as the page asks for tokens (explore.js TOKEN_CHUNK)
URI_SAFE = "-_.!~*'()"  # what encodeURIComponent leaves as it is
ROWS = 16  # query rows with precomputed top keys when the input has no question


def api_key(route: str, params: dict[str, Any]) -> str:
    """The key the page looks an answer up by (explore.js ``apiKey``): sorted, URI-encoded parameters."""
    query = "&".join(f"{k}={quote(str(params[k]), safe=URI_SAFE)}" for k in sorted(params))
    return route + ("?" + query if query else "")


def export_requests(views: Sequence[ModelView], levels: int) -> list[tuple[str, dict[str, Any]]]:
    """Every request the exported page can answer."""
    todo: list[tuple[str, dict[str, Any]]] = [("info", {})]
    for m, view in enumerate(views):
        length = view.input.length
        todo += [("overview", {"model": m, "metric": metric}) for metric in view.metrics]
        todo += [
            ("tokens", {"model": m, "start": s, "end": min(length, s + TOKEN_CHUNK)})
            for s in range(0, length, TOKEN_CHUNK)
        ]
        if view.evidence is not None:
            todo.append(("needle", {"model": m}))
        rows = range(*view.input.question) if view.input.question else range(max(0, length - ROWS), length)
        top = top_level(length)
        for layer, cap in view.captures.items():
            for head in range(cap.q.shape[0]):
                for level in range(top, max(-1, top - levels), -1):
                    n = tiles_across(length, level)
                    todo += [
                        ("tile", {"model": m, "layer": layer, "head": head, "level": level, "row": r, "col": c})
                        for r in range(n)
                        for c in range(r + 1)
                        if not TileSpec(level, r, c).empty(length, cap.window)
                    ]
                todo += [("row", {"model": m, "layer": layer, "head": head, "pos": p, "k": 10}) for p in rows]
    return todo


def export_page(
    views: Sequence[ModelView], out: str | Path, levels: int = 2, progress: Callable[[int, int], None] | None = None
) -> Path:
    """Write the self-contained page to ``out`` (atomically); ``progress(done, total)`` after each answer."""
    todo = export_requests(views, levels)
    answers = {}
    for n, (route, params) in enumerate(todo):
        answers[api_key(route, params)] = api_answer(views, route, {k: str(v) for k, v in params.items()})
        if progress:
            progress(n + 1, len(todo))
    data = {"answers": answers, "colormap": json.loads(asset("colormap.json"))}
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    page = asset("index.html").decode()
    page = page.replace('<link rel="stylesheet" href="static/explore.css">', "")
    page = page.replace('<script src="static/explore.js"></script>', "")
    page = page.replace("<!--HEADPROBE_INLINE_CSS-->", f"<style>\n{asset('explore.css').decode()}</style>")
    page = page.replace("<!--HEADPROBE_INLINE_DATA-->", f"<script>window.HEADPROBE_STATIC = {payload};</script>")
    js = asset("explore.js").decode().replace("</", "<\\/")
    page = page.replace("<!--HEADPROBE_INLINE_JS-->", f"<script>\n{js}</script>")
    out = Path(out)
    atomic_write_text(out, page)
    return out
