"""Packages whose names load on first use (PEP 562), so that importing one light module of a package (its
settings, its task table) does not load the heavy ones beside it (torch)."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: a name of ``exports`` (name -> module of the package) is
    imported from its module when first asked for; any other name is an ``AttributeError``."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(import_module(f"{package}.{exports[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
