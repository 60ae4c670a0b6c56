"""The study's findings answered: for each of its eight findings, the statistic that decides it, our value
with a 95% bootstrap interval over seeds, the study's published value where it gives one, and a verdict
(``holds``, ``opposite`` or ``inconclusive``) with its reason. docs/study.md ("Verdicts") defines each
statistic and rule.

The inputs are the study's tidy tables (:mod:`headprobe.study.tables`: ``study_runs``, ``study_probes``,
``study_heads``) and the ``analyze`` tables under ``OUT/analysis`` (``entropy``, ``reordering``,
``erank``). Whatever a finding needs and the tables lack (a table, a column, a run, a member, a second
seed) makes that finding inconclusive, saying what is missing: the verdicts never fail on a study's
tables and never guess. A run whose ``status`` is ``diverged`` is left out of every statistic (a diverged
pt with every run of its member and seed, since they all start from it) and named in the reason.

Members' head shapes come from their presets (:func:`headprobe.model.presets.preset`): the full-attention
layers' head count, query/key width and value width. The published values are the ``findings`` entry of
``figures/reference_values.json``, read as a file (headprobe never imports the figures).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import rankdata

from headprobe.core.errors import HeadprobeError
from headprobe.model.config import ConfigError
from headprobe.model.presets import preset
from headprobe.results import ResultsError, collect, read_table, table_path
from headprobe.study.intervals import Estimate, bootstrap
from headprobe.study.tables import markdown
from headprobe.verdict_table import DIGITS, DIGITS_DEFAULT, VERDICTS, verdict_cells

HOLDS, OPPOSITE, INCONCLUSIVE = "holds", "opposite", "inconclusive"
PT, CPT, FROZEN = "pt", "cpt", "cpt-frozen"  # the recipe's runs the findings compare (trainer/configs/toy.json)
RHO_MARGIN = 0.5  # finding 2: |Spearman rho| below this is "does not predict"
SIMILAR_MARGIN = 0.05  # finding 6: normalised entropies closer than this are "similar"
STUDY_TABLES = ("study_runs", "study_probes", "study_heads")
ANALYSIS_TABLES = ("entropy", "reordering", "erank")
REFERENCE = Path(__file__).resolve().parents[2] / "figures" / "reference_values.json"
RERUN = "rerun the study with a headprobe that records it"


class Inconclusive(HeadprobeError):
    """A finding cannot be decided from these tables; the message is the reason (its non-empty clauses,
    joined by semicolons). Raised and caught inside :func:`verdicts`: it becomes that finding's row."""

    def __init__(self, *clauses: str) -> None:
        super().__init__(joined(*clauses))


def joined(*clauses: str) -> str:
    """A reason from its clauses, the empty ones left out."""
    return "; ".join(c for c in clauses if c)


@dataclass(frozen=True)
class Verdict:
    """One finding's row of :data:`VERDICTS` (see its columns)."""

    finding: int
    title: str
    statistic: str
    unit: str
    value: float = math.nan
    ci_low: float = math.nan
    ci_high: float = math.nan
    published: float = math.nan
    published_scale: str = ""
    published_note: str = ""
    verdict: str = INCONCLUSIVE
    reason: str = ""
    inputs: str = ""
    members: str = ""
    seeds: int = 0


@dataclass(frozen=True)
class Shape:
    """A member's full-attention heads (from its preset): count, query/key width, value width; its layers."""

    scale: str
    heads: int
    qk: int
    v: int
    layers: int

    @property
    def kind(self) -> str:
        return "symmetric" if self.qk == self.v else "wide-qk" if self.qk > self.v else "wide-v"


# ---- the statistics: member means of per-seed values, resampled over seeds --------------------------------


def difference(low: str, high: str) -> Callable[[Mapping[str, np.ndarray]], np.ndarray]:
    """Member ``high``'s mean minus member ``low``'s."""
    return lambda means: means[high][:, 0] - means[low][:, 0]


def mean_over_members(means: Mapping[str, np.ndarray]) -> np.ndarray:
    """The mean over members of each member's mean (every member weighs the same, whatever its seeds)."""
    return np.mean([means[m][:, 0] for m in sorted(means)], axis=0)


