"""``headprobe graft BASE DONOR``: each part set's hybrid (:func:`headprobe.graft.hybrid.grafted`) measured
beside BASE and DONOR on the same needle prompts and held-out rows (:mod:`headprobe.graft.measure`).

Output, in ``OUT/<base>/`` (tables through :mod:`headprobe.results`):

* ``graft``: one row per part set x metric x length (``parts`` ``none`` is BASE, ``all`` is DONOR);
* ``parts/``: one table per part set with its resume key: a rerun skips the finished ones, and adds the
  part sets it names to the folder's table.

BASE and DONOR must be one architecture: another configuration, other parameter names or shapes are refused
in one line before any prompt is built (:func:`headprobe.graft.hybrid.check_compatible`). ``OUT/run.json``
records the command and settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from headprobe.analysis.items import needle_prompts
from headprobe.analysis.settings import AnalyzeSettings
from headprobe.core.progress import Progress
from headprobe.core.resume import done_earlier, resume_key
from headprobe.graft.hybrid import GraftError, check_compatible, grafted, selected
from headprobe.graft.measure import heldout_losses, needle_measures
from headprobe.graft.parts import parse_parts
from headprobe.graft.settings import GraftSettings
from headprobe.hooked import HookedModel, load_model, parse_dtype
from headprobe.jobs.job import Env, Job, Plan, Target, run_job
from headprobe.jobs.parts import Parts, check_parts
from headprobe.jobs.provenance import table_meta, write_results
from headprobe.jobs.record import RunReport
from headprobe.results import Column, Schema
from headprobe.text.needles import NeedleError, NeedlePrompt

GRAFT = Schema(
    "graft",
    (
        Column("base", "str", "the model the parts were grafted into"),
        Column("donor", "str", "the model they came from"),
        Column("parts", "str", "the part set grafted: none (the base itself), all (the donor itself), or groups"),
        Column("n_parameters", "int", "parameter tensors grafted"),
        Column(
            "metric",
            "str",
            "needle_accuracy, needle_prefix, retrieval_heads, forced_retrieval_heads, reading_heads, top_forced_mass, "
            "eval_loss, "
            "eval_loss_local or eval_loss_retrieval (headprobe.graft.measure)",
        ),
        Column("length", "int", "needle prompt length in tokens (0 for the held-out losses)"),
        Column("value", "float", "the metric's value"),
        Column("n", "int", "needle prompts, or target tokens of a held-out loss"),
    ),
)


def measure_model(model: HookedModel, prompts: dict[int, list[NeedlePrompt]], s: GraftSettings) -> list[dict]:
    """Every :mod:`headprobe.graft.measure` row of one model: the needles at each length, then the held-out
    losses (when ``s.heldout``)."""
    rows = [
        {"metric": metric, "length": n, "value": value, "n": count}
        for length, made in prompts.items()
        for metric, n, value, count in needle_measures(model, made, length, s.max_new_tokens, s.needle_reach)
    ]
    if s.heldout:
        rows += [{"metric": m, "length": 0, "value": v, "n": c} for m, (v, c) in heldout_losses(model).items()]
    return rows


def part_key(s: GraftSettings, base: Path, base_model: HookedModel, parts: str) -> dict[str, Any]:
    """What decides one part set's rows: both checkpoints, the part set and every measuring setting."""
    d = s.to_dict()
    return resume_key(
        checkpoint=str(base.resolve()), donor=d["donor"], parts=parts, prompt_start=base_model.prompt_start,
        **{k: d[k] for k in ("lengths", "samples", "needles", "needle_reach", "prompt_format", "max_new_tokens",
                             "seed", "heldout", "dtype")},
        **s.files(),
    )  # fmt: skip


