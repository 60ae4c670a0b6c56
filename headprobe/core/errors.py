"""The base of every error headprobe raises on purpose: bad input or settings, a refused folder, a model
that cannot be loaded. The command line shows these as one line with their fix; any other exception is a
bug and keeps its traceback (:mod:`headprobe.cli`)."""

from __future__ import annotations


class HeadprobeError(Exception):
    """An error of headprobe's own: its message names the problem and the fix. Subclasses keep the builtin
    class they had before this base existed (``ValueError``, ``RuntimeError``, ``FileExistsError``), so code
    that caught those still does."""


class SettingError(HeadprobeError, ValueError):
    """A setting that cannot be used: an unknown name among choices, a malformed spec (``last:N``), a
    value out of range. The message names the setting (in backticks: the command line shows its flag)."""
