"""The same tables from two source trees: every command that runs models, on one checkpoint, compared bit for bit.

    python benchmarks/same_tables.py --before /path/to/old/checkout --checkpoint CKPT [--after .] [--keep DIR]

For a restructuring that must not change results: ``analyze`` (every metric), ``ruler eval``, ``ablate`` and
``shortctx eval`` run once per tree, each in a fresh interpreter with ``PYTHONPATH`` set to that tree (so
``python -m headprobe`` is that tree's code), with small settings and the same arguments. Then every Parquet
table the two runs wrote is read and compared as data (values, dtypes, column and row order, exactly; the
provenance metadata, which names versions and paths, is not compared); a table the new tree extends with rows
(every earlier row identical, in order) is said so with what was added. Prints one line per table and exits
non-zero when any table differs otherwise or is missing from one side.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

COMMANDS = {  # name -> arguments after `python -m headprobe` (CKPT and OUT filled in)
    "analyze": ["analyze", "{ckpt}", "--lengths", "512", "--samples", "2", "--needles", "codes", "--out", "{out}"],
    "ruler": ["ruler", "eval", "{ckpt}", "--tasks", "niah_single_1,niah_single_2", "--lengths", "512",
              "--samples", "4", "--out", "{out}"],
    "ablate": ["ablate", "{ckpt}", "--heads", "1.0", "--tasks", "needle", "--lengths", "512", "--depths", "25,75",
               "--samples", "2", "--needles", "codes", "--out", "{out}"],
    "shortctx": ["shortctx", "eval", "{ckpt}", "--task", "builtin", "--out", "{out}"],
}  # fmt: skip


def run(tree: Path, command: list[str], log: Path) -> float:
    """``python -m headprobe COMMAND`` with ``tree`` first on the path; its seconds. Raises on failure."""
    env = os.environ | {"PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(
            [sys.executable, "-m", "headprobe", *command, "--no-progress"], cwd=tree, env=env, stdout=out, stderr=out
        )
    if done.returncode:
        raise SystemExit(f"{tree}: {' '.join(command)} failed ({done.returncode}); see {log}")
    return time.perf_counter() - start


def tables(folder: Path) -> dict[str, Path]:
    """Every Parquet table under ``folder`` by its path inside it (work-item parts left out)."""
    return {str(p.relative_to(folder)): p for p in sorted(folder.rglob("*.parquet")) if "parts" not in p.parts}


def compare(before: Path, after: Path) -> list[tuple[str, str]]:
    """``(table, verdict)`` for every table of either folder: ``same (N rows)``, ``DIFFERENT: ...`` or
    ``MISSING before|after``."""
    old, new = tables(before), tables(after)
    out = []
    for name in sorted(old.keys() | new.keys()):
        if name not in old or name not in new:
            out.append((name, f"MISSING {'before' if name not in old else 'after'}"))
            continue
        a, b = pd.read_parquet(old[name]), pd.read_parquet(new[name])
        try:
            pd.testing.assert_frame_equal(a, b, check_exact=True)
            out.append((name, f"same ({len(a)} rows)"))
        except AssertionError as err:
            out.append((name, _added(a, b) or "DIFFERENT: " + " ".join(str(err).split())[:200]))
    return out


def _added(old: pd.DataFrame, new: pd.DataFrame) -> str | None:
    """When ``new`` is ``old`` with rows added (every old row identical, in order, and nothing else changed):
    what was added, by the values of its ``statistic`` column where it has one; else ``None``."""
    if list(old.columns) != list(new.columns) or len(new) <= len(old):
        return None
    marked = new.merge(old.drop_duplicates(), how="left", indicator=True)["_merge"].eq("both").to_numpy()
    try:
        pd.testing.assert_frame_equal(old, new[marked].reset_index(drop=True), check_exact=True)
    except AssertionError:
        return None
    added = new[~marked]
    what = sorted(set(added["statistic"])) if "statistic" in added else []
    return f"same on the {len(old)} earlier rows; {len(added)} rows added" + (f" ({', '.join(what)})" if what else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the old source tree (a checkout)")
    parser.add_argument("--after", type=Path, default=Path("."), help="the new source tree (default: here)")
    parser.add_argument("--checkpoint", type=Path, required=True, help="a trained checkpoint folder")
    parser.add_argument("--commands", default=",".join(COMMANDS), help="comma list of " + ",".join(COMMANDS))
    parser.add_argument("--keep", type=Path, help="write the results here (default: a temporary folder)")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="same-tables-"))
    ckpt = args.checkpoint.resolve()
    failed = False
    for name in args.commands.split(","):
        seconds = {}
        for side, tree in (("before", args.before), ("after", args.after)):
            out = root / side / name
            out.parent.mkdir(parents=True, exist_ok=True)
            command = [a.format(ckpt=ckpt, out=out) for a in COMMANDS[name]]
            seconds[side] = run(tree.resolve(), command, root / side / f"{name}.log")
        print(f"{name}: {seconds['before']:.1f} s before, {seconds['after']:.1f} s after")
        for table, verdict in compare(root / "before" / name, root / "after" / name):
            failed |= not verdict.startswith("same")  # "same on the N earlier rows; ... added" included
            print(f"  {table}: {verdict}")
    print(f"results in {root}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
