"""Reading a user's text file with errors that name the file, the problem and the fix."""

from __future__ import annotations

from pathlib import Path

from headprobe.core.errors import HeadprobeError
from headprobe.core.paths import read_utf8


class TextFileError(HeadprobeError, ValueError):
    """A text file that is missing, not UTF-8, or empty."""


def read_text_file(path: str | Path, what: str) -> str:
    """The UTF-8 text of ``path``; ``what`` names it in errors (an option such as ``--text``, or a setting
    in backticks)."""
    text = read_utf8(path, what, TextFileError)
    if not text.strip():
        raise TextFileError(f"{what} {path} holds no text")
    return text
