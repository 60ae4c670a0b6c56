"""SIGTERM and SIGINT stop long jobs within seconds at any point, leave no partial file, and a rerun
resumes: real processes (``python -m headprobe``) interrupted during real work."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from headprobe.model.checkpoint import save_checkpoint
from headprobe.model.transformer import Transformer
from headprobe.testing import tiny_config

SLOW = "60000"  # tokens: every row's entropy at this length takes minutes on the tiny model


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    torch.manual_seed(0)
    return save_checkpoint(Transformer(tiny_config(vocab_size=264)), tmp_path_factory.mktemp("c") / "tiny")


# the command with every greedy decoding slowed by a second (real decoding still runs): the test can
# interrupt a ruler evaluation between samples however fast the tiny model answers
SLOW_DECODING = """
import sys, time
from headprobe.hooked import base
decode = base.HookedModel.decode
def slow(self, *args, **kwargs):
    time.sleep(1.0)
    return decode(self, *args, **kwargs)
base.HookedModel.decode = slow
from headprobe.cli import app
app(prog_name="headprobe", args=sys.argv[1:])
"""


def _default_sigint() -> None:
    """Children of a background job inherit SIGINT ignored (POSIX), and Python then keeps ignoring it, as a
    command should; the tests send Ctrl-C as a terminal would."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(args: list[str], slow_decoding: bool = False) -> subprocess.Popen:
    program = ["-c", SLOW_DECODING] if slow_decoding else ["-m", "headprobe"]
    return subprocess.Popen(
        [sys.executable, *program, *args],
        preexec_fn=_default_sigint,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"HEADPROBE_PROGRESS_EVERY": "0", "PYTHONUNBUFFERED": "1"},
    )


def wait_for(condition, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    t0 = time.monotonic()
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"the job ended first ({proc.returncode}): {proc.stderr.read()}")
        if time.monotonic() - t0 > timeout:
            raise AssertionError("the job never got there")
        time.sleep(0.05)


def stop(proc: subprocess.Popen, sig: int) -> tuple[float, str]:
    """Send ``sig``; return how long the process took to end and its stderr."""
    t0 = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    return time.monotonic() - t0, err


def leftovers(folder: Path) -> list[str]:
    """Temporary or hidden files anywhere below ``folder``."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.name.startswith(".") or ".tmp" in p.name)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_analyze_stops_mid_work_and_a_rerun_resumes(ckpt, tmp_path, sig):
    out = tmp_path / "r"
    # entropy at 48 tokens finishes at once and is written as a part; the 60,000-token item then runs
    proc = start(["analyze", str(ckpt), "--metrics", "entropy", "--samples", "1", "--lengths", f"48,{SLOW}",
                  "--allow-beyond-trained", "--out", str(out)])  # fmt: skip
    part = out / "tiny" / "parts"
    wait_for(lambda: part.is_dir() and any(part.rglob("*.parquet")), proc)
    time.sleep(1.0)  # into the long item
    took, err = stop(proc, sig)
    assert took < 10, f"took {took:.1f} s to stop"
    assert proc.returncode == 130 and "Traceback" not in err
    assert f"interrupted: the finished work is kept in {out}; rerun the same command to resume" in err, err
    assert leftovers(out) == [], leftovers(out)
    assert not (out / "tiny" / "entropy.parquet").exists()  # the job's final tables were never half-written
    again = subprocess.run(
        [sys.executable, "-m", "headprobe", "analyze", str(ckpt), "--metrics", "entropy", "--samples", "1",
         "--lengths", "48", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "entropy @ 48: done earlier, skipped" in again.stderr
    assert (out / "tiny" / "entropy.parquet").is_file() and leftovers(out) == []


def test_sigterm_during_start_up_and_model_loading_stops_at_once(ckpt, tmp_path):
    out = tmp_path / "r"
    for delay in (0.5, 2.5):  # in the imports; while loading and checking
        proc = start(["analyze", str(ckpt), "--metrics", "entropy", "--lengths", SLOW, "--allow-beyond-trained",
                      "--out", str(out)])  # fmt: skip
        time.sleep(delay)
        took, err = stop(proc, signal.SIGTERM)
        # 130: our handler's end; -SIGTERM: before it was installed. Never death by SIGINT: CPython ended about 1
        # run in 5 at 2.5 s that way when the interrupt landed in an import that a C extension runs through
        # PyRun_String, however the command ended (cli._end_interrupted)
        stopped = (130, -signal.SIGTERM)
        assert took < 10 and proc.returncode in stopped and "Traceback" not in err, (delay, proc.returncode, err)
        assert not out.exists() or leftovers(out) == [], leftovers(out)


def test_ruler_eval_stops_mid_work_and_a_rerun_resumes(ckpt, tmp_path):
    out = tmp_path / "r"
    args = ["ruler", "eval", str(ckpt), "--tasks", "niah_single_1", "--lengths", "4096", "--samples", "3",
            "--batch-size", "1", "--out", str(out)]  # fmt: skip
    proc = start(args, slow_decoding=True)
    predictions = out
    wait_for(lambda: any(p.stat().st_size for p in predictions.rglob("predictions/*.jsonl")), proc)
    took, err = stop(proc, signal.SIGINT)
    assert took < 10 and proc.returncode == 130 and "Traceback" not in err, err
    assert f"interrupted: the finished work is kept in {out}; rerun the same command to resume" in err, err
    assert leftovers(out) == [], leftovers(out)
    done = sum(len(p.read_text().splitlines()) for p in predictions.rglob("predictions/*.jsonl"))
    again = subprocess.run([sys.executable, "-m", "headprobe", *args], capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert f"tiny niah_single_1 @ 4,096: {done} of 3 samples done earlier, skipped" in again.stderr, again.stderr
    assert sum(len(p.read_text().splitlines()) for p in predictions.rglob("predictions/*.jsonl")) == 3 > done


STUCK = """
import sys, time
from pathlib import Path
from headprobe.cli import install_interrupts
from headprobe.core.atomic import folder_lock
install_interrupts()
with folder_lock(Path(sys.argv[1])):
    print("holding", flush=True)
    while True:  # work that does not unwind (as a long native call would not)
        try:
            time.sleep(100)
        except KeyboardInterrupt:
            pass