class GraftJob(Job[GraftSettings]):
    """``headprobe graft`` (the module docstring): every part set of one base checkpoint."""

    command = "graft"
    adds = ("parts",)

    def reads(self) -> list[str | Path | None]:
        return [self.settings.donor, self.settings.needles]

    def plan(self, target: Target, env: Env) -> Plan[str]:
        s, progress, name, path, folder = self.settings, env.progress, target.name, target.path, target.folder
        dtype = parse_dtype(s.dtype)
        base = load_model(path, device=env.device, dtype=dtype, log=progress.log)
        donor = load_model(s.donor, device=env.device, dtype=dtype, log=progress.log)
        check_compatible(base, donor)
        sets, chosen = [], {}
        for p in s.part_sets():
            chosen[p] = selected(base, parse_parts(p))  # a set naming nothing: refused here
            twin = next((q for q in sets if chosen[q] == chosen[p] and p not in ("none", "all")), None)
            if twin is not None and s.parts is None:  # a default set of the very weights of another (tied)
                progress.log(
                    f"{name}: {p} grafts the same weights as {twin} (tied in {name}): measured once, as {twin}"
                )
                continue
            sets.append(p)
        analyze = AnalyzeSettings(lengths=s.lengths, samples=s.samples, seed=s.seed, needles=s.needles,
                                  prompt_format=s.prompt_format, needle_reach=s.needle_reach)  # fmt: skip
        try:
            prompts = {n: needle_prompts(base, n, analyze) for n in s.lengths}
        except NeedleError as err:  # too short for the needle and its question
            raise GraftError(f"{name}: {err}; use longer `lengths`") from None
        for made in prompts.values():
            for p in made:
                base.check_length(p.length + s.max_new_tokens)
        parts = Parts(folder)
        keys = {p: part_key(s, path, base, p) for p in sets}
        check_parts(parts, list(keys.values()), folder, ("parts",), by="parts")
        progress.start(len(sets), name)
        todo = []
        for p in sets:
            if parts.done(GRAFT.table, _part(p), keys[p]):
                progress.log(done_earlier(f"{name} graft {p}", 1, 1))
                progress.advance()
            else:
                todo.append(p)

        def do(p: str) -> None:
            progress.describe(f"{name} + {donor.name}: {p}")
            model = base if p == "none" else donor if p == "all" else grafted(base, donor, p)
            rows = pd.DataFrame.from_records(measure_model(model, prompts, s))
            frame = rows.assign(base=name, donor=donor.name, parts=p, n_parameters=len(chosen[p]), model=name)
            parts.write(GRAFT, _part(p), frame, table_meta(GRAFT.table, name, path, s.to_dict(), key=keys[p]))
            progress.advance()

        def finish() -> pd.DataFrame:
            held = parts.keys(GRAFT.table)
            names = [_part(p) for p in sets] + sorted(k for k in held if k not in {_part(p) for p in sets} and held[k])
            table = parts.gather(GRAFT.table, names)
            settings = s.to_dict() | {"parts": list(dict.fromkeys(table["parts"]))}
            write_results(folder, name, path, settings, [(GRAFT, table)], base.facts())
            return table

        return Plan(todo, do, finish, names=lambda p: [f"graft {p}"], error=GraftError)


def _part(parts: str) -> str:
    """A part set's resumable part file name (``mlp_0-1+attn_3``)."""
    return "parts-" + parts.replace(":", "_").replace("*", "~").replace("/", "_")


def graft(
    bases: Sequence[str | Path],
    out: str | Path,
    settings: GraftSettings,
    *,
    device: str = "cpu",
    memory_limit: int | None = None,
    progress: Progress | None = None,
) -> RunReport[pd.DataFrame]:
    """Graft ``settings.donor``'s parts into each of ``bases`` and measure every hybrid (the module docstring):
    :func:`headprobe.jobs.job.run_job` of a :class:`GraftJob`. Bad settings fail the run before any model loads."""
    return run_job(GraftJob(settings), bases, out, device=device, memory_limit=memory_limit, progress=progress)
