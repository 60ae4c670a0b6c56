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


def _default_signals() -> None:
    """Children of a background job inherit SIGINT ignored (POSIX), and Python then keeps ignoring it, as a
    command should; a runner started under ``nohup`` or by a CI agent that ignores SIGTERM hands that on too
    (the command keeps it ignored: it is not ours to handle). The tests send Ctrl-C and SIGTERM as a terminal
    and a scheduler would."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def start(args: list[str], slow_decoding: bool = False) -> subprocess.Popen:
    program = ["-c", SLOW_DECODING] if slow_decoding else ["-m", "headprobe"]
    return subprocess.Popen(
        [sys.executable, *program, *args],
        preexec_fn=_default_signals,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # PYTHONFAULTHANDLER: a crash in native code (an abort, as -6 once seen below) shows every thread's stack
        env=os.environ | {"HEADPROBE_PROGRESS_EVERY": "0", "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"},
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
    assert proc.returncode == 130 and "Traceback" not in err, (proc.returncode, err[-3000:])  # -6 seen once: why
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
    while True:  # work that does not unwind (as a long native call would not)
        try:  # "holding" said inside: the signal that follows it cannot land outside the try
            print("holding", flush=True)
            time.sleep(100)
        except KeyboardInterrupt:
            pass
"""