def spearman_over_members(means: Mapping[str, np.ndarray]) -> np.ndarray:
    """Spearman's rho between the members' first and second quantities (average ranks for ties); ``nan`` where
    either is the same for every member."""
    members = sorted(means)
    x = rankdata(np.stack([means[m][:, 0] for m in members], axis=1), axis=1)
    y = rankdata(np.stack([means[m][:, 1] for m in members], axis=1), axis=1)
    x, y = x - x.mean(axis=1, keepdims=True), y - y.mean(axis=1, keepdims=True)
    norm = np.sqrt((x**2).sum(axis=1) * (y**2).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norm > 0, (x * y).sum(axis=1) / norm, np.nan)


# ---- the rules --------------------------------------------------------------------------------------------


def _interval(est: Estimate, digits: int) -> str:
    return f"[{est.low:.{digits}f}, {est.high:.{digits}f}]"


def sign_rule(est: Estimate, digits: int, positive: bool = True) -> tuple[str, str]:
    """``holds`` when the interval lies on the finding's side of 0 (above, or below when not ``positive``),
    ``opposite`` when it lies on the other side, else ``inconclusive``."""
    if math.isnan(est.low):
        return INCONCLUSIVE, est.why
    above, below = est.low > 0, est.high < 0
    if above or below:
        side = "above" if above else "below"
        return (HOLDS if above == positive else OPPOSITE), f"the interval {_interval(est, digits)} lies {side} 0"
    return INCONCLUSIVE, f"the interval {_interval(est, digits)} includes 0 (no effect)"


def band_rule(est: Estimate, margin: float, digits: int) -> tuple[str, str]:
    """``holds`` when the interval lies inside (-margin, margin); ``opposite`` when it lies wholly beyond one
    side; else ``inconclusive``."""
    if math.isnan(est.low):
        return INCONCLUSIVE, est.why
    interval = _interval(est, digits)
    if -margin < est.low and est.high < margin:
        return HOLDS, f"the interval {interval} lies within ±{margin}"
    if est.low >= margin or est.high <= -margin:
        return OPPOSITE, f"the interval {interval} lies beyond ±{margin}"
    return INCONCLUSIVE, f"the interval {interval} reaches past ±{margin} without lying beyond it"


# ---- what the findings read -------------------------------------------------------------------------------


def _shape(member: str) -> Shape | None:
    try:
        config = preset(member)
    except ConfigError:
        return None
    return Shape(member.partition("-")[0], config.full.n_heads, config.full.qk_head_dim, config.full.v_head_dim,
                 config.n_layers)  # fmt: skip


