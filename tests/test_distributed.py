"""Two processes on CPU (gloo) with DDP and FSDP2 reproduce the single-process loss curve."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from headprobe.testing import tiny_config
from trainer.config import TrainConfig
from trainer.train import train
from trainer.train_state import export_step

ROOT = Path(__file__).resolve().parents[1]


def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def torchrun(args: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "headprobe",
        "train",
        *args,
    ]
    out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    folder = tmp_path_factory.mktemp("single")
    cfg = folder / "model.json"
    cfg.write_text(tiny_config(vocab_size=264, max_seq_len=64).to_json())
    train(
        TrainConfig(
            config=str(cfg), out=str(folder / "run"), steps=6, batch_size=4, seq_len=64, warmup_steps=1, progress=False
        )
    )
    return cfg, folder / "run"


@pytest.mark.parametrize("parallel, micro", [("ddp", None), ("ddp", 1), ("fsdp", None)])
def test_two_processes_match_one(tmp_path, single, parallel, micro):
    cfg, reference = single
    args = [
        "--config",
        str(cfg),
        "--out",
        str(tmp_path / "run"),
        "--steps",
        "6",
        "--batch-size",
        "4",
        "--seq-len",
        "64",
        "--warmup-steps",
        "1",
        "--parallel",
        parallel,
    ]
    if micro:
        args += ["--micro-batch-size", str(micro)]
    torchrun(args)
    np.testing.assert_allclose(losses(tmp_path / "run"), losses(reference), rtol=2e-5)
    a = load_file(str(tmp_path / "run" / "final" / "model.safetensors"))
    b = load_file(str(reference / "final" / "model.safetensors"))
    for k in b:
        torch.testing.assert_close(a[k], b[k], atol=2e-5, rtol=1e-4)
    if parallel == "fsdp":  # the sharded step checkpoint exports to the same plain weights
        export_step(tmp_path / "run" / "step_000006", tmp_path / "exported")
        c = load_file(str(tmp_path / "exported" / "model.safetensors"))
        assert all(torch.equal(a[k], c[k]) for k in a)
