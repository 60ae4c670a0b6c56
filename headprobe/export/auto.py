"""The head-shape classes in transformers' Auto classes, so that an exported folder
(:mod:`headprobe.export.hf`) loads without ``trust_remote_code`` where headprobe is installed.

:func:`register` does it; ``import headprobe`` arranges for it to run as soon as transformers is
imported, in whichever order the two are imported (:func:`register_when_imported`), and does not import
transformers itself (the command line starts without it)."""

from __future__ import annotations

import importlib.machinery
import sys
import warnings
from types import ModuleType

_TRIGGER = "transformers"


def register() -> None:
    """``AutoConfig``, ``AutoModel`` and ``AutoModelForCausalLM`` learn ``model_type`` ``"headshape"``."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    from headprobe.export.hf_code.configuration_headshape import HeadShapeConfig
    from headprobe.export.hf_code.modeling_headshape import HeadShapeForCausalLM, HeadShapeModel

    AutoConfig.register(HeadShapeConfig.model_type, HeadShapeConfig, exist_ok=True)
    AutoModel.register(HeadShapeConfig, HeadShapeModel, exist_ok=True)
    AutoModelForCausalLM.register(HeadShapeConfig, HeadShapeForCausalLM, exist_ok=True)


class _AfterImport:  # a meta path finder (importlib.abc.MetaPathFinder's protocol; that module is slow to import)
    """Finds nothing itself: wraps the loader of ``transformers`` so that :func:`register` runs once the
    package has been executed (and removes itself)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _TRIGGER:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            try:
                register()
            except Exception as err:  # importing transformers must not fail because of headprobe
                warnings.warn(f"headprobe could not register its exported model classes with transformers: {err}",
                              stacklevel=2)  # fmt: skip

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def register_when_imported() -> None:
    """:func:`register` now if transformers is already imported, else right after it is."""
    if _TRIGGER in sys.modules:
        register()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
