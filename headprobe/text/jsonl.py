"""Reading JSON-lines text with errors that name the file and line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def jsonl_records(text: str, path: str | Path, error: type[Exception]) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` for each non-blank line of ``text`` (1-based line numbers).

    A line that is not JSON raises ``error("{path}:{line}: not valid JSON (...)")``; what a valid value
    must hold is the caller's check.
    """
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as err:
            raise error(f"{path}:{lineno}: not valid JSON ({err.msg})") from None
