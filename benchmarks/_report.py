"""Shared benchmark plumbing: machine description, peak-memory sampling, docs/benchmarks.md sections."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
_PAGE = os.sysconf("SC_PAGE_SIZE")


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PHYS_PAGES") * _PAGE / 2**30
    threads = torch.get_num_threads()
    return f"{cpu}, {os.cpu_count()} cores ({threads} torch threads), {mem:.0f} GiB RAM, torch {torch.__version__}"


def rss() -> int:
    """Resident set size of this process in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def measure(fn: Callable[[], object], repeats: int) -> tuple[float, int]:
    """Median seconds of ``repeats`` calls and the peak RSS growth (bytes) above the level before them.

    Run with ``MALLOC_MMAP_THRESHOLD_`` small (the benchmark scripts re-exec themselves so) so that
    freed tensors leave RSS and the sampled peak reflects live memory.
    """
    base = rss()
    peak = base
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, rss())
            time.sleep(0.0005)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    times = []
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            peak = max(peak, rss())
    finally:
        stop.set()
        thread.join()
    times.sort()
    return times[len(times) // 2], peak - base


def run_child(
    script: str,
    args: list,
    timeout: float | None = None,
    for_memory: bool = True,
    address_space: int | None = None,
    env: dict[str, str] | None = None,
) -> dict:
    """Run ``script --child JSON(args)`` in a fresh interpreter and parse the JSON its last line prints.

    ``for_memory`` mmaps large allocations (``MALLOC_MMAP_THRESHOLD_``) so freed memory leaves RSS and
    :func:`measure` reads true peaks (it slows allocation-heavy code, so timing-only runs turn it off).
    ``address_space`` caps the child's virtual memory. Failures come back as ``{"error": ...}``.
    """
    import json
    import resource
    import subprocess
    import sys

    child_env = {**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})}
    if for_memory:
        child_env["MALLOC_MMAP_THRESHOLD_"] = "65536"

    def limit() -> None:
        if address_space:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, resource.RLIM_INFINITY))

    try:
        out = subprocess.run(
            [sys.executable, script, "--child", json.dumps(args)],
            capture_output=True,
            text=True,
            env=child_env,
            timeout=timeout,
            check=False,
            preexec_fn=limit,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["?"])[-1]
        memory = out.returncode in (-9, 137) or "memory" in out.stderr or "alloc" in out.stderr
        return {"error": "out of memory" if memory else tail[:100]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def write_section(name: str, body: str) -> None:
    """Replace (or append) the section between ``<!-- name:start -->`` and ``<!-- name:end -->``."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n\nRun on demand; see `benchmarks/`.\n"
    block = f"{start}\n{body.rstrip()}\n{end}"
    if start in text and end in text:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    DOCS.write_text(text)


def publish(section: str, lines: list[str], write: bool = True) -> None:
    """Print a benchmark's section (``lines``) and, when ``write``, put it in docs/benchmarks.md
    (:func:`write_section`)."""
    body = "\n".join(lines)
    print(body)
    if write:
        write_section(section, body)


def today() -> str:
    return _dt.date.today().isoformat()
