"""Fixtures for every test: a fixed seed, and one cache folder for the built-in corpus.

References live in reference.py, small models and tokenizers in headprobe.testing."""

from __future__ import annotations

import os
import signal

import pytest
import torch

# Our Triton kernels run on CPU tensors in Triton's interpreter, decided once per process before Triton
# is imported (headprobe.model.kernels.runtime); on a machine with a GPU they compile and the CUDA tests
# run instead.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _signals_kept():
    """No test leaves this process's Ctrl-C and SIGTERM handling changed: an ignored signal is inherited by
    every command a later test starts, which would then never stop (tests/test_interrupts.py)."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    after = {sig: signal.getsignal(sig) for sig in before}
    assert after == before, f"the test changed this process's signal handling: {before} -> {after}"


@pytest.fixture
def own_signals():
    """The command (``_App``) is the program's entry: it takes over the process's Ctrl-C and SIGTERM and leaves
    them ignored once it has ended (its exit code stands while Python finalises). Called in this process, the
    test puts them back, so that no command a later test starts inherits them ignored."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    signal.set_wakeup_fd(-1)
    for sig, handler in before.items():
        signal.signal(sig, handler)


@pytest.fixture(scope="session", autouse=True)
def _corpus_cache(tmp_path_factory):
    """One cache folder for the built-in corpus across the session (it is generated on first use)."""
    import os

    folder = tmp_path_factory.mktemp("headprobe-cache")
    old = os.environ.get("HEADPROBE_CACHE")
    os.environ["HEADPROBE_CACHE"] = str(folder)
    yield folder
    if old is None:
        os.environ.pop("HEADPROBE_CACHE", None)
    else:
        os.environ["HEADPROBE_CACHE"] = old


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory):
    """One random-weight toy model of each Hugging Face architecture, built once per session (read only)."""
    from headprobe.testing import ARCHS, build_toy_hf_model

    root = tmp_path_factory.mktemp("hf")
    return {a: build_toy_hf_model(a, root / a, layers=6 if a == "gemma3" else 4) for a in ARCHS}


def pytest_addoption(parser):
    parser.addoption(
        "--trained",
        default=None,
        help="a study's runs folder (RESULTS/runs): probe its trained toys (tests/test_toy_retrieval.py) "
        "instead of training toy-d64 there",
    )


@pytest.fixture(scope="session")
def trained_runs(request, tmp_path_factory):
    """A study's runs folder of trained toys: ``--trained RUNS``, or else toy-d64 seeds 0 and 1 trained here by
    the shipped toy recipe's pt (800 steps, one process per seed on the two cores: 2.5 minutes on the
    development machine of 2026-12-04, 11 on a slower one). Two seeds, because whether a seed retrieves
    depends on float rounding, hence on the CPU: on an AVX2-only EPYC (2026-12-05) seed 0 reached only
    25% / 34% of the test probe where the 2026-12-04 machine's seed 0 reached 59% / 75%, and seed 1 88% /
    69%; in the 3-seed study 2 of 3 seeds retrieve (docs/training.md)."""
    from pathlib import Path

    folder = request.config.getoption("--trained")
    if folder is None:
        from trainer.grid import run_grid

        runs = tmp_path_factory.mktemp("trained") / "runs"
        run_grid("toy", runs, members=["d64"], stages=["pt"], seeds=[0, 1], log=lambda _message: None, jobs=2)
        return runs
    if not (Path(folder) / "manifest.json").is_file():
        raise pytest.UsageError(f"--trained {folder}: no manifest.json there (give a study's runs folder)")
    return Path(folder)
