"""The 13 RULER tasks: their configuration (NVIDIA/RULER ``scripts/synthetic.yaml``) and metric."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from headprobe.core.errors import SettingError
from headprobe.evals.ruler.scoring import Scorer

Family = Literal["niah", "vt", "cwe", "fwe", "qa"]
TOKENS_TO_GENERATE = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50, "qa": 32}


@dataclass(frozen=True)
class Task:
    """One task's configuration.

    Attributes:
        name: RULER's task name.
        family: generator family.
        haystack: ``noise`` (the repeated sentence), ``needle`` (distractor needles), ``essay`` (prose),
            or ``None`` for families that bring their own context.
        type_needle_k / type_needle_v: ``words`` (adjective-noun), ``numbers`` (7 digits), ``uuids``.
        num_needle_k / num_needle_v / num_needle_q: keys, values per key, keys asked about.
        num_chains / num_hops: variable tracking.
        freq_cw / freq_ucw / num_cw: common-words extraction (counts of common and uncommon words).
        alpha: frequent-words extraction (Zipf exponent).
        dataset: ``squad`` (qa_1) or ``hotpotqa`` (qa_2).
        metric: how predictions are scored (RULER's ``string_match_all`` or ``string_match_part``).
    """

    name: str
    family: Family
    haystack: str | None = None
    type_needle_k: str = "words"
    type_needle_v: str = "numbers"
    num_needle_k: int = 1
    num_needle_v: int = 1
    num_needle_q: int = 1
    num_chains: int = 1
    num_hops: int = 4
    freq_cw: int = 30
    freq_ucw: int = 3
    num_cw: int = 10
    alpha: float = 2.0
    dataset: str | None = None
    metric: Scorer = Scorer.MATCH_ALL

    @property
    def tokens_to_generate(self) -> int:
        return TOKENS_TO_GENERATE[self.family]


def _niah(name: str, haystack: str, k: str = "words", v: str = "numbers", nk: int = 1, nv: int = 1, nq: int = 1):
    return Task(name, "niah", haystack, k, v, max(nk, nq), nv, nq)


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        _niah("niah_single_1", "noise"),
        _niah("niah_single_2", "essay"),
        _niah("niah_single_3", "essay", v="uuids"),
        _niah("niah_multikey_1", "essay", nk=4),
        _niah("niah_multikey_2", "needle"),
        _niah("niah_multikey_3", "needle", k="uuids", v="uuids"),
        _niah("niah_multivalue", "essay", nv=4),
        _niah("niah_multiquery", "essay", nq=4),
        Task("vt", "vt", "noise", num_chains=1, num_hops=4),
        Task("cwe", "cwe", freq_cw=30, freq_ucw=3, num_cw=10),
        Task("fwe", "fwe", alpha=2.0),
        Task("qa_1", "qa", dataset="squad", metric=Scorer.MATCH_PART),
        Task("qa_2", "qa", dataset="hotpotqa", metric=Scorer.MATCH_PART),
    )
}


GROUPS: dict[str, tuple[str, ...]] = {"all": tuple(TASKS)}
"""Names that stand for several tasks in a ``tasks`` list."""

TASKS_HELP = f"{' | '.join(GROUPS)}, or a comma list of tasks: {', '.join(TASKS)}"
"""What a ``tasks`` setting accepts, in words (the ``--tasks`` help and the error of :func:`resolve_tasks`)."""


def resolve_tasks(spec: str | list[str]) -> list[Task]:
    """A comma list of task and group (:data:`GROUPS`) names, as tasks: groups expand in RULER's order,
    the rest keep the order given, each task once."""
    names = spec if isinstance(spec, list) else [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in TASKS and n not in GROUPS]
    if unknown or not names:
        raise SettingError(f"unknown RULER task(s) {unknown or names} in `tasks`; choose {TASKS_HELP}")
    return [TASKS[n] for n in dict.fromkeys(t for name in names for t in GROUPS.get(name, (name,)))]
