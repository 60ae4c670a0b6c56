"""The trainer: learning, exact resume after a kill, freezing, SFT masking, accumulation, the grid,
and bad input. Multi-process equivalence lives in test_distributed.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from headprobe.model.checkpoint import load_checkpoint, save_checkpoint
from headprobe.model.tokenizer import ByteTokenizer
from headprobe.model.transformer import Transformer
from headprobe.testing import tiny_config
from trainer.config import TrainConfig, TrainError
from trainer.data import DataError, Sampler, synth
from trainer.sft import SftData, builtin_examples
from trainer.train import train

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def model_config(tmp_path) -> Path:
    path = tmp_path / "model.json"
    path.write_text(tiny_config(vocab_size=264, max_seq_len=64).to_json())
    return path


def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def quick(out, model_config, **kw) -> TrainConfig:
    base = dict(
        config=str(model_config),
        out=str(out),
        steps=12,
        batch_size=4,
        seq_len=64,
        lr=3e-3,
        warmup_steps=2,
        progress=False,
    )
    base.update(kw)
    return TrainConfig(**base)


def test_loss_falls_on_the_builtin_corpus(tmp_path, model_config):
    result = train(quick(tmp_path / "run", model_config, steps=40, batch_size=8, lr=1e-2))
    curve = losses(tmp_path / "run")
    assert len(curve) == 40 and result.steps == 40 and not result.interrupted
    assert np.mean(curve[-5:]) < np.mean(curve[:5]) - 1.0  # from ~ln(264)=5.6 down by more than a nat
    model, tok = load_checkpoint(tmp_path / "run" / "final")
    assert isinstance(tok, ByteTokenizer) and model.cfg == tiny_config(vocab_size=264, max_seq_len=64)
    assert json.loads((tmp_path / "run" / "result.json").read_text())["steps"] == 40


def test_micro_batches_accumulate_to_the_same_update(tmp_path, model_config):
    train(quick(tmp_path / "one", model_config))
    train(quick(tmp_path / "acc", model_config, micro_batch_size=1))
    np.testing.assert_allclose(losses(tmp_path / "acc"), losses(tmp_path / "one"), rtol=1e-5)


def _launch(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "headprobe", "train", *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for_steps(run: Path, n: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    metrics = run / "metrics.jsonl"
    while time.time() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"trainer exited early: {proc.stdout.read()}")
        time.sleep(0.05)
    raise AssertionError("trainer did not reach the step in time")


@pytest.mark.parametrize("how", ["ctrl-c", "kill -9"])
def test_resume_after_interruption_reproduces_the_uninterrupted_run(tmp_path, model_config, how):
    args = [
        "--config",
        str(model_config),
        "--steps",
        "60",
        "--batch-size",
        "4",
        "--seq-len",
        "64",
        "--warmup-steps",
        "3",
        "--save-every",
        "5",
        "--keep",
        "2",
    ]
    train(quick(tmp_path / "whole", model_config, steps=60, warmup_steps=3))

    proc = _launch([*args, "--out", str(tmp_path / "cut")])
    _wait_for_steps(tmp_path / "cut", 12, proc)
    if how == "ctrl-c":
        proc.send_signal(signal.SIGINT)
        output = proc.communicate(timeout=120)[0]
        assert proc.returncode == 130, output  # stopped, not done: `train ... && analyze RUN/final` stops too
        assert f"interrupted: the step checkpoint {tmp_path / 'cut'}/step_" in output
    else:
        proc.kill()
        proc.wait()
    steps = sorted(p.name for p in (tmp_path / "cut").glob("step_*"))
    assert 1 <= len(steps) <= 2  # --keep 2
    assert not (tmp_path / "cut" / "final").exists()

    resumed = _launch([*args, "--out", str(tmp_path / "cut"), "--resume"])
    output = resumed.communicate(timeout=300)[0]
    assert resumed.returncode == 0, output
    assert losses(tmp_path / "cut") == losses(tmp_path / "whole")  # bit for bit, no duplicate steps
    a = load_file(str(tmp_path / "cut" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "whole" / "final" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_cpt_with_frozen_attention(tmp_path, model_config):
    train(quick(tmp_path / "pt", model_config, steps=3))
    before = load_file(str(tmp_path / "pt" / "final" / "model.safetensors"))
    train(
        TrainConfig(
            stage="cpt",
            init=str(tmp_path / "pt" / "final"),
            out=str(tmp_path / "cpt"),
            steps=4,
            batch_size=2,
            seq_len=128,
            freeze="attention",
            rope_theta_full=2000.0,
            progress=False,
        )
    )
    after = load_file(str(tmp_path / "cpt" / "final" / "model.safetensors"))
    attn = [k for k in before if any(f".attn.{p}_proj" in k for p in "qkvo")]
    assert len(attn) == 4 * 4
    assert all(torch.equal(before[k], after[k]) for k in attn)
    assert all(not torch.equal(before[k], after[k]) for k in before if k not in attn)
    cfg = json.loads((tmp_path / "cpt" / "final" / "config.json").read_text())
    assert cfg["full"]["rope_theta"] == 2000.0 and cfg["max_seq_len"] == 128


def test_qk_norm_trains_a_pt_model_with_it_and_frozen_cpt_keeps_its_gains(tmp_path, model_config):
    train(quick(tmp_path / "pt", model_config, steps=3, qk_norm=True))
    cfg = json.loads((tmp_path / "pt" / "final" / "config.json").read_text())
    assert cfg["swa"]["qk_norm"] is True and cfg["full"]["qk_norm"] is True
    before = load_file(str(tmp_path / "pt" / "final" / "model.safetensors"))
    gains = [k for k in before if k.endswith(("q_norm.weight", "k_norm.weight"))]
    assert len(gains) == 2 * 4 and any(not torch.equal(before[k], torch.ones_like(before[k])) for k in gains)
    cpt = dict(stage="cpt", init=str(tmp_path / "pt" / "final"), steps=2, batch_size=2, seq_len=64, progress=False)
    train(TrainConfig(**cpt, out=str(tmp_path / "cpt"), freeze="attention"))
    after = load_file(str(tmp_path / "cpt" / "final" / "model.safetensors"))
    assert all(torch.equal(before[k], after[k]) for k in gains)  # frozen attention: its gains too
    with pytest.raises(TrainError, match="`qk_norm` is a pt setting"):
        train(TrainConfig(**cpt, out=str(tmp_path / "cpt2"), qk_norm=True))
    with pytest.raises(TrainError, match="`qk_norm_scale` is a pt setting"):
        train(TrainConfig(**cpt, out=str(tmp_path / "cpt2"), qk_norm_scale=8.0))


def test_qk_norm_scale_is_written_into_every_layer_and_needs_qk_norm(tmp_path, model_config):
    train(quick(tmp_path / "pt", model_config, steps=1, qk_norm=True, qk_norm_scale=8.0))
    cfg = json.loads((tmp_path / "pt" / "final" / "config.json").read_text())
    assert [cfg[t]["qk_norm_scale"] for t in ("swa", "full")] == [8.0, 8.0]
    with pytest.raises(TrainError, match=r"`qk_norm_scale` bounds the logits .*: set `qk_norm` too"):
        train(quick(tmp_path / "pt2", model_config, steps=1, qk_norm_scale=8.0))


def test_cpt_freezing_only_full_layers(tmp_path, model_config):
    train(quick(tmp_path / "pt", model_config, steps=2))
    train(
        TrainConfig(
            stage="cpt",
            init=str(tmp_path / "pt" / "final"),
            out=str(tmp_path / "cpt"),
            steps=2,
            batch_size=2,
            seq_len=64,
            freeze="attention-full",
            progress=False,
        )
    )
    before = load_file(str(tmp_path / "pt" / "final" / "model.safetensors"))
    after = load_file(str(tmp_path / "cpt" / "final" / "model.safetensors"))
    assert torch.equal(before["blocks.3.attn.q_proj.weight"], after["blocks.3.attn.q_proj.weight"])
    assert not torch.equal(before["blocks.0.attn.q_proj.weight"], after["blocks.0.attn.q_proj.weight"])


def test_sft_loss_counts_response_tokens_only(tmp_path):
    """The first logged loss (before any update) must equal the cross-entropy over response tokens of
    the examples the sampler picked, computed here position by position."""
    model = Transformer(tiny_config(vocab_size=264, max_seq_len=512))
    save_checkpoint(model, tmp_path / "init")
    train(
        TrainConfig(
            stage="sft",
            init=str(tmp_path / "init"),
            out=str(tmp_path / "sft"),
            steps=1,
            batch_size=3,
            seq_len=512,
            lr=1e-3,
            progress=False,
        )
    )
    logged = losses(tmp_path / "sft")[0]
    items = SftData(builtin_examples(4096, seed=0), ByteTokenizer(), 512)
    picked = Sampler(len(items), 3, seed=0).batch(0)
    total, count = 0.0, 0
    with torch.no_grad():
        for i in picked:
            tokens, mask = items[int(i)]
            logp = torch.log_softmax(model(torch.tensor(tokens[None, :-1]))[0].double(), -1)
            for pos in range(1, len(tokens)):
                if mask[pos]:
                    total -= float(logp[pos - 1, tokens[pos]])
                    count += 1
    assert count < sum(len(items[int(i)][0]) - 1 for i in picked)  # prompts really are excluded
    assert logged == pytest.approx(total / count, rel=1e-5)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(stage="cpt"), "give `init`"),
        (dict(init="x"), "`init` is for cpt/sft"),
        (dict(preset="toy-d16"), "exactly one of `preset`"),
        (dict(tokens=1000), "exactly one of `steps` or `tokens`"),
        (dict(batch_size=4, micro_batch_size=3), "does not divide"),
        (dict(freeze="mlp"), "`freeze`: unknown freeze 'mlp'"),
    ],
)
def test_bad_options(tmp_path, model_config, kw, match):
    with pytest.raises(TrainError, match=match):
        train(quick(tmp_path / "run", model_config, **kw))


def test_existing_run_needs_resume_and_same_data(tmp_path, model_config):
    train(quick(tmp_path / "run", model_config, steps=2))
    with pytest.raises(TrainError, match="pass `resume`"):
        train(quick(tmp_path / "run", model_config, steps=4))
    with pytest.raises(TrainError, match=r"training settings differ \(saved vs now: steps 2 vs 4; batch_size 4 vs 8\)"):
        train(quick(tmp_path / "run", model_config, steps=4, resume=True, batch_size=8))


def test_data_with_a_larger_vocabulary_is_refused(tmp_path, model_config):
    class Big(ByteTokenizer):
        vocab_size = 1000

    synth(5000, tmp_path / "data", tokenizer=Big())
    with pytest.raises(DataError, match="1,000 ids but the model has vocab_size=264"):
        train(quick(tmp_path / "run", model_config, data=str(tmp_path / "data"), tokenizer="byte"))


def test_activation_checkpointing_changes_memory_not_results(tmp_path, model_config):
    train(quick(tmp_path / "plain", model_config, steps=3))
    train(quick(tmp_path / "ckpt", model_config, steps=3, activation_checkpointing=True))
    assert losses(tmp_path / "ckpt") == losses(tmp_path / "plain")


def test_data_from_another_tokenizer_is_refused(tmp_path, model_config):
    from headprobe.model.tokenizer import load_tokenizer
    from headprobe.testing import build_toy_bpe
    from trainer.data import prepare

    (tmp_path / "doc.txt").write_text("the north door is quiet " * 300)
    prepare(
        [tmp_path / "doc.txt"], load_tokenizer(build_toy_bpe(tmp_path / "tok.json", vocab_size=260)), tmp_path / "bpe"
    )
    with pytest.raises(DataError, match=r"tokenised with .* but the model uses 'byte'"):
        train(quick(tmp_path / "run", model_config, data=str(tmp_path / "bpe"), tokenizer="byte"))


def test_compiled_blocks_train_like_eager_ones(tmp_path, model_config):
    train(quick(tmp_path / "eager", model_config, steps=3))
    train(quick(tmp_path / "compiled", model_config, steps=3, compile=True))
    np.testing.assert_allclose(losses(tmp_path / "compiled"), losses(tmp_path / "eager"), rtol=1e-5)


def test_train_step_reports_the_mean_token_loss_of_its_batch(tmp_path, model_config):
    """Trainer.train_step(0) on its own: the loss it reports is the mean cross-entropy of the step's batch
    under the weights before the step (computed here from the batch, independently of the loop), split
    into micro-batches or not."""
    import copy

    import torch.nn.functional as F

    from trainer.distributed import init_world
    from trainer.train import Trainer

    for micro in (None, 1):
        cfg = quick(tmp_path / f"run-{micro}", model_config, micro_batch_size=micro)
        trainer = Trainer(cfg, init_world("cpu")).setup()
        before = copy.deepcopy(trainer.model).eval()
        (batch,) = trainer.source.micro_batches(0, 0, 1, 4, 4)
        x, y = torch.from_numpy(batch.inputs), torch.from_numpy(batch.targets)
        m = torch.from_numpy(batch.loss_mask)
        with torch.no_grad():
            logits = before(x).double()
        want = (F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none") * m.flatten()).sum() / m.sum()
        stats = trainer.train_step(0)
        assert stats.loss == pytest.approx(float(want), rel=1e-5)
        assert stats.tokens == 4 * 64 and stats.positions == x.numel() and stats.grad_norm > 0
        pairs = zip(before.parameters(), trainer.model.parameters(), strict=True)
        changed = any(not torch.equal(a, b) for a, b in pairs)
        assert changed  # the optimizer stepped


def test_threads_apply_during_the_run_and_are_restored(tmp_path, model_config, monkeypatch):
    seen = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (seen.append(n), real(n)))
    before = torch.get_num_threads()
    train(quick(tmp_path / "run", model_config, steps=1, threads=1))
    assert seen == [1, before] and torch.get_num_threads() == before
    assert json.loads((tmp_path / "run" / "train_config.json").read_text())["threads"] == 1
    with pytest.raises(TrainError, match="`threads`: give at least 1, got 0"):  # refused as the config is made
        quick(tmp_path / "run2", model_config, threads=0)