def test_a_process_that_does_not_unwind_is_ended_after_the_grace_period_with_its_cleanups(tmp_path):
    from headprobe.cli import GRACE

    out = tmp_path / "r"
    proc = subprocess.Popen(
        [sys.executable, "-c", STUCK, str(out)],
        preexec_fn=_default_signals,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "holding" and out.is_dir()
    took, err = stop(proc, signal.SIGTERM)
    assert GRACE - 0.5 < took < GRACE + 5 and proc.returncode == 130
    assert err.splitlines()[-1] == "interrupted: nothing was kept; rerun the same command", err
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
    assert proc.returncode == 130 and err.splitlines()[-1] == GRID_LINE.format(out=runs), err[-2000:]
    assert alive == [], f"workers still running 30 s after the grid stopped: {alive}\n{err[-2000:]}"
    for log in logs:  # each saved where it stopped: a rerun resumes
        assert sorted(p.name for p in log.parent.glob("step_*")), sorted(p.name for p in log.parent.iterdir())


def test_work_that_an_interrupt_ended_otherwise_still_ends_as_interrupted(tmp_path, capsys):
    """C code that the KeyboardInterrupt reaches may turn it into another error: an interrupt while loading
    a checkpoint was reported as "cannot read safetensors (could not determine the shape ...); the file is
    truncated or corrupted", exit code 1. Once the command's session saw the interrupt, its resumable work
    ends as interrupted (130, how to resume), whether the block raised or returned."""
    import typer

    from headprobe.cli.common import Session, resumable, say_interrupted
    from headprobe.model.checkpoint import CheckpointError

    class Ctx:  # a command's context: its root holds the session
        def __init__(self, session: Session) -> None:
            self.obj = session

        def find_root(self) -> Ctx:
            return self

    damaged = CheckpointError("cannot read safetensors (could not determine the shape of object type ...)")
    (tmp_path / "part.parquet").write_text("finished")
    for body in (lambda: (_ for _ in ()).throw(damaged), lambda: None):
        session = Session(interrupted=True)
        with pytest.raises(typer.Exit) as stop, resumable(tmp_path, Ctx(session)):
            body()
        assert stop.value.exit_code == 130
        say_interrupted(session)  # what the command line says last, once the command has unwound
        said = capsys.readouterr().err
        assert said == f"interrupted: the finished work is kept in {tmp_path}; rerun the same command to resume\n"
    session = Session()
    with pytest.raises(CheckpointError), resumable(tmp_path, Ctx(session)):  # no interrupt: the error itself
        raise damaged
    assert not session.interrupted
    with pytest.raises(typer.Exit), resumable(tmp_path / "new", Ctx(session)):  # nothing written yet
        raise KeyboardInterrupt
    say_interrupted(session)
    assert capsys.readouterr().err == "interrupted: nothing was kept; rerun the same command\n"


# the command with signals sent to itself when a function is called for the N-th time, so that a test stops it at
# a chosen point of its work without timing: argv[1] is "module:attribute.path@N=SIGINT,SIGINT;...", the rest the
# command. A signal sent to oneself is handled before the next Python step, so the call is the signal's point.
SIGNAL_AT = """
import importlib, os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as from a terminal
def signalling(original, at, signals):
    calls = [0]
    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] == at:
            for sig in signals:
                os.kill(os.getpid(), sig)
        return original(*args, **kwargs)
    return wrapper
for spec in sys.argv[1].split(";"):
    target, _, when = spec.partition("@")
    at, _, names = when.partition("=")
    module, _, path = target.partition(":")
    *outer, name = path.split(".")
    owner = importlib.import_module(module)
    for part in outer:
        owner = getattr(owner, part)
    setattr(owner, name, signalling(getattr(owner, name), int(at), [getattr(signal, n) for n in names.split(",")]))
from headprobe.cli import app
app(prog_name="headprobe", args=sys.argv[2:])
"""


def signalled(where: str, *args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``headprobe ARGS`` stopped by the signals ``where`` (see :data:`SIGNAL_AT`) sends it."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "HEADPROBE_PROGRESS_EVERY": "0"}
    return subprocess.run([sys.executable, "-c", SIGNAL_AT, where, *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300, preexec_fn=_default_signals)  # fmt: skip


def ended_interrupted(done: subprocess.CompletedProcess, last: str) -> None:
    """Exit code 130, no traceback or ignored exception, and ``last`` as the last line."""
    assert done.returncode == 130, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == last, done.stderr


TRAIN = ["train", "--preset", "toy-d16", "--steps", "50", "--batch-size", "2", "--seq-len", "64", "--threads", "1",
         "--no-progress"]  # fmt: skip
STEP = "trainer.train:Trainer.train_step"


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_training_stopped_by_a_signal_exits_130_naming_the_step_it_saved(tmp_path, sig):
    """It exited 0 without final/, so `train ... && analyze RUN/final` carried on."""
    run = tmp_path / "run"
    done = signalled(f"{STEP}@3={sig}", *TRAIN, "--out", run)  # during the third step: it finishes, saves, stops
    ended_interrupted(done, f"interrupted: the step checkpoint {run}/step_000003 is kept; rerun the same command "
                            "with --resume to continue from it")  # fmt: skip
    assert "stopped at the signal: 3 steps" in done.stdout
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl", "step_000003", "train_config.json"]
    again = signalled(f"{STEP}@2={sig}", *TRAIN, "--out", run, "--resume")
    ended_interrupted(again, f"interrupted: the step checkpoint {run}/step_000005 is kept; rerun the same command "
                             "to continue from it")  # fmt: skip


def test_a_second_ctrl_c_aborts_the_step_at_once(tmp_path):
    """It let the step finish and save, then printed "Exception ignored in atexit callback ... KeyboardInterrupt"."""
    run = tmp_path / "run"
    done = signalled(f"{STEP}@3=SIGINT,SIGINT", *TRAIN, "--out", run, "--save-every", "1")
    ended_interrupted(done, f"interrupted: the step checkpoint {run}/step_000002 is kept; rerun the same command "
                            "with --resume to continue from it")  # fmt: skip
    assert "stopped at the signal" not in done.stdout  # the third step never finished, nor was it saved
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl", "step_000001", "step_000002", "train_config.json"]
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2


def test_a_second_ctrl_c_while_saving_aborts_the_save_and_leaves_no_partial_step(tmp_path):
    """torch's checkpoint writer turned the KeyboardInterrupt into a CheckpointException: a traceback, exit 1."""
    run = tmp_path / "run"
    save = "trainer.train_state:get_model_state_dict"
    done = signalled(f"{STEP}@3=SIGINT;{save}@2=SIGINT", *TRAIN, "--out", run, "--save-every", "2")
    ended_interrupted(done, f"interrupted: the step checkpoint {run}/step_000002 is kept; rerun the same command "
                            "with --resume to continue from it")  # fmt: skip
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl", "step_000002", "train_config.json"]
    fresh = tmp_path / "fresh"  # nothing saved before: the run folder goes, and the line says so
    done = signalled(f"{STEP}@1=SIGINT;{save}@1=SIGINT", *TRAIN, "--out", fresh)
    ended_interrupted(done, "interrupted: nothing was kept; rerun the same command")
    assert not fresh.exists()


TINY_RECIPE = {"scale": "toy", "seeds": [0], "runs": {"pt": {"stage": "pt", "steps": 50, "batch_size": 2,
               "seq_len": 64, "warmup_steps": 0, "threads": 1}}}  # fmt: skip
NOTHING = "interrupted: nothing was kept; rerun the same command"
GRID_LINE = "interrupted: the finished work is kept in {out}; rerun the same command to continue (finished runs are " \
            "skipped, a stopped one resumes from its step)"  # fmt: skip
STUDY_LINE = "interrupted: the finished work is kept in {out}; rerun the same command to resume"
COMMANDS = ["export hf", "train export", "data prepare", "data synth", "ruler generate", "figures", "report", "show",
            "explore --export", "shortctx eval", "train grid", "study"]  # fmt: skip


@pytest.fixture(scope="module")
def inputs(ckpt, tmp_path_factory) -> dict[str, Path]:
    """What the commands read: the tiny checkpoint, an analyze output, a step checkpoint, a recipe."""
    from cli_checks import invoke

    folder = tmp_path_factory.mktemp("inputs")
    res = invoke("analyze", ckpt, "--metrics", "entropy", "--lengths", "64", "--samples", "1", "--out",
                 folder / "res", "--no-progress")  # fmt: skip
    assert res.exit_code == 0, res.output
    res = invoke(*TRAIN[:3], "--steps", "2", *TRAIN[5:], "--out", folder / "run")
    assert res.exit_code == 0, res.output
    (folder / "recipe.json").write_text(json.dumps(TINY_RECIPE))
    return {"ckpt": ckpt, "res": folder / "res", "step": folder / "run" / "step_000002",
            "recipe": folder / "recipe.json"}  # fmt: skip


@pytest.mark.parametrize(
    ("where", "args", "last"),
    [
        ("headprobe.export.hf:_save_weights@1=SIGINT", ["export", "hf", "{ckpt}", "{out}"], NOTHING),
        ("headprobe.model.checkpoint:save_checkpoint@1=SIGTERM", ["train", "export", "{step}", "{out}"], NOTHING),
        ("trainer.data:_encode@1=SIGINT", ["data", "prepare", "{recipe}", "--out", "{out}"], NOTHING),
        ("trainer.data:_encode@2=SIGTERM", ["data", "synth", "--tokens", "20000", "--out", "{out}"], NOTHING),
        (
            "headprobe.core.atomic:atomic_write_text@1=SIGINT",
            ["ruler", "generate", "--out", "{out}", "--tasks", "niah_single_1", "--lengths", "512", "--samples", "1"],
            NOTHING,
        ),
        ("figures.draw:save_figure@1=SIGINT", ["figures", "{res}", "--out", "{out}"], NOTHING),
        ("figures.report:report_page@1=SIGINT", ["report", "{res}", "--out", "{out}"], NOTHING),
        ("headprobe.show:show_tables@1=SIGINT", ["show", "{res}"], NOTHING),
        (
            "headprobe.explore.export:export_page@1=SIGTERM",
            ["explore", "{ckpt}", "--needle", "--length", "256", "--export", "{out}"],
            NOTHING,
        ),
        (
            "headprobe.evals.shortctx.job:evaluate_many@1=SIGINT",
            ["shortctx", "eval", "{ckpt}", "--out", "{out}"],
            NOTHING,
        ),
        (
            f"{STEP}@2=SIGINT",
            ["train", "grid", "--recipe", "{recipe}", "--members", "d16", "--out", "{out}"],
            GRID_LINE,
        ),
        (f"{STEP}@2=SIGTERM", ["study", "--recipe", "{recipe}", "--members", "d16", "--out", "{out}"], STUDY_LINE),
    ],
    ids=COMMANDS,
)
def test_every_command_stopped_by_a_signal_exits_130_and_says_what_was_kept(inputs, tmp_path, where, args, last):
    """One exit code for an interrupt: train exited 0, study 1, export hf 130 without a word; and the last line
    says what was kept, or that nothing was (it claimed "the finished work is kept in OUT" of an empty folder)."""
    out = tmp_path / "out"
    names = {**{k: str(v) for k, v in inputs.items()}, "out": str(out)}
    quiet = ["--no-progress"] if args[0] == "study" else []
    done = signalled(where, *(a.format(**names) for a in args), *quiet, cwd=tmp_path)
    ended_interrupted(done, last.format(out=out))
    if last == NOTHING:  # and so it is: no output, no temporary file
        assert sorted(p.name for p in tmp_path.iterdir()) == [], sorted(p.name for p in tmp_path.rglob("*"))
    else:
        assert list(out.rglob("step_000002")), sorted(p.name for p in out.rglob("*"))


def test_ablate_stopped_keeps_its_finished_conditions_and_a_rerun_says_what_it_skips(ckpt, tmp_path):
    """docs/troubleshooting.md promised "done earlier, skipped" for ablate reruns, which skipped in silence."""
    out = tmp_path / "ab"
    args = ["ablate", ckpt, "--heads", "1.0", "--samples", "1", "--lengths", "256", "--depths", "50", "--out", out,
            "--no-progress"]  # fmt: skip
    done = signalled("headprobe.ablation.job:decode_prompts@2=SIGTERM", *args)  # the baseline done, then stopped
    ended_interrupted(done, f"interrupted: the finished work is kept in {out}; rerun the same command to resume")
    again = subprocess.run([sys.executable, "-m", "headprobe", *map(str, args)], capture_output=True, text=True,
                           timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "tiny baseline needle @ 256: done earlier, skipped" in again.stderr, again.stderr
    assert "heads-1.0-zero needle @ 256: done earlier" not in again.stderr  # the condition stopped is redone
    assert (out / "tiny" / "ablation.parquet").is_file()


TRAINING_STUCK = """
import time
from headprobe.cli import install_interrupts
from trainer.interrupt import interrupt_flag
install_interrupts()
with interrupt_flag() as stop:  # the trainer's handler: the first Ctrl-C asks the step to finish
    while True:  # a step that never returns to Python (a long native call) and swallows what reaches it
        try:
            print("training", flush=True)
            time.sleep(100)
        except KeyboardInterrupt:
            pass
"""


def test_a_second_ctrl_c_ends_a_step_stuck_in_native_code():
    """The watchdog waited on signals the trainer handles; a second Ctrl-C during a step that never returns to
    Python (a huge backward pass, a compile) held the process until the step ended. It now ends it."""
    proc = subprocess.Popen([sys.executable, "-c", TRAINING_STUCK], preexec_fn=_default_signals, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout.readline().strip() == "training"
    proc.send_signal(signal.SIGINT)  # the trainer's: finish the step
    while "interrupt received: finishing this step" not in proc.stderr.readline():
        pass
    proc.send_signal(signal.SIGINT)  # now
    try:
        _, err = proc.communicate(timeout=60)
    finally:  # never leave it running if the test fails
        proc.kill()
    assert proc.returncode == 130 and err.splitlines()[-1] == NOTHING, err
