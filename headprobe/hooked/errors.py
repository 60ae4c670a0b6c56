"""Errors of the hooked-model layer."""

from __future__ import annotations

from headprobe.core.errors import HeadprobeError


class ModelLoadError(HeadprobeError, RuntimeError):
    """A model folder cannot be loaded; the message names the folder and the reason."""
