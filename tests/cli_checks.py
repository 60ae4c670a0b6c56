"""What the command-line tests check of every refusal, written once: the command ran at a width where
nothing wraps, ended with the expected exit code and one ``error:`` line (no traceback) saying what
is wrong and the fix, and left the files as they were."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from click.testing import Result
from typer.testing import CliRunner

from headprobe.cli import app

WIDE = {"COLUMNS": "300"}  # no line of the output wraps


def invoke(*args: str | Path, env: dict[str, str] | None = None) -> Result:
    """``headprobe ARGS...`` in this process."""
    return CliRunner().invoke(app, [str(a) for a in args], env={**WIDE, **(env or {})})


def run_command(*args: str | Path, timeout: float = 120) -> Result:
    """``python -m headprobe ARGS...`` in a new process, through the command's own error handling (which
    :func:`invoke` bypasses: errors that reach the top, e.g. an unwritable path, are shown there), as a
    :class:`Result` (stdout and stderr together in ``output``)."""
    env = {**os.environ, **WIDE, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "headprobe", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    output = done.stdout + done.stderr
    return Result(CliRunner(), done.stdout.encode(), done.stderr.encode(), output.encode(), None, done.returncode, None)


def one_error(res: Result, code: int, *says: str) -> str:
    """Assert ``res`` exited with ``code`` and printed exactly one ``error:`` line, no traceback, holding
    each of ``says``; returns that line."""
    assert res.exit_code == code, res.output
    assert "Traceback" not in res.output and (res.exception is None or isinstance(res.exception, SystemExit)), (
        res.output,
        res.exception,
    )
    errors = [line for line in res.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, res.output
    for part in says:
        assert part in errors[0], (part, errors[0])
    return errors[0]


def refused(res: Result, *says: str) -> str:
    """:func:`one_error` with exit code 2: refused before any work."""
    return one_error(res, 2, *says)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` (its path relative to ``folder``) with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file()}
