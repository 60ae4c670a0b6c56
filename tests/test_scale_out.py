"""``torchrun --nproc_per_node=2 -m headprobe analyze|ruler eval|ablate|shortctx eval|graft``: two gloo processes on
the CPU split the work items and write exactly the tables one process writes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from headprobe.model.checkpoint import save_checkpoint
from headprobe.model.transformer import Transformer
from headprobe.results import read_table
from headprobe.testing import tiny_config

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=2"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("ckpts")
    out = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        out.append(save_checkpoint(Transformer(tiny_config(vocab_size=264)), root / f"m{seed}"))
    return out


def run(args: list[str], distributed: bool, log: Path) -> None:
    cmd = [*(TORCHRUN if distributed else [sys.executable]), "-m", "headprobe", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HEADPROBE_LOG_ITEMS": str(log)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


def tables(folder: Path) -> dict[str, pd.DataFrame]:
    """Every result table below ``folder`` (not the resumable parts), by relative path."""
    return {
        str(p.relative_to(folder)): read_table(p).frame
        for p in sorted(folder.rglob("*.parquet"))
        if "parts" not in p.parts
    }


def same_tables(one: Path, two: Path, at_least: int = 2) -> None:
    a, b = tables(one), tables(two)
    assert a.keys() == b.keys() and len(a) >= at_least, (sorted(a), sorted(b))
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name], check_exact=True, obj=name)
        assert a[name].to_csv().encode() == b[name].to_csv().encode(), name  # byte for byte, as text


def split(log: Path) -> dict[str, set[str]]:
    """Which process did which item (each process appends ``rank item`` lines)."""
    by: dict[str, set[str]] = {}
    for line in log.read_text().splitlines():
        rank, item = line.split(" ", 1)
        by.setdefault(rank, set()).add(item)
    return by


def two_and_one(args: list[str], tmp_path: Path, tables_at_least: int = 2) -> dict[str, set[str]]:
    """``args`` run by one process and by two: the same tables (at least ``tables_at_least`` of them); the two
    processes' items, each done once."""
    run([*args, "--out", str(tmp_path / "one")], False, tmp_path / "one.log")
    run([*args, "--out", str(tmp_path / "two")], True, tmp_path / "two.log")
    same_tables(tmp_path / "one", tmp_path / "two", tables_at_least)
    by = split(tmp_path / "two.log")
    assert set(by) == {"0", "1"} and not by["0"] & by["1"]  # both worked, no item twice
    assert by["0"] | by["1"] == split(tmp_path / "one.log")["0"]  # together: every item one process does
    return by


def test_analyze_on_two_processes_writes_what_one_writes(checkpoints, tmp_path):
    args = ["analyze", *map(str, checkpoints), "--metrics", "entropy,erank,retrieval", "--lengths", "256,384",
            "--samples", "2", "--no-progress"]  # fmt: skip
    by = two_and_one(args, tmp_path)
    for unit in ("entropy @ 256 sample", "retrieval @ 384 sample"):  # one checkpoint's samples at one length
        assert {r for r, done in by.items() if any(i.startswith(f"m0 {unit}") for i in done)} == {"0", "1"}


def test_ruler_eval_on_two_processes_writes_what_one_writes(checkpoints, tmp_path):
    args = ["ruler", "eval", *map(str, checkpoints), "--tasks", "niah_single_1,niah_single_2,niah_multikey_1",
            "--lengths", "512", "--samples", "2", "--batch-size", "1", "--no-progress"]  # fmt: skip
    by = two_and_one(args, tmp_path)
    # one model's task at one length: its two samples (batches of one) decoded by different processes
    assert {r for r, done in by.items() if any(i.startswith("m0 niah_single_1 @ 512") for i in done)} == {"0", "1"}
    assert any(p.name.endswith(".p1.jsonl") for p in (tmp_path / "two").rglob("predictions/*.jsonl"))


def test_ablate_on_two_processes_writes_what_one_writes(checkpoints, tmp_path):
    two_and_one(["ablate", *map(str, checkpoints), "--heads", "1.0", "--heads", "0.1,1.1", "--tasks", "needle",
                 "--lengths", "256", "--depths", "25,75", "--samples", "2", "--needles", "codes",
                 "--no-progress"], tmp_path)  # fmt: skip


def test_shortctx_eval_on_two_processes_writes_what_one_writes(checkpoints, tmp_path):
    by = two_and_one(["shortctx", "eval", *map(str, checkpoints), "--task", "builtin", "--limit", "12",
                      "--no-progress"], tmp_path)  # fmt: skip
    assert by == {"0": {"m0 builtin"}, "1": {"m1 builtin"}}  # one item per checkpoint: the checkpoints in turn


def test_items_are_dealt_round_robin_and_the_others_share_is_counted():
    from headprobe.core.ranks import Ranks

    r = Ranks(rank=1, size=3)
    assert [i for i in range(7) if r.mine(i)] == [1, 4]
    assert r.others([5, 6, 7, 8]) == 5 + 7 + 8  # items 0, 2, 3 belong to processes 0, 2, 0
    assert Ranks().others([5, 6]) == 0 and all(Ranks().mine(i) for i in range(3))
    assert r.others([5, 6, 7, 8], deal=1) == 6 + 7  # dealt from 1: items 0-3 to processes 1, 2, 0, 1


def test_graft_on_two_processes_writes_what_one_writes(checkpoints, tmp_path):
    by = two_and_one(
        [
            "graft",
            str(checkpoints[0]),
            str(checkpoints[1]),
            "--parts",
            "mlp",
            "--parts",
            "attn:0",
            "--lengths",
            "256",
            "--samples",
            "2",
            "--needles",
            "codes",
            "--max-new-tokens",
            "8",
            "--no-progress",
        ],
        tmp_path,
        tables_at_least=1,
    )  # fmt: skip (one base: one table)
    assert by["0"] | by["1"] == {f"m0 graft {p}" for p in ("none", "mlp", "attn:0", "all")}
