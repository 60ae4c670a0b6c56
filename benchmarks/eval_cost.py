"""What the held-out evaluation loss costs a training run: the same run with and without it, side by side.

    python benchmarks/eval_cost.py [--preset toy-d64] [--steps 200] [--every 100] [--no-write]

The toy recipe's pt run (``trainer/configs/toy.json``: 4 x 512 tokens of the curriculum per step, one torch
thread, seed 0) trains ``--steps`` steps twice in this process, first with ``eval_every = 0`` (no evaluation
at all), then with ``eval_every = --every`` (the held-out set, :mod:`headprobe.text.heldout`, scored every
``--every`` steps; the last step's scores are the final weights', reused for ``result.json``). Each
evaluation is timed where the trainer calls it (``Trainer.eval_losses``), each step by the trainer itself
(``step_time_s``). The overhead is the evaluations' seconds over the steps' seconds of the same run; for any
run length it is one evaluation over ``--every`` steps. Both runs' losses must agree bit for bit: evaluating
never changes training. Results go to docs/benchmarks.md (section ``eval-loss-cost``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from importlib.resources import files
from pathlib import Path


def run(preset: str, steps: int, every: int, out: Path) -> dict:
    """One pt run of the toy recipe: its wall seconds, step seconds, evaluation seconds, losses."""
    from trainer.config import TrainConfig
    from trainer.train import Trainer, train

    recipe = json.loads(files("trainer.configs").joinpath("toy.json").read_text())
    settings = {k: v for k, v in recipe["runs"]["pt"].items() if k not in ("stage", "steps", "eval_every")}
    settings["curriculum"] = str(files("trainer.configs").joinpath(settings["curriculum"]))
    cfg = TrainConfig(
        preset=preset, out=str(out), stage="pt", steps=steps, eval_every=every, progress=False, **settings
    )
    evals: list[float] = []
    timed = Trainer.eval_losses

    def eval_losses(self):  # the trainer's own call, timed
        t0 = time.perf_counter()
        try:
            return timed(self)
        finally:
            evals.append(time.perf_counter() - t0)

    Trainer.eval_losses = eval_losses
    try:
        t0 = time.perf_counter()
        result = train(cfg)
        wall = time.perf_counter() - t0
    finally:
        Trainer.eval_losses = timed
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {
        "wall": wall,
        "steps_s": sum(r["step_time_s"] for r in rows),
        "evals": evals,
        "losses": [r["loss"] for r in rows],
        "eval_loss": result.eval_loss,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="toy-d64")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    from _report import machine, publish, today

    with tempfile.TemporaryDirectory() as tmp:
        off = run(args.preset, args.steps, 0, Path(tmp) / "off")
        on = run(args.preset, args.steps, args.every, Path(tmp) / "on")
    per_eval = sum(on["evals"]) / len(on["evals"])
    step = on["steps_s"] / args.steps
    same = "identical" if on["losses"] == off["losses"] else "DIFFERENT"
    lines = [
        f"## The held-out evaluation loss: its cost in training — {today()}",
        "",
        f"Machine: {machine()}. Command: `python benchmarks/eval_cost.py --preset {args.preset} --steps "
        f"{args.steps} --every {args.every}`.",
        "",
        f"The toy recipe's pt run of {args.preset} (4 x 512 tokens of the curriculum a step, one torch thread, "
        f"seed 0), {args.steps} steps, without and with the held-out evaluation every {args.every} steps (the "
        "last one also the final weights' for `result.json`), one after the other in one process:",
        "",
        "| run | wall | steps (trainer's step_time_s) | evaluations | evaluation seconds | overhead |",
        "|---|---:|---:|---:|---:|---:|",
        f"| eval_every 0 | {off['wall']:.1f} s | {off['steps_s']:.1f} s | 0 | 0 | — |",
        f"| eval_every {args.every} | {on['wall']:.1f} s | {on['steps_s']:.1f} s | {len(on['evals'])} | "
        f"{sum(on['evals']):.2f} s | {sum(on['evals']) / on['steps_s']:.1%} of the steps' time |",
        "",
        f"One evaluation takes {per_eval:.2f} s ({', '.join(f'{s:.2f}' for s in on['evals'])} s), a step "
        f"{step:.3f} s: every {args.every} steps the evaluation adds {per_eval / (args.every * step):.1%} "
        f"(every 50: {per_eval / (50 * step):.1%}; every 200: {per_eval / (200 * step):.1%}). The wall times "
        f"differ by {on['wall'] - off['wall']:+.1f} s ({(on['wall'] - off['wall']) / off['wall']:+.1%}; on a "
        f"machine shared with other work this difference is noisier than the timed parts). The two runs' "
        f"training losses are {same} step for step; the final held-out loss: {on['eval_loss']:.3f} nats per "
        "target token.",
    ]
    publish("eval-loss-cost", lines, not args.no_write)


if __name__ == "__main__":
    main()
