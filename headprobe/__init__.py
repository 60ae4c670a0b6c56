"""headprobe: how the shape of attention heads decides long-context retrieval.

    import headprobe as hp

    net = hp.model.Transformer(hp.model.preset("toy-k64v16"))     # the model family
    model = hp.load_model("runs/grid/toy-d64/sft/final")           # ours, a local Hugging Face folder, a .gguf
    report = hp.analyze([...checkpoints], "results/analyze", hp.AnalyzeSettings(metrics=["entropy"], lengths=[4096]))
    report.table("entropy")                                        # a tidy table over every model
    hp.export_hf("runs/grid/toy-d64/sft/final", "hf/toy-d64")      # a Hugging Face folder (transformers, lm-eval)

Packages, bottom to top (each imports only those below it; see docs/index.md): ``model`` (the model
family), ``text``, ``results`` and ``export`` (offline text; the results format; our checkpoints as
Hugging Face folders), ``hooked`` (models as the analyses see them), ``stats`` (the streaming engine),
``metrics``, ``jobs`` (job plumbing), ``analysis`` / ``evals`` (the jobs), ``cli`` (the command line).
"""

from __future__ import annotations

from headprobe.core.lazy import lazy_exports
from headprobe.export.auto import register_when_imported

register_when_imported()  # folders of `headprobe export hf` load in transformers without remote code (cheaply)

_EXPORTS = {
    "load_model": "hooked",
    "HookedModel": "hooked",
    "analyze": "analysis",
    "AnalyzeSettings": "analysis",
    "read_table": "results",
    "collect": "results",
    "export_hf": "export.hf",
}
_PACKAGES = ("model", "text", "results", "hooked", "stats", "metrics", "jobs", "analysis", "evals", "testing")
__all__ = sorted([*_EXPORTS, *_PACKAGES])


# lazy: `headprobe plan` and `headprobe --help` stay quick to start
__getattr__ = lazy_exports(__name__, _EXPORTS, _PACKAGES)
