"""Reading a user's text file with errors that name the file, the problem and the fix."""

from __future__ import annotations

from pathlib import Path


class TextFileError(ValueError):
    """A text file that is missing, not UTF-8, or empty."""


def read_text_file(path: str | Path, what: str) -> str:
    """The UTF-8 text of ``path``; ``what`` names it in errors (an option such as ``--text``, or a setting
    in backticks)."""
    path = Path(path)
    if not path.is_file():
        raise TextFileError(f"{what} {path} does not exist; give a UTF-8 text file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise TextFileError(
            f"{what} {path} is not UTF-8 text ({err.reason} at byte {err.start:,}); give a text file"
        ) from None
    if not text.strip():
        raise TextFileError(f"{what} {path} holds no text")
    return text
