"""Errors of the probe layer."""

from __future__ import annotations


class ModelLoadError(RuntimeError):
    """A model folder cannot be loaded; the message names the folder and the reason."""
