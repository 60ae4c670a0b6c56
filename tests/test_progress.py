"""The progress line's ETA is the current phase's: a study's probes are not timed by the rate of the
training before them (it said ``ETA 52h49m`` at the first of 80 probes after 40 minutes of training)."""

from __future__ import annotations

import re

import pytest

from headprobe.cli import progress as progress_mod
from headprobe.cli.progress import LineProgress


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def eta_of(line: str) -> str | None:
    found = re.search(r"ETA (\S+)", line)
    return None if found is None else found.group(1)


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(progress_mod.time, "monotonic", clock)
    return clock


def test_each_phase_has_its_own_eta(clock, capsys):
    line = LineProgress("study", {}, every=0.0)
    line.report(0, 800, "training")
    clock.now += 2400  # 40 minutes of training: 800 steps at 3 s
    line.report(800, 800, "loss 0.1")
    line.start(80, "probes")
    clock.now += 10  # the first of 80 probes took 10 s: 79 more take 13 min 10 s
    line.advance()
    lines = capsys.readouterr().err.strip().splitlines()
    assert "1/80 (1%)" in lines[-1] and eta_of(lines[-1]) == "13m10s", lines[-1]
    assert "40m10s elapsed" in lines[-1]  # the elapsed time is the run's


def test_a_report_of_another_total_is_a_new_phase(clock, capsys):
    line = LineProgress("grid", {}, every=0.0)
    line.report(0, 100, "")
    clock.now += 100
    line.report(50, 100, "")  # 2 s a step: 50 more take 100 s
    assert eta_of(capsys.readouterr().err.splitlines()[-1]) == "1m40s"
    clock.now += 10
    line.report(10, 20, "")  # another loop (a resumed stage): 9 of its steps were done earlier, 1 in 10 s
    clock.now += 20
    line.report(13, 20, "")  # 4 in 30 s since it began: 7 more take 52 s
    assert eta_of(capsys.readouterr().err.splitlines()[-1]) == "0m52s"


def test_the_bar_on_a_terminal_draws_a_status_column(monkeypatch):
    """On a terminal ``headprobe train`` (and study, data prepare/synth) ended at once in a KeyError traceback:
    the bar drew its status column (``info``) before the field existed."""
    import io
    import sys

    from headprobe.cli.progress import progress_bar

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    with progress_bar("train", info=True) as bar:
        bar.report(1, 4, "loss 1.2345")
    assert "loss 1.2345" in screen.getvalue() and "1/4" in screen.getvalue()
