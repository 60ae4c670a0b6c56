"""95% intervals for the study's numbers: a bootstrap over seeds, and Wilson's interval for a share of
trials answered when there is one seed.

* :func:`bootstrap`: a statistic of members' means of per-seed values, with its percentile interval when
  every member's seeds are resampled with replacement (members never pooled). The verdicts use it for their
  statistics (:mod:`headprobe.study.verdicts`), the report for each member's mean.
* :func:`wilson`: the score interval of a binomial share (``hits`` of ``n`` trials), which stays inside 0-1
  and is not empty at 0 or n (Wilson 1927): a run's probe accuracy from its own trials.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

RESAMPLES = 10_000  # bootstrap resamples per interval
RNG_SEED = 0  # the bootstrap's generator seed: the same tables give the same intervals
LEVEL = 0.95
MIN_SEEDS = 2  # seeds a member needs for an interval over seeds
Z = 1.959963984540054  # the standard normal's 97.5th percentile: a two-sided 95% interval


@dataclass(frozen=True)
class Estimate:
    """A statistic's value and its interval (``nan`` when there is none: ``why``)."""

    value: float
    low: float = math.nan
    high: float = math.nan
    seeds: int = 0
    why: str = ""


def bootstrap(
    samples: Mapping[str, np.ndarray],
    statistic: Callable[[Mapping[str, np.ndarray]], np.ndarray],
    resamples: int = RESAMPLES,
    seed: int = RNG_SEED,
) -> Estimate:
    """``statistic`` of the member means, and its 95% percentile interval over seeds.

    ``samples``: member -> ``[seeds, k]`` per-seed values (``k`` quantities per seed, e.g. loss and accuracy).
    ``statistic``: member -> ``[n, k]`` means -> ``[n]``. Each resample draws every member's seeds with
    replacement, as many as it has, within that member (members are never pooled). The interval is the 2.5th
    and 97.5th percentiles of the resampled statistic (``numpy.quantile``'s linear rule), over resamples
    where it is defined; no interval when a member has fewer than :data:`MIN_SEEDS` seeds or the statistic
    is undefined in more than 5% of resamples."""
    seeds = min(len(rows) for rows in samples.values())
    value = float(statistic({m: rows.mean(axis=0)[None, :] for m, rows in samples.items()})[0])
    if seeds < MIN_SEEDS:
        few = sorted(m for m, rows in samples.items() if len(rows) < MIN_SEEDS)
        return Estimate(value, seeds=seeds, why=f"one seed of {', '.join(few)}: no interval over seeds; run more seeds")
    rng = np.random.default_rng(seed)
    means = {}
    for member in sorted(samples):
        rows = samples[member]
        means[member] = rows[rng.integers(0, len(rows), size=(resamples, len(rows)))].mean(axis=1)
    drawn = np.asarray(statistic(means), dtype=float)
    defined = drawn[~np.isnan(drawn)]
    if len(defined) < LEVEL * resamples:
        share = 1 - len(defined) / resamples
        return Estimate(value, seeds=seeds, why=f"the statistic is undefined in {share:.0%} of resamples")
    low, high = np.quantile(defined, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return Estimate(value, float(low), float(high), seeds)


def seed_mean(values: np.ndarray) -> Estimate:
    """One member's mean over its per-seed ``values`` and the :func:`bootstrap` interval of that mean."""
    return bootstrap({"": np.asarray(values, dtype=float).reshape(-1, 1)}, lambda means: means[""][:, 0])


def wilson(hits: float, n: float) -> tuple[float, float]:
    """The 95% Wilson score interval of the share ``hits / n`` (``n`` > 0 trials): ``(low, high)`` in 0-1."""
    if n <= 0:
        raise ValueError(f"a share needs at least one trial, got n={n}")
    p = hits / n
    centre = (p + Z**2 / (2 * n)) / (1 + Z**2 / n)
    half = Z / (1 + Z**2 / n) * math.sqrt(p * (1 - p) / n + Z**2 / (4 * n**2))
    return max(0.0, centre - half), min(1.0, centre + half)