@dataclass
class StudyData:
    """The tables the verdicts read, the members' head shapes and the runs left out as diverged."""

    tables: dict[str, pd.DataFrame]
    analysis: dict[str, pd.DataFrame]
    shapes: dict[str, Shape] = field(default_factory=dict)
    diverged: pd.DataFrame = field(default_factory=pd.DataFrame)  # member, seed, run, stage of diverged runs
    unknown: pd.DataFrame = field(default_factory=pd.DataFrame)  # member, seed, run of runs without a status
    no_status: str = ""  # why divergence is unknown everywhere, when it is

    def table(self, name: str, columns: tuple[str, ...], where: str = "study") -> pd.DataFrame:
        """A table holding ``columns`` (and member, seed, run), else :class:`Inconclusive` naming what lacks."""
        frame = (self.tables if where == "study" else self.analysis).get(name, pd.DataFrame())
        if frame.empty:
            writer = "the study" if where == "study" else "the study's analyze step (OUT/analysis)"
            raise Inconclusive(f"no {name!r} table: {writer} did not write one")
        missing = [c for c in ("member", "seed", "run", *columns) if c not in frame or frame[c].isna().all()]
        if missing:
            raise Inconclusive(f"{name} lacks {', '.join(f'`{c}`' for c in missing)}: {RERUN}")
        return frame

    def trained(self, frame: pd.DataFrame) -> pd.DataFrame:
        """``frame`` without the rows of diverged runs (a diverged pt: every run of its member and seed)."""
        if self.no_status:
            raise Inconclusive(self.no_status)
        unknown = self.unknown[_among(self.unknown, frame, ["member", "seed", "run"])] if len(self.unknown) else None
        if unknown is not None and len(unknown):
            names = ", ".join(f"{r.member} s{int(r.seed)} {r.run}" for r in unknown.itertuples())
            raise Inconclusive(f"study_runs gives no `status` for {names}: whether they diverged is unknown; {RERUN}")
        whole = self.diverged[self.diverged.stage == "pt"] if not self.diverged.empty else self.diverged
        out = _among(frame, whole, ["member", "seed"]) | _among(frame, self.diverged, ["member", "seed", "run"])
        return frame[~out]

    def diverged_note(self, members: list[str], runs: tuple[str, ...]) -> str:
        """The diverged runs left out of a statistic over ``members`` and ``runs``, per member and run (a
        diverged pt stands for every later run of its seed); empty when none."""
        if self.diverged.empty:
            return ""
        rows = self.diverged[self.diverged.member.isin(members)]
        pt = rows[rows.stage == "pt"]
        later = rows[(rows.stage != "pt") & rows.run.isin(runs)]
        rows = pd.concat([pt, later[~_among(later, pt, ["member", "seed"])]])
        if rows.empty:
            return ""
        named = [f"{member} {run} of seed{'s' if len(g) > 1 else ''} {', '.join(str(int(s)) for s in sorted(g.seed))}"
                 for (member, run), g in rows.groupby(["member", "run"], sort=True)]  # fmt: skip
        after = " (a diverged pt with every later run of its seed)" if len(pt) else ""
        return f"diverged, left out: {' and '.join(named)}{after}"

    def of_kind(self, kind: str) -> list[str]:
        """Members of one head-shape kind (symmetric, wide-qk, wide-v), of one scale, narrowest first."""
        members = [m for m, s in self.shapes.items() if s.kind == kind]
        scales = sorted({self.shapes[m].scale for m in members})
        if len(scales) > 1:
            raise Inconclusive(f"members of several scales ({', '.join(scales)}): widths compare within one grid")
        return sorted(members, key=lambda m: (self.shapes[m].qk, self.shapes[m].v))

    @property
    def scale(self) -> str | None:
        scales = {s.scale for s in self.shapes.values()}
        return scales.pop() if len(scales) == 1 else None


def study_data(
    tables: Mapping[str, pd.DataFrame] | str | Path, analysis: Mapping[str, pd.DataFrame] | str | Path | None
) -> StudyData:
    """The verdicts' inputs: ``tables`` as frames, or the study folder ``OUT`` (its ``tables/``; then
    ``analysis`` defaults to ``OUT/analysis``); ``analysis`` as frames or a folder of ``analyze`` results."""
    if isinstance(tables, str | Path):
        folder = Path(tables)
        if not folder.is_dir():
            raise ResultsError(f"{folder} is not a folder; give the study's folder (what `headprobe study` wrote)")
        tables = {n: read_table(p).frame for n in STUDY_TABLES if (p := table_path(folder / "tables", n)).is_file()}
        analysis = folder / "analysis" if analysis is None else analysis
    if isinstance(analysis, str | Path):
        found = Path(analysis).is_dir()
        analysis = {n: collect(analysis, n, recursive=True) for n in ANALYSIS_TABLES} if found else {}
    runs = tables.get("study_runs", pd.DataFrame())
    data = StudyData(dict(tables), {n: _labelled(f, runs) for n, f in (analysis or {}).items()})
    members = sorted(set(runs["member"].dropna())) if "member" in runs else []
    data.shapes = {m: s for m in members if (s := _shape(m)) is not None}
    if "status" not in runs or runs["status"].isna().all():
        data.no_status = f"study_runs lacks `status`: whether a run diverged is unknown; {RERUN}"
    else:
        data.diverged = runs[runs.status == "diverged"][["member", "seed", "run", "stage"]]
        data.unknown = runs[runs.status.isna()][["member", "seed", "run"]]
    return data


def _among(frame: pd.DataFrame, keys: pd.DataFrame, columns: list[str]) -> np.ndarray:
    """Whether each row of ``frame`` has its ``columns`` equal to those of some row of ``keys``."""
    if frame.empty or keys.empty:
        return np.zeros(len(frame), dtype=bool)
    key = {"seed": "int64"}
    return pd.MultiIndex.from_frame(frame[columns].astype(key)).isin(
        pd.MultiIndex.from_frame(keys[columns].astype(key))
    )


