"""Wheels for running ``benchmarks/gpu_check.py`` on a lent GPU machine that has no package index.

    python benchmarks/device_wheels.py [--out .whl]        # here, where PyPI is reachable (make device-wheels)

The lent machines' image (``/work/.library/device/KINDS.md``, read 2026-11-17) holds PyTorch, Triton,
pandas, typer, rich, transformers... but not every package headprobe imports. This downloads, for that
machine's Python (3.12, x86-64 manylinux), the versions installed *here* of the missing ones
(:data:`MISSING`, found by importing headprobe's model, metrics, analysis, evaluation and CLI with
``python -X importtime`` and comparing with the image's list), builds wheels of the source-only ones and
of headprobe itself (so its trainer plugin's entry point exists there), into ``--out`` (about 5 MB;
``.whl/`` is git-ignored). On the machine, one call (``docs/benchmarks.md``, section gpu-check):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site python3 benchmarks/gpu_check.py --json $OUT/gpu_check.json; cp docs/benchmarks.md $OUT/
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MISSING = [  # imported by headprobe (directly or by transformer-lens at import), absent from the image
    "transformer-lens", "datasets", "dill", "multiprocess", "httpx2", "httpcore2", "truststore", "defusedxml",
    "nltk", "rouge-score", "wonderwords", "pytz", "sniffio",
]  # fmt: skip
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]


def pinned(names: list[str]) -> list[str]:
    """``name==version`` of each, as installed here (raises naming what is not installed)."""
    absent = [n for n in names if not _installed(n)]
    if absent:
        raise SystemExit(f"not installed here: {absent}; run `make setup` first")
    return [f"{n}=={md.version(n)}" for n in names]


def _installed(name: str) -> bool:
    try:
        md.version(name)
    except md.PackageNotFoundError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / ".whl")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    download = [*pip, "download", "-q", "--no-deps"]
    platform = [arg for p in PLATFORMS for arg in ("--platform", p)]
    with tempfile.TemporaryDirectory() as tmp:
        # binary wheels for Python 3.12 where they exist; the rest as source, built into wheels below
        for spec in pinned(MISSING):
            binary = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", *platform]
            got = subprocess.run([*download, *binary, "-d", str(out), spec], capture_output=True)
            if got.returncode != 0:
                subprocess.run([*download, "--no-binary=:all:", "-d", tmp, spec], check=True)
        sources = sorted(Path(tmp).iterdir())
        if sources:
            subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", str(out), *map(str, sources)], check=True)
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT)], check=True)
    wheels = sorted(out.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels) / 2**20
    print(f"{len(wheels)} wheels, {size:.1f} MiB in {out}:\n  " + "\n  ".join(w.name for w in wheels))


if __name__ == "__main__":
    main()
