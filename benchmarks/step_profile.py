"""Where a toy training step's time goes: the trainer's own step, profiled by kind of work.

    python benchmarks/step_profile.py [--preset toy-d64] [--steps 4] [--no-write]

The toy recipe's pt run (``trainer/configs/toy.json``: 4 x 512 tokens of the curriculum per step, one
torch thread) is set up by the trainer itself; after two warm-up steps, ``--steps`` calls of
``Trainer.train_step`` (batches made from the curriculum, forward, backward, clipping, AdamW) run under
``torch.profiler``. Each operator's *self* time (time not spent in the operators it calls) goes to one kind,
the kind of the outermost operator it runs inside that has one (:func:`event_kind`):

* matrix products: ``aten::mm``/``addmm``/``bmm``/``linear`` ... (projections, MLP, LM head), forward and backward;
* attention: SDPA's fused kernels, forward and backward;
* loss: log-softmax, NLL and their gradients;
* optimizer: AdamW's step and gradient clipping;
* other operators: norms, RoPE, SwiGLU's product, residual adds, copies, casts;
* outside operators: the rest of the step's wall time (Python, batch making, the profiler's own cost).

Run it on each host whose speed matters (issue 29: an AVX2-only AMD EPYC host took 3x this Xeon's step):
the kind that grows is where that host's time goes. Results go to docs/benchmarks.md (section
``train-step-profile``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from importlib.resources import files
from pathlib import Path

import torch

KINDS = ("matrix products", "attention", "loss", "optimizer", "other operators", "outside operators")


def kind(op: str) -> str:
    """The kind of work an operator's name says it does (see the module docstring)."""
    name = op.lower()
    if any(k in name for k in ("scaled_dot_product", "flash_attention", "efficient_attention", "_sdpa")):
        return "attention"
    if any(name.endswith(k) for k in ("::mm", "::addmm", "::bmm", "::matmul", "::linear", "::baddbmm")):
        return "matrix products"
    if any(k in name for k in ("softmax", "nll_loss", "cross_entropy")):
        return "loss"
    if "_foreach" in name or "optimizer." in name or "clip_grad" in name:
        return "optimizer"
    return "other operators"


def event_kind(event) -> str:
    """An operator's kind, or that of the outermost operator it runs inside that has one: AdamW's ``lerp_``
    counts as optimizer, a ``mul`` inside SDPA's backward as attention."""
    chain = []
    while event is not None:
        chain.append(event)
        event = event.cpu_parent
    for outer in reversed(chain):
        found = kind(outer.name)
        if found != "other operators":
            return found
    return "other operators"


def trainer_for(preset: str, out: str):
    """The trainer of the toy recipe's pt run for ``preset``, set up (model, optimizer, curriculum)."""
    from trainer.config import TrainConfig
    from trainer.distributed import init_world
    from trainer.train import Trainer

    recipe = json.loads(files("trainer.configs").joinpath("toy.json").read_text())
    settings = {k: v for k, v in recipe["runs"]["pt"].items() if k != "stage"}
    settings["curriculum"] = str(files("trainer.configs").joinpath(settings["curriculum"]))
    cfg = TrainConfig(preset=preset, out=out, stage="pt", progress=False, **settings)
    torch.set_num_threads(cfg.threads or 1)
    return Trainer(cfg, init_world("cpu")).setup()


def profile(preset: str, steps: int) -> tuple[dict[str, float], float]:
    """Milliseconds per step by kind, and the trainer's own step time in seconds (median, unprofiled)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with tempfile.TemporaryDirectory() as tmp:
        trainer = trainer_for(preset, str(Path(tmp) / "run"))
        for step in range(2):
            trainer.train_step(step)
        plain = sorted(trainer.train_step(2 + i).seconds for i in range(steps))
        t0 = time.perf_counter()
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(steps):
                trainer.train_step(2 + steps + i)
        wall = time.perf_counter() - t0
    per_kind: dict[str, float] = defaultdict(float)
    for event in prof.events():
        per_kind[event_kind(event)] += event.self_cpu_time_total / 1e3 / steps
    per_kind["outside operators"] = max(0.0, wall * 1e3 / steps - sum(per_kind.values()))
    return dict(per_kind), plain[len(plain) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="toy-d64")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    from _report import machine, publish, today

    per_kind, step_s = profile(args.preset, args.steps)
    total = sum(per_kind.values())
    matrix = per_kind.get("matrix products", 0.0)
    lines = [
        f"## Where a toy training step's time goes — {today()}",
        "",
        f"Machine: {machine()}. Command: `python benchmarks/step_profile.py --preset {args.preset} "
        f"--steps {args.steps}`.",
        "",
        f"The toy recipe's pt step of {args.preset} (4 x 512 tokens of the curriculum, one torch thread) takes "
        f"{step_s:.3f} s in the trainer (median of {args.steps}, unprofiled); under `torch.profiler` "
        f"{total:.0f} ms. Operators' self time by kind (see the script's docstring):",
        "",
        "| kind | ms per step | share |",
        "|---|---:|---:|",
        *(f"| {k} | {per_kind.get(k, 0.0):.1f} | {per_kind.get(k, 0.0) / total:.0%} |" for k in KINDS),
        "",
        f"A step twice as fast on this core ({total / 2:.0f} ms) would leave {total / 2 - matrix:.0f} ms for "
        f"everything but the matrix products ({total - matrix:.0f} ms now), which already run close to one "
        "core's float32 peak. `torch.compile` of the blocks did not shorten the step (207-224 ms against "
        "213 ms after 12-18 s of compiling, measured by hand on 2026-12-05); bf16 matrix products would, on "
        "hosts with bf16 units (AMX here, none on the AVX2-only EPYC), but change the numbers.",
    ]
    publish("train-step-profile", lines, not args.no_write)


if __name__ == "__main__":
    main()