def _labelled(frame: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """An analysis table with ``member``, ``seed``, ``run`` (joined on ``model`` from ``study_runs``)."""
    if frame.empty or {"member", "seed", "run"} <= set(frame.columns):
        return frame
    if "model" not in frame or not {"model", "member", "seed", "run"} <= set(runs.columns):
        return pd.DataFrame()
    labels = runs[["model", "member", "seed", "run"]].drop_duplicates("model")
    return frame.drop(columns=[c for c in ("member", "seed", "run") if c in frame]).merge(labels, on="model")


def per_seed(frame: pd.DataFrame, values: list[str], data: StudyData) -> pd.DataFrame:
    """``member``, ``seed`` and the mean of each of ``values`` over the other rows (lengths, heads, samples) of
    trained runs; a member x seed missing any value is dropped."""
    frame = data.trained(frame)
    means = frame.groupby(["member", "seed"])[values].mean().reset_index()
    return means.dropna(subset=values)


def samples_of(seeds: pd.DataFrame, members: list[str], values: list[str]) -> dict[str, np.ndarray]:
    """member -> ``[seeds, len(values)]`` for :func:`bootstrap`."""
    return {m: seeds[seeds.member == m][values].to_numpy(dtype=float) for m in members}


def published_values(path: Path = REFERENCE) -> dict[int, tuple[dict[str, float], str]]:
    """finding -> (the study's value by scale, what it measures), from ``figures/reference_values.json``."""
    if not path.is_file():
        return {}
    found = json.loads(path.read_text())["findings"]["values"]
    return {int(n): (dict(entry["by_scale"]), entry["what"]) for n, entry in found.items()}


# ---- the findings -----------------------------------------------------------------------------------------

TOY_RULER = "retrieval is the held-out needle probe: RULER's instructions are beyond the toys"


def _needle(data: StudyData, run: str) -> tuple[pd.DataFrame, int]:
    """The needle probes of ``run`` at the longest distance probed, with ``points`` (accuracy x 100)."""
    probes = data.table("study_probes", ("task", "distance", "accuracy"))
    needle = probes[(probes.task == "needle") & (probes.run == run)]
    if needle.empty:
        raise Inconclusive(
            f"study_probes holds no needle probe of a {run!r} run (the recipe's runs: pt, cpt, cpt-frozen)"
        )
    distance = int(needle.distance.max())
    rows = needle[needle.distance == distance]
    return rows.assign(points=rows.accuracy * 100.0), distance


def _present(seeds: pd.DataFrame, candidates: list[str], what: str, note: str) -> list[str]:
    """The ``candidates`` with a trained, measured seed (in the candidates' order); at least two, else
    :class:`Inconclusive`."""
    present = [m for m in candidates if m in set(seeds.member)]
    if len(present) < 2:
        have = ", ".join(present) or "none"
        of = ", ".join(candidates) or "none in the study"
        raise Inconclusive(f"too few {what} members trained and measured: {have} (of {of})", note)
    return present


def _said(seeds: pd.DataFrame, members: list[str], digits: int, what: str = "seed means") -> str:
    """The members' seed means of ``v`` and their seed counts, as a reason's clause."""
    means = seeds.groupby("member")["v"].agg(["mean", "count"])
    parts = [f"{m} {means.loc[m, 'mean']:.{digits}f} ({int(means.loc[m, 'count'])} seeds)" for m in members]
    return f"{what}: " + ", ".join(parts)


def _decided(base: Verdict, est: Estimate, ruled: tuple[str, str], members: list[str], *clauses: str) -> Verdict:
    """``base`` with the estimate, the verdict and its reason (the rule's, then the ``clauses``)."""
    verdict, why = ruled
    reason = joined(why, *clauses)
    return replace(base, value=est.value, ci_low=est.low, ci_high=est.high, verdict=verdict, reason=reason,
                   members=", ".join(members), seeds=est.seeds)  # fmt: skip


def _compare(base: Verdict, seeds: pd.DataFrame, low: str, high: str, *clauses: str) -> Verdict:
    """``high``'s seed mean minus ``low``'s, decided by :func:`sign_rule`."""
    digits = DIGITS.get(base.unit, DIGITS_DEFAULT)
    est = bootstrap(samples_of(seeds, [low, high], ["v"]), difference(low, high))
    return _decided(base, est, sign_rule(est, digits), [low, high], _said(seeds, [low, high], digits), *clauses)


def wider_retrieve(run: str) -> Callable[[StudyData, Verdict], Verdict]:
    """Findings 1 and 4: needle accuracy at the longest distance after ``run``, widest minus narrowest
    symmetric member."""

    def decide(data: StudyData, base: Verdict) -> Verdict:
        rows, distance = _needle(data, run)
        symmetric = data.of_kind("symmetric")
        note = data.diverged_note(symmetric, (run,))
        seeds = per_seed(rows[rows.member.isin(symmetric)], ["points"], data).rename(columns={"points": "v"})
        present = _present(seeds, symmetric, "symmetric", note)
        low, high = present[0], present[-1]
        base = replace(base, statistic=f"needle accuracy at {distance:,} characters after {run}, {high} minus {low}")
        return _compare(base, seeds, low, high, note, TOY_RULER if data.scale == "toy" else "")

    return decide


def loss_predicts(data: StudyData, base: Verdict) -> Verdict:
    """Finding 2: Spearman's rho over members between eval loss and needle accuracy after cpt."""
    runs = data.table("study_runs", ("eval_loss",))
    rows, distance = _needle(data, CPT)
    loss = per_seed(runs[runs.run == CPT], ["eval_loss"], data)
    seeds = loss.merge(per_seed(rows, ["points"], data), on=["member", "seed"])
    members = sorted(set(seeds.member))
    note = data.diverged_note(sorted(set(runs.member)), (CPT,))
    if len(members) < 4:
        have = ", ".join(members) or "none"
        raise Inconclusive(f"a rank correlation needs 4 members; {have} trained with both", note)
    est = bootstrap(samples_of(seeds, members, ["eval_loss", "points"]), spearman_over_members)
    base = replace(base, statistic=f"Spearman rho over {len(members)} members, eval loss vs needle accuracy at "
                   f"{distance:,} characters, after cpt")  # fmt: skip
    if math.isnan(est.value):
        flat = "needle accuracy" if seeds.groupby("member").points.mean().nunique() == 1 else "eval loss"
        raise Inconclusive(f"{flat} is the same for every member: there is nothing to predict or nothing to predict by")
    means = seeds.groupby("member")[["eval_loss", "points"]].mean()
    said = "seed means (loss, points): " + ", ".join(
        f"{m} {r.eval_loss:.3f}, {r.points:.1f}" for m, r in means.iterrows()
    )
    verdict, why = band_rule(est, RHO_MARGIN, 2)
    if verdict == OPPOSITE:
        why += (
            f": eval loss ranks the members' retrieval ({'lower' if est.value < 0 else 'higher'} loss, more retrieved)"
        )
    return _decided(base, est, (verdict, why), members, said, note)


NEEDLE_MASS_FLOOR = 0.02  # finding 3: below this mean attention mass on the needle, no head of a run retrieves it


def head_fraction(data: StudyData, base: Verdict) -> Verdict:
    """Finding 3: retrieval-head fraction of the full-attention heads after cpt, widest minus narrowest
    symmetric member; Wu's score where every compared run has it, else the needle-reading heads' (teacher-forced
    mass on the needle and its reach >= 0.1; the teacher-forced copy score in tables made before them)."""
    heads = data.table("study_heads", ("layer_type",))
    symmetric = data.of_kind("symmetric")
    rows = data.trained(heads[(heads.layer_type == "full") & (heads.run == CPT) & heads.member.isin(symmetric)])
    note = data.diverged_note(symmetric, (CPT,))
    low, high = (p := _present(rows, symmetric, "symmetric", note))[0], p[-1]
    compared = rows[rows.member.isin([low, high])]
    if "fraction" in rows and compared["fraction"].notna().all():
        column, which = "fraction", "Wu's score (every compared run copied a needle)"
    elif fallback := next((c for c in ("reading_fraction", "forced_fraction") if c in rows), None):
        lacking = sorted(set(compared[compared["fraction"].isna()].member)) if "fraction" in rows else []
        column = fallback
        which = ("the needle-reading heads (teacher-forced mass >= 0.1)" if column == "reading_fraction"
                 else "the teacher-forced score") + (
            f" (Wu's needs a copied needle: none from {', '.join(lacking)})" if lacking else "")  # fmt: skip
    else:
        raise Inconclusive(f"Wu's fraction is missing where no needle was copied and study_heads lacks "
                           f"`reading_fraction` and `forced_fraction`: {RERUN}")  # fmt: skip
    if column != "fraction" and "forced_mass" in compared and compared["forced_mass"].notna().any():
        mass = float(compared["forced_mass"].max())
        if mass < NEEDLE_MASS_FLOOR:  # no head of any compared run looks at the needle: nothing to score
            raise Inconclusive(
                f"no compared run attends to the needle in the analysis prompts (teacher-forced attention mass on "
                f"the needle at most {mass:.4f} of the full-attention heads', below {NEEDLE_MASS_FLOOR}): the "
                "prompts are beyond what these models retrieve, so the fraction (0 or not) says nothing about their "
                "heads; analyse with needles and lengths they answer",
                note,
            )
    seeds = per_seed(compared, [column], data).rename(columns={column: "v"})
    _present(seeds, [low, high], "symmetric", note)
    base = replace(base, statistic=f"retrieval-head fraction of full-attention heads after cpt, {high} minus {low}",
                   inputs=f"study_heads.{column} (layer_type full, run cpt)")  # fmt: skip
    return _compare(base, seeds, low, high, which, note)


def qk_over_v(data: StudyData, base: Verdict) -> Verdict:
    """Finding 5: needle accuracy after cpt, the wide query/key member minus the wide value member."""
    rows, distance = _needle(data, CPT)
    candidates = data.of_kind("wide-qk") + data.of_kind("wide-v")
    note = data.diverged_note(candidates, (CPT,))
    seeds = per_seed(rows[rows.member.isin(candidates)], ["points"], data).rename(columns={"points": "v"})
    ratio = {m: data.shapes[m].qk / data.shapes[m].v for m in set(seeds.member)}
    wide_qk = max((m for m in ratio if ratio[m] > 1), key=ratio.get, default=None)
    wide_v = min((m for m in ratio if ratio[m] < 1), key=ratio.get, default=None)
    if wide_qk is None or wide_v is None:
        lacking = "a wide query/key member" if wide_qk is None else "a wide value member"
        raise Inconclusive(f"no trained, measured {lacking} (of {', '.join(candidates) or 'none'})", note)
    base = replace(base, statistic=f"needle accuracy at {distance:,} characters after cpt, {wide_qk} minus {wide_v}")
    return _compare(base, seeds, wide_v, wide_qk, note, TOY_RULER if data.scale == "toy" else "")


def _change(frame: pd.DataFrame, value: str, after: str, before: str, data: StudyData) -> pd.DataFrame:
    """``member``, ``seed``, ``v``: a seed's ``value`` after run ``after`` minus after run ``before`` (paired:
    both runs of one member and seed)."""
    a = per_seed(frame[frame.run == after], [value], data)
    b = per_seed(frame[frame.run == before], [value], data)
    both = a.merge(b, on=["member", "seed"], suffixes=("_after", "_before"))
    return both.assign(v=both[f"{value}_after"] - both[f"{value}_before"])[["member", "seed", "v"]]


def _over_members(base: Verdict, frame: pd.DataFrame, value: str, runs: tuple[str, str], data: StudyData,
                  positive: bool) -> Verdict:  # fmt: skip
    """The mean over members of their seed-mean change of ``value`` from ``runs[1]`` to ``runs[0]`` (at least
    two members, else :class:`Inconclusive`), decided by :func:`sign_rule`."""
    change = _change(frame, value, *runs, data)
    members = sorted(set(change.member))
    note = data.diverged_note(sorted(set(data.diverged.member)) if not data.diverged.empty else [], runs)
    if len(members) < 2:
        raise Inconclusive(f"too few members with both {' and '.join(runs)}: {', '.join(members) or 'none'}", note)
    est = bootstrap(samples_of(change, members, ["v"]), mean_over_members)
    digits = DIGITS.get(base.unit, DIGITS_DEFAULT)
    said = _said(change, members, digits, f"seed means of {runs[0]} minus {runs[1]}")
    return _decided(base, est, sign_rule(est, digits, positive), members, said, note)


def entropy_after_cpt(data: StudyData, base: Verdict) -> Verdict:
    """Finding 6: full-attention heads' normalised entropy after cpt minus before (mean over members), and
    the two widest symmetric members' difference after cpt within ±:data:`SIMILAR_MARGIN`."""
    frame = data.table("entropy", ("layer_type", "norm_value"), "analysis")
    full = frame[frame.layer_type == "full"]
    lower = _over_members(base, full, "norm_value", (CPT, PT), data, positive=False)
    (alike, why), pair = _widest_alike(full[full.run == CPT], data)
    parts = (lower.verdict, alike)
    verdict = OPPOSITE if OPPOSITE in parts else HOLDS if parts == (HOLDS, HOLDS) else INCONCLUSIVE
    return replace(
        lower, verdict=verdict, reason=joined(f"lower after cpt: {lower.reason}", f"similar between {pair}: {why}")
    )


def _widest_alike(after: pd.DataFrame, data: StudyData) -> tuple[tuple[str, str], str]:
    """Whether the two widest symmetric members' normalised entropy after cpt is alike (:func:`band_rule`
    on widest minus second widest), and which two they are."""
    try:
        symmetric = data.of_kind("symmetric")
        seeds = per_seed(after[after.member.isin(symmetric)], ["norm_value"], data).rename(columns={"norm_value": "v"})
        present = _present(seeds, symmetric, "symmetric", "")
    except Inconclusive as why:
        return (INCONCLUSIVE, str(why)), "the two widest symmetric members"
    second, widest = present[-2], present[-1]
    est = bootstrap(samples_of(seeds, [second, widest], ["v"]), difference(second, widest))
    verdict, why = band_rule(est, SIMILAR_MARGIN, 3)
    return (verdict, f"{widest} minus {second} {est.value:+.3f}, {why}"), f"{second} and {widest}"


def reordering_full_vs_frozen(data: StudyData, base: Verdict) -> Verdict:
    """Finding 7: full-attention heads' token reordering after cpt minus after frozen cpt (mean over
    members)."""
    frame = data.table("reordering", ("layer_type", "value"), "analysis")
    full = frame[frame.layer_type == "full"]
    return _over_members(base, full, "value", (CPT, FROZEN), data, positive=True)


def intermediate_layers(layers: int) -> range:
    """The blocks whose residual stream finding 8 reads: ``layers // 4`` to ``19 * layers // 28``, 0-based
    (the study's layers 7-19 of 28, scaled; the toys' 4 layers: blocks 1 and 2)."""
    return range(layers // 4, 19 * layers // 28 + 1)


def erank_wider(data: StudyData, base: Verdict) -> Verdict:
    """Finding 8: residual-stream effective rank after cpt over the intermediate blocks, widest minus
    narrowest symmetric member."""
    frame = data.table("erank", ("layer", "value"), "analysis")
    rows = frame[(frame.run == CPT) & (frame.site == "block_out" if "site" in frame else frame.layer >= 0)]
    symmetric = data.of_kind("symmetric")
    kept = [rows[(rows.member == m) & rows.layer.isin(intermediate_layers(data.shapes[m].layers))] for m in symmetric]
    rows = pd.concat(kept) if kept else rows.iloc[:0]
    note = data.diverged_note(symmetric, (CPT,))
    seeds = per_seed(rows, ["value"], data).rename(columns={"value": "v"})
    low, high = (p := _present(seeds, symmetric, "symmetric", note))[0], p[-1]
    blocks = intermediate_layers(data.shapes[high].layers)
    base = replace(base, statistic=f"effective rank after cpt, blocks {blocks[0]}-{blocks[-1]}, {high} minus {low}")
    return _compare(base, seeds, low, high, note)


@dataclass(frozen=True)
class Finding:
    """One of the study's findings: its number, title, the statistic's unit and inputs, and how it is decided."""

    number: int
    title: str
    statistic: str
    unit: str
    inputs: str
    decide: Callable[[StudyData, Verdict], Verdict]


FINDINGS = (
    Finding(1, "wider heads retrieve better at a fixed budget",
            "needle accuracy after cpt, widest minus narrowest symmetric member", "points",
            "study_probes.accuracy (task needle, longest distance, run cpt)", wider_retrieve(CPT)),
    Finding(2, "training loss does not predict long-context retrieval",
            "Spearman rho over members, eval loss vs needle accuracy after cpt", "Spearman rho",
            "study_runs.eval_loss, study_probes.accuracy (task needle, longest distance, run cpt)", loss_predicts),
    Finding(3, "wider heads have a larger retrieval-head fraction",
            "retrieval-head fraction of full-attention heads after cpt, widest minus narrowest symmetric member",
            "fraction of heads", "study_heads.fraction or forced_fraction (layer_type full, run cpt)", head_fraction),
    Finding(4, "the advantage persists when attention is frozen during cpt",
            "needle accuracy after frozen cpt, widest minus narrowest symmetric member", "points",
            "study_probes.accuracy (task needle, longest distance, run cpt-frozen)", wider_retrieve(FROZEN)),
    Finding(5, "query/key width matters more than value width",
            "needle accuracy after cpt, wide query/key member minus wide value member", "points",
            "study_probes.accuracy (task needle, longest distance, run cpt)", qk_over_v),
    Finding(6, "attention entropy is lower after cpt, and similar between the two widest members",
            "normalised entropy of full-attention heads, cpt minus pt, mean over members", "normalised entropy",
            "entropy.norm_value (layer_type full, runs pt and cpt)", entropy_after_cpt),
    Finding(7, "token reordering is greater under full than frozen cpt",
            "token reordering of full-attention heads, cpt minus cpt-frozen, mean over members", "reordering",
            "reordering.value (layer_type full, runs cpt and cpt-frozen)", reordering_full_vs_frozen),
    Finding(8, "residual-stream effective rank is higher in intermediate layers for wider heads",
            "effective rank after cpt over the intermediate blocks, widest minus narrowest symmetric member",
            "effective rank", "erank.value (site block_out, intermediate blocks, run cpt)", erank_wider),
)  # fmt: skip


def _published(number: int, scale: str | None, published: dict[int, tuple[dict[str, float], str]]) -> dict:
    """The study's value of a finding (at the study's scale where it gives one there, else at 0.6B), its
    scale and what it measures, as :class:`Verdict` fields."""
    by_scale, what = published.get(number, ({}, "not in figures/reference_values.json"))
    if not by_scale:
        return {"published_note": what}
    at = scale if scale in by_scale else "0.6b" if "0.6b" in by_scale else next(iter(by_scale))
    note = f"{what}, at {at.upper()}" + (f" (ours: {scale} scale)" if scale and at != scale else "")
    return {"published": by_scale[at], "published_scale": at, "published_note": note}


def verdicts(
    tables: Mapping[str, pd.DataFrame] | str | Path, analysis: Mapping[str, pd.DataFrame] | str | Path | None = None
) -> pd.DataFrame:
    """One row per finding (:data:`VERDICTS`), from the study's tables: ``tables`` as frames (name ->
    frame) or the study's folder ``OUT``; ``analysis``: the ``entropy``, ``reordering`` and ``erank`` tables
    as frames (their ``model`` joined to ``study_runs``) or the folder ``analyze`` wrote them to
    (default with ``OUT``: ``OUT/analysis``). Raises only for a folder that is not one."""
    data = study_data(tables, analysis)
    published = published_values()
    rows = []
    for finding in FINDINGS:
        base = Verdict(finding.number, finding.title, finding.statistic, finding.unit, inputs=finding.inputs,
                       **_published(finding.number, data.scale, published))  # fmt: skip
        try:
            rows.append(finding.decide(data, base))
        except Inconclusive as why:
            rows.append(replace(base, reason=str(why)))
    return VERDICTS.check(pd.DataFrame([asdict(r) for r in rows]))


def verdict_markdown(frame: pd.DataFrame) -> str:
    """The verdict table as Markdown (report.md's last section): :func:`verdict_cells`, verdicts in bold."""
    return markdown(verdict_cells(frame, bold=True))