"""


def test_a_process_that_does_not_unwind_is_ended_after_the_grace_period_with_its_cleanups(tmp_path):
    from headprobe.cli import GRACE

    out = tmp_path / "r"
    proc = subprocess.Popen(
        [sys.executable, "-c", STUCK, str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "holding" and out.is_dir()
    took, err = stop(proc, signal.SIGTERM)
    assert GRACE - 0.5 < took < GRACE + 5 and proc.returncode == 130 and "stopped (interrupted)" in err
    assert not out.exists()  # the lock's cleanup ran: the folder it made (empty) is gone with the lock file


def test_sigterm_to_a_parallel_grid_stops_its_workers_too(tmp_path):
    """``kill PID`` reaches only the grid's own process, not its worker processes: it passes the signal on,
    so every worker saves a resumable step checkpoint and exits, instead of training on, orphaned."""
    recipe = tmp_path / "recipe.json"
    run = {"stage": "pt", "steps": 100000, "batch_size": 2, "seq_len": 64, "warmup_steps": 0, "threads": 1}
    recipe.write_text(json.dumps({"scale": "toy", "seeds": [0], "runs": {"pt": run}}))
    runs = tmp_path / "runs"
    proc = start(["train", "grid", "--recipe", str(recipe), "--members", "d16,d32", "--jobs", "2", "--out", str(runs)])
    logs = [runs / m / "s0" / "pt" / "metrics.jsonl" for m in ("toy-d16", "toy-d32")]
    wait_for(lambda: all(p.is_file() and p.read_text().count("\n") >= 2 for p in logs), proc, timeout=240)
    children = subprocess.run(["ps", "-o", "pid=", "--ppid", str(proc.pid)], capture_output=True, text=True)
    workers = [int(x) for x in children.stdout.split()]
    assert len(workers) >= 2, children.stdout
    try:
        took, err = stop(proc, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in workers):
            time.sleep(0.2)
    finally:  # never leave a grid training on if the test fails
        alive = [pid for pid in [proc.pid, *workers] if Path(f"/proc/{pid}").exists()]
        for pid in alive:
            os.kill(pid, signal.SIGKILL)
    assert took < 15, f"the grid took {took:.1f} s to stop"
    assert alive == [], f"workers still running 30 s after the grid stopped: {alive}\n{err[-2000:]}"
    for log in logs:  # each saved where it stopped: a rerun resumes
        assert sorted(p.name for p in log.parent.glob("step_*")), sorted(p.name for p in log.parent.iterdir())


def test_work_that_an_interrupt_ended_otherwise_still_ends_as_interrupted(tmp_path, capsys):
    """C code that the KeyboardInterrupt reaches may turn it into another error: an interrupt while loading
    a checkpoint was reported as "cannot read safetensors (could not determine the shape ...); the file is
    truncated or corrupted", exit code 1. Once the command's session saw the interrupt, its resumable work
    ends as interrupted (130, how to resume), whether the block raised or returned."""
    import typer

    from headprobe.cli.common import Session, resumable
    from headprobe.model.checkpoint import CheckpointError

    class Ctx:  # a command's context: its root holds the session
        def __init__(self, session: Session) -> None:
            self.obj = session

        def find_root(self) -> Ctx:
            return self

    damaged = CheckpointError("cannot read safetensors (could not determine the shape of object type ...)")
    for body in (lambda: (_ for _ in ()).throw(damaged), lambda: None):
        with pytest.raises(typer.Exit) as stop, resumable(tmp_path, Ctx(Session(interrupted=True))):
            body()
        assert stop.value.exit_code == 130
        assert "rerun the same command to resume" in capsys.readouterr().err
    with pytest.raises(CheckpointError), resumable(tmp_path, Ctx(Session())):  # no interrupt: the error itself
        raise damaged
