"""vLLM's plugin for exported folders (:mod:`headprobe.export.hf`), found through the
``vllm.general_plugins`` entry point in every vLLM process once headprobe is installed beside vLLM.

:func:`register` names the architecture ``HeadShapeForCausalLM`` by a ``"module:Class"`` string, so
nothing is imported until vLLM builds a model: this module's ``HeadShapeForCausalLM`` (made on first
access, since it subclasses vLLM's), vLLM's Transformers modeling backend driving the exported transformers
code, after :func:`vllm_refusal` has checked that vLLM's attention can run the member's heads. It cannot run two layer
types of different shapes (it builds one attention shape from the config's top-level heads and
``head_dim``) nor a value width other than the query/key width (one head size for keys and values, MLA
aside); of the study's grids that leaves ``toy-d32``, ``0.6b-d128`` and ``3b-d128``. Other members are
refused with that reason before any weight loads.

Not run here: vLLM installs on the CPU-only development machine but does not start without a GPU
(docs/checkpoints.md). The refusal and the registration are tested without vLLM.
"""

from __future__ import annotations

from typing import Any

ARCHITECTURE = "HeadShapeForCausalLM"
MODEL_CLASS = f"{__name__}:{ARCHITECTURE}"
SHAPE = ("num_attention_heads", "num_key_value_heads", "qk_head_dim", "v_head_dim")


def register() -> None:
    """The entry point: vLLM's ``ModelRegistry`` learns the architecture, lazily (by string)."""
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)


def vllm_refusal(config: dict[str, Any]) -> str | None:
    """Why vLLM cannot run the exported model of ``config`` (an export's ``config.json``), or ``None``."""
    shapes = {kind: tuple(config["attention"][kind][k] for k in SHAPE) for kind in set(config["layer_types"])}
    if len(set(shapes.values())) > 1:
        described = "; ".join(f"{kind}: {dict(zip(SHAPE, s, strict=True))}" for kind, s in sorted(shapes.items()))
        return (
            f"its layer types have different attention shapes ({described}), and vLLM builds one shape for "
            "every layer; run it with transformers or lm-eval's hf model instead"
        )
    _, _, qk, v = next(iter(shapes.values()))
    if qk != v:
        return (
            f"its query/key heads are {qk} wide and its value heads {v}, and vLLM's attention takes one head size "
            "for keys and values; run it with transformers or lm-eval's hf model instead"
        )
    return None


def __getattr__(name: str) -> Any:
    """``HeadShapeForCausalLM``, made on first access: it subclasses vLLM's Transformers backend, so this
    module imports without vLLM."""
    if name != ARCHITECTURE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = cls = _model_class()
    return cls


def _model_class() -> type:
    from vllm.model_executor.models.transformers import TransformersForCausalLM

    from headprobe.export.auto import register as register_auto

    class HeadShapeForCausalLM(TransformersForCausalLM):
        """vLLM's Transformers modeling backend on the exported code, after :func:`vllm_refusal`."""

        def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
            refusal = vllm_refusal(vllm_config.model_config.hf_config.to_dict())
            if refusal:
                raise ValueError(f"vLLM cannot run {vllm_config.model_config.model}: {refusal}")
            register_auto()  # the Auto classes know the head-shape model: no remote code needed
            super().__init__(vllm_config=vllm_config, prefix=prefix)

    HeadShapeForCausalLM.__module__, HeadShapeForCausalLM.__qualname__ = __name__, ARCHITECTURE  # picklable by name
    return HeadShapeForCausalLM
