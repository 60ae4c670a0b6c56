"""The head-shape classes in transformers' Auto classes, so that an exported folder
(:mod:`headprobe.export.hf`) loads without ``trust_remote_code`` where headprobe is imported.

``import headprobe`` arranges it (:func:`register_when_imported`) without importing transformers itself
(the command line starts without it), in whichever order the two are imported, and without making a
process that imports transformers but never loads an exported folder pay for the model code (about 1-2 s:
``transformers.modeling_utils`` and generation): once transformers' Auto modules are imported, the config
class is registered, and in the model mappings a :class:`_Deferred` stands for each model class, importing
it (and putting it in its place) the first time it is used. :func:`register` registers the real classes now.
"""

from __future__ import annotations

import importlib.machinery
import sys
import warnings
from collections.abc import Callable
from types import ModuleType


def register_config() -> None:
    """``AutoConfig`` learns ``model_type`` ``"headshape"``."""
    from transformers import AutoConfig

    from headprobe.export.hf_code.configuration_headshape import HeadShapeConfig

    AutoConfig.register(HeadShapeConfig.model_type, HeadShapeConfig, exist_ok=True)


def register_models(deferred: bool = False) -> None:
    """``AutoModel`` and ``AutoModelForCausalLM`` learn the head-shape model classes (with ``deferred``, a
    :class:`_Deferred` for each)."""
    from transformers import AutoModel, AutoModelForCausalLM

    from headprobe.export.hf_code.configuration_headshape import HeadShapeConfig

    for auto, name in ((AutoModel, "HeadShapeModel"), (AutoModelForCausalLM, "HeadShapeForCausalLM")):
        auto.register(HeadShapeConfig, _Deferred(auto, name, HeadShapeConfig) if deferred else _model(name),
                      exist_ok=True)  # fmt: skip


def _model(name: str) -> type:
    from headprobe.export.hf_code import modeling_headshape

    return getattr(modeling_headshape, name)


class _Deferred:
    """Stands for a model class in an Auto mapping until it is used: any attribute but its name and config
    class (``from_pretrained``, ``_from_config`` ...) imports the class, puts it in the mapping in this
    stand-in's place, and is read from it."""

    def __init__(self, auto: type, name: str, config_class: type) -> None:
        self.auto, self.__name__, self.config_class = auto, name, config_class

    def __getattr__(self, attribute: str):
        real = _model(self.__name__)
        self.auto.register(self.config_class, real, exist_ok=True)
        return getattr(real, attribute)


def register() -> None:
    """The config and the model classes, now."""
    register_config()
    register_models()


# the transformers modules whose import makes each registration cheap
TRIGGERS: dict[str, Callable[[], None]] = {
    "transformers.models.auto.configuration_auto": register_config,
    "transformers.models.auto.modeling_auto": lambda: register_models(deferred=True),
}


def _safely(action: Callable[[], None]) -> None:
    try:
        action()
    except Exception as err:  # importing transformers must not fail because of headprobe
        warnings.warn(f"headprobe could not register its exported model classes with transformers: {err}",
                      stacklevel=3)  # fmt: skip


class _AfterImport:
    """A meta path finder that finds nothing itself (``importlib.abc.MetaPathFinder``'s protocol; that
    module is slow to import): it wraps the loader of each module of :data:`TRIGGERS` so that its
    registration runs once the module has been executed, and removes itself when none is left."""

    def __init__(self, pending: dict[str, Callable[[], None]]) -> None:
        self.pending = pending

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.pending:
            return None
        action = self.pending.pop(fullname)
        if not self.pending:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _safely(action)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def register_when_imported() -> None:
    """Each registration now if its transformers module is already imported, else right after it is."""
    pending = {}
    for module, action in TRIGGERS.items():
        if module in sys.modules:
            _safely(action)
        else:
            pending[module] = action
    if pending and not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(pending))
