"""The attention-map explorer: exact maps of long contexts in the browser, offline (``headprobe explore``).

=========  ==========================================================================================
pooling    ``pooled_mass``: exact mean attention mass of query blocks on key blocks; ``TileSpec`` tiles
inputs     ``ExploreInput``: plain text, a needle prompt or a RULER-style sample, as one model reads it
session    ``ModelView``: one model on one input: captured q/k, per-head metrics, tiles, rows, evidence
build      ``build_views``: the models and input the command line names
app        the FastAPI app and ``api_answer`` (every endpoint's answer, framework-free)
export     ``export_page``: one self-contained static page
static/    the page: index.html, explore.js, explore.css, colormap.json (no CDN, no framework)
=========  ==========================================================================================
"""

from headprobe.explore.app import api_answer, create_app
from headprobe.explore.build import build_views, make_input
from headprobe.explore.inputs import ExploreInput, InputError
from headprobe.explore.pooling import TILE, TileSpec, pooled_mass, top_level
from headprobe.explore.session import ExploreError, ModelView

__all__ = [
    "TILE",
    "ExploreError",
    "ExploreInput",
    "InputError",
    "ModelView",
    "TileSpec",
    "api_answer",
    "build_views",
    "create_app",
    "make_input",
    "pooled_mass",
    "top_level",
]
