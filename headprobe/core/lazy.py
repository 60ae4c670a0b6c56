"""Packages whose names load on first use (PEP 562), so that importing one light module of a package (its
settings, its task table) does not load the heavy ones beside it (torch)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib import import_module
from typing import Any


def lazy_exports(package: str, exports: dict[str, str], modules: Sequence[str] = ()) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: a name of ``exports`` (name -> module of the package, dotted
    below it: ``export.hf``) is imported from its module when first asked for, and a name of ``modules`` (the
    package's own subpackages) is that module; any other name is an ``AttributeError``."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(import_module(f"{package}.{exports[name]}"), name)
        if name in modules:
            return import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
