"""What decides the numbers of ``headprobe ablate``: :class:`AblateSettings`, and the head sets they name.

Head sets (``heads``), each ablated in every ``mode``:

==============  ==========================================================================================
``top:K``       the K heads with the highest score in ``from_results`` (an ``analyze`` output of this very
                checkpoint; the mean over its lengths), by each retrieval-head definition of ``score``
                (Wu's ``retrieval`` by default; any of ``headprobe.metrics.agreement.DEFINITION_NAMES``).
                Heads scoring 0 or less (or unscored) are not ranked: a K beyond the heads that score is
                refused, and for Wu's score the run says how many of the K are below the retrieval-head
                threshold. A top set of another definition than Wu's is the condition ``top:<score>``
``random:K``    K heads drawn per seed in ``seeds``, uniformly among the model's heads that are not
                retrieval heads: outside every ``top`` set of the run (of every ``score``) and, with Wu's
                score (or its teacher-forced form) among them, scoring below the retrieval-head threshold
                (0.1) there. The control: as many heads, none of which retrieves (heads ranked just below
                a top set often retrieve too; drawing them would test the retrieval heads again); one
                control for every definition's top sets
``L.H,L.H``     these heads (layer.head, both from 0)
==============  ==========================================================================================

The unablated model is always measured too (condition ``baseline``), on the same prompts.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from headprobe.analysis.settings import MIN_LENGTH
from headprobe.core.errors import HeadprobeError
from headprobe.core.paths import content_keys
from headprobe.core.resume import repeated_lengths
from headprobe.core.settings import DTYPE_HELP, MAX_TOKENS, PROMPT_FORMAT_HELP, check_ranges, setting
from headprobe.evals.ruler.tasks import TASKS
from headprobe.model.config import LayerInfo
from headprobe.results import read_tables
from headprobe.text.prompt_format import parse_prompt_format

if TYPE_CHECKING:
    from headprobe.hooked.ablation import Head

# torch-free at import (the command line builds ``headprobe ablate``'s options from AblateSettings): the
# ablation hooks' module, the metrics, the needles and the job's provenance are imported where they are used

NEEDLE_TASK = "needle"  # the analyze needles, scored as Wu et al. keep a sample (ROUGE-1 recall > 0.5)
ABLATABLE_TASKS = (NEEDLE_TASK, *(name for name in TASKS if name.startswith("niah")))


class AblateError(HeadprobeError, ValueError):
    """Bad ablation settings, or heads they name that the results cannot give; the message names the setting
    (in backticks) and the fix. (A head list the seam cannot ablate:
    :class:`headprobe.hooked.ablation.AblationError`.)"""


@dataclass(frozen=True)
class Condition:
    """One way the model runs: ``condition`` (baseline, top, random, heads), the ablation ``mode`` (``none``
    for the baseline), the heads ablated and, for random sets, the seed that drew them (else -1)."""

    condition: str
    mode: str
    heads: tuple[Head, ...] = ()
    seed: int = -1

    @property
    def label(self) -> str:
        """A file-name-safe name unique among a run's conditions, e.g. ``baseline``, ``top10-zero``,
        ``top-needle_mass10-zero``, ``random10-zero-s2``, ``heads-17.3_18.7-mean``."""
        from headprobe.hooked.ablation import format_heads

        if self.condition == "baseline":
            return "baseline"
        what = (
            f"heads-{format_heads(self.heads).replace(',', '_')}"
            if self.condition == "heads"
            else (f"{self.condition.replace(':', '-')}{len(self.heads)}")
        )
        return "-".join([what, self.mode, *([f"s{self.seed}"] if self.seed >= 0 else [])])

    def columns(self) -> dict[str, Any]:
        from headprobe.hooked.ablation import format_heads

        return {
            "condition": self.condition,
            "mode": self.mode,
            "heads": format_heads(self.heads),
            "n_heads": len(self.heads),
            "seed": self.seed,
        }


BASELINE = Condition("baseline", "none")


@dataclass
class AblateSettings:
    """Everything that decides an ablation run's numbers (stored with every result).

    Attributes:
        heads: head sets (see the module docstring): ``top:K``, ``random:K``, ``L.H,L.H``.
        from_results: the ``analyze`` output whose tables rank the heads for ``top`` sets.
        score: the retrieval-head definitions (their tables in ``from_results``) that rank the ``top`` sets, one
            set per definition.
        modes: ``zero`` and/or ``mean`` (:class:`headprobe.hooked.ablation.AblationMode`).
        seeds: the seeds that draw the ``random`` sets (one set per seed).
        tasks: ``needle`` (the analyze needles) and/or RULER-style ``niah_*`` tasks.
        lengths: prompt lengths in tokens.
        depths: needle depths in percent (``needle``; RULER's tasks place their needles themselves).
        samples: prompts per length and depth (``needle``) or per length (RULER tasks).
        needles: the needle set: ``builtin``, ``codes`` or a JSON-lines file
            (:func:`headprobe.text.needles.needle_set`).
        prompt_format: ``auto``, ``chat``, ``plain``, or a wrapper holding ``{task_template}`` (a string or a
            file) (:mod:`headprobe.text.prompt_format`).
        seed: haystack seed (and RULER sample seed).
        max_new_tokens: decoding budget of a needle answer (RULER tasks use their own).
        dtype: the model's dtype; ``None`` = as saved.
        allow_beyond_trained: lengths beyond what the model was trained on (refused otherwise).
    """

    heads: list[str] = setting(
        factory=lambda: ["top:10", "random:10"],
        help="a head set to ablate (repeat for several): top:K (the K best by retrieval score in `from_results`), "
        "random:K (K random heads outside the top set, one set per `seeds`), or LAYER.HEAD,LAYER.HEAD (e.g. 17.3,18.7)",
        form="texts",
    )
    from_results: str | None = setting(
        None, help="a `headprobe analyze --metrics retrieval` output: ranks heads for top:K", flag="--from", form="path"
    )
    score: list[str] = setting(
        factory=lambda: ["retrieval"],
        help="comma list of the head definitions whose tables in `from_results` rank top:K, one top set each: "
        "retrieval (Wu's), retrieval_forced, needle_mass, query_focus, echo, induction, logit_contrib",
        form="names",
    )
    modes: list[str] = setting(
        factory=lambda: ["zero"], help="comma list of zero (the head writes nothing) | mean (its mean)", form="names"
    )
    seeds: list[int] = setting(
        factory=lambda: [0, 1, 2], help="comma list of seeds, one random set each", form="numbers"
    )
    tasks: list[str] = setting(
        factory=lambda: [NEEDLE_TASK],
        help="comma list of needle (the analyze needles) and RULER niah_* tasks",
        form="names",
    )
    lengths: list[int] = setting(
        factory=lambda: [2048],
        help="comma list of prompt lengths in tokens (1536,2k)",
        form="lengths",
        minimum=MIN_LENGTH,
        maximum=MAX_TOKENS,
    )
    depths: list[float] = setting(
        factory=lambda: [0.0, 25.0, 50.0, 75.0, 100.0],
        help="needle depths in percent",
        form="numbers",
        minimum=0,
        maximum=100,
    )
    samples: int = setting(2, help="prompts per length and depth (needle) or per length (RULER)", minimum=1)
    needles: str = setting("builtin", help="builtin | codes | a .jsonl file of needles")
    prompt_format: str = setting("auto", help=PROMPT_FORMAT_HELP)
    seed: int = setting(0, help="haystack and RULER sample seed")
    max_new_tokens: int = setting(32, help="decoding budget of a needle answer", minimum=1)
    dtype: str | None = setting(None, help=DTYPE_HELP)
    allow_beyond_trained: bool = setting(False, help="lengths beyond what a model was trained on (refused otherwise)")

    def validate(self) -> None:
        """Raise a :class:`~headprobe.core.errors.HeadprobeError` naming the first bad setting (reads no model):
        an :class:`AblateError`, or the error of the parser that refused it (``dtype``: a ``SettingError``;
        ``prompt_format``: a ``PromptFormatError``; ``needles``: a ``NeedleError``; ``modes``: a
        ``ChoiceError``); all of them ``ValueError`` s."""
        from headprobe.hooked import parse_dtype
        from headprobe.hooked.ablation import AblationMode
        from headprobe.text.needles import needle_set

        check_ranges(self, AblateError)
        parse_dtype(self.dtype)
        parse_prompt_format(self.prompt_format)
        needle_set(self.needles)
        for mode in self.modes:
            AblationMode(mode)
        if not self.heads:
            raise AblateError("no `heads` to ablate; give top:K, random:K or LAYER.HEAD,LAYER.HEAD")
        specs = [parse_spec(h) for h in self.heads]
        if any(kind == "top" for kind, _ in specs) and not self.from_results:
            raise AblateError(
                "`heads` top:K ranks heads by their retrieval scores: give `from_results`, the folder of an earlier "
                "`headprobe analyze --metrics retrieval` of this model"
            )
        if any(kind == "random" for kind, _ in specs) and not self.seeds:
            raise AblateError("`heads` random:K needs `seeds` (one random set per seed)")
        unknown = [t for t in self.tasks if t not in ABLATABLE_TASKS]
        if unknown or not self.tasks:
            raise AblateError(f"`tasks` {', '.join(unknown) or 'none'}: choose among {', '.join(ABLATABLE_TASKS)}")
        if not self.modes:
            raise AblateError("no `modes`: choose zero and/or mean")
        if not self.lengths:
            raise AblateError(f"no `lengths`: give token counts of at least {MIN_LENGTH}")
        if repeated := repeated_lengths(self.lengths):
            raise AblateError(repeated)
        if NEEDLE_TASK in self.tasks and not self.depths:
            raise AblateError("no `depths`: give needle depths in percent, from 0 to 100")
        from headprobe.metrics.agreement import DEFINITION_NAMES

        unknown = [name for name in self.score if name not in DEFINITION_NAMES]
        if unknown or not self.score:
            raise AblateError(f"`score` {', '.join(unknown) or 'none'}: choose among {', '.join(DEFINITION_NAMES)}")
        if self.from_results and not Path(self.from_results).is_dir():
            raise AblateError(f"`from_results` {self.from_results} is not a folder; give an analyze output folder")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with a needles file's content (``needles_sha256``: :meth:`files`)."""
        return asdict(self) | self.files()

    def files(self) -> dict[str, dict[str, str]]:
        """The input files given, by content (:func:`headprobe.core.paths.content_keys`): a needles file's;
        empty for a built-in needle set."""
        from headprobe.text.needles import NEEDLE_SETS

        return content_keys(needles=None if self.needles in NEEDLE_SETS else self.needles)


def parse_spec(spec: str) -> tuple[str, int | list[Head]]:
    """``top:K`` -> ``("top", K)``, ``random:K`` -> ``("random", K)``, ``17.3,18.7`` -> ``("heads", [...])``."""
    from headprobe.hooked.ablation import parse_heads

    kind, colon, count = spec.partition(":")
    if colon:
        if kind not in ("top", "random") or not count.isdigit() or int(count) < 1:
            raise AblateError(f"`heads` {spec!r}: write top:K or random:K with K >= 1, or LAYER.HEAD,LAYER.HEAD")
        return kind, int(count)
    return "heads", parse_heads(spec)


WU_SCORES = ("retrieval", "retrieval_forced")  # the definitions the retrieval-head threshold (0.1) is made for


def top_condition(score: str) -> str:
    """The ``condition`` of a top set ranked by ``score``: ``top`` for Wu's (as before there were others),
    ``top:<score>`` for another definition."""
    return "top" if score == "retrieval" else f"top:{score}"


@dataclass(frozen=True)
class Ranking:
    """The heads of one model by one definition's score: ``heads`` from the highest mean score (over the
    table's lengths) down, ties by layer then head, heads scoring 0 or less (or unscored) left out; ``scores``
    by head; ``model``: whose table it was; ``folder``: where it was read; ``shape``: the heads of each layer of
    the model the table describes (every head it holds a row of, scored or not); ``score``: the definition."""

    heads: list[Head]
    scores: dict[Head, float]
    model: str
    folder: str = ""
    shape: tuple[int, ...] = ()
    score: str = "retrieval"

    @property
    def retrieval_heads(self) -> set[Head]:
        """Heads at or above the retrieval-head threshold (the study's rule, docs/metrics.md), for Wu's score and
        its teacher-forced form; none for another definition (its scale has no such threshold)."""
        from headprobe.metrics.summaries import RETRIEVAL_THRESHOLD

        if self.score not in WU_SCORES:
            return set()
        return {h for h, v in self.scores.items() if v >= RETRIEVAL_THRESHOLD}

    def below_threshold(self, k: int) -> int:
        """How many of the top ``k`` heads score below the retrieval-head threshold (they copy, but too
        rarely to be retrieval heads)."""
        return sum(h not in self.retrieval_heads for h in self.heads[:k])

    def check_fits(self, layers: Sequence[LayerInfo], name: str, checkpoint: str | Path) -> None:
        """Refuse a ranking whose table describes a model of another shape than ``name``'s (``layers``):
        its heads would be ablated in another model, or be heads this one lacks."""

        mine = tuple(info.n_heads for info in layers)
        if self.shape and self.shape != mine:
            raise AblateError(
                f"`from_results` {self.folder} holds retrieval scores of another model than {name}: {self.model} "
                f"there has {describe_shape(self.shape)}, {name} has {describe_shape(mine)}; "
                f"{analyze_instead(checkpoint)}"
            )


def describe_shape(heads: Sequence[int]) -> str:
    """A model's heads per layer in words: ``4 layers of 8 heads``, ``4 layers (4, 4, 4, 2 heads)``."""
    if len(set(heads)) == 1:
        return f"{len(heads)} layers of {heads[0]} heads"
    return f"{len(heads)} layers ({', '.join(map(str, heads))} heads)"


def analyze_instead(checkpoint: str | Path | None, score: str = "retrieval") -> str:
    """The fix when ``from_results`` cannot rank a checkpoint's heads by ``score``: analyze it into a new folder (a
    results folder holds one command's results, so not into ``from_results`` when another command wrote it),
    then give that folder."""
    model = checkpoint or "MODEL"
    return (
        f"run `headprobe analyze {model} --metrics {score} --out NEW_FOLDER` (a new folder) and give "
        "`from_results` NEW_FOLDER, or name the heads (LAYER.HEAD,...)"
    )


def ranked_heads(
    from_results: str | Path, checkpoint: str | Path | None, name: str, score: str = "retrieval"
) -> Ranking:
    """The :class:`Ranking` of the heads of the checkpoint at ``checkpoint`` (results name ``name``) by the
    definition ``score``, from ``from_results``' tables of that name: those of this checkpoint, by identity
    (:func:`headprobe.jobs.provenance.tables_of`: a GGUF file's results serve its converted folder, and back; without a
    ``checkpoint``, those of ``name``). Raises :class:`AblateError` when there is none, or no sample has a
    number."""
    from headprobe.hooked.ablation import Head
    from headprobe.jobs.provenance import tables_of

    found = [t for t in read_tables(from_results, score, recursive=True) if len(t.frame)]
    if not found:
        raise AblateError(
            f"`from_results` {from_results} holds no {score} table (`headprobe analyze --metrics {score}` "
            f"writes it); {analyze_instead(checkpoint, score)}"
        )
    mine, held = tables_of(found, checkpoint, name)
    if not mine:
        raise AblateError(
            f"`from_results` {from_results} holds {score} scores of {held}, not of {name}"
            + (f" ({checkpoint})" if checkpoint else "")
            + f"; {analyze_instead(checkpoint, score)}"
        )
    chosen = mine[0].meta.model or name
    table = pd.concat([t.frame for t in mine], ignore_index=True)
    scores = table.groupby(["layer", "head"])["value"].mean().dropna()
    if scores.empty and score != "retrieval":
        raise AblateError(
            f"the {score} table of {chosen} in {from_results} scores no head: no sample had a number (its "
            f"{score}_samples table's `missing` column says why); rank by another `score`"
        )
    if scores.empty:
        from headprobe.metrics.retrieval import retrieval_tries

        facts, settings = mine[0].meta.model_facts or {}, mine[0].meta.settings or {}
        chat, asked = bool(facts.get("chat_template")), str(settings.get("prompt_format"))
        tries = retrieval_tries({"chat" if asked == "auto" and chat else asked}, str(settings.get("needles")), chat)
        raise AblateError(
            f"the retrieval table of {chosen} in {from_results} scores no head: no needle sample was kept. Rerun "
            f"analyze so that the model answers before ablating top heads: try {', or '.join(tries)}"
        )
    order = sorted(scores[scores > 0].items(), key=lambda kv: (-kv[1], kv[0][0], kv[0][1]))
    by_head = {Head(int(layer), int(head)): float(v) for (layer, head), v in order}
    layer_heads = table.groupby("layer")["head"].max()
    shape = tuple(int(layer_heads.get(layer, -1)) + 1 for layer in range(int(layer_heads.index.max()) + 1))
    return Ranking(list(by_head), by_head, chosen, str(from_results), shape, score)


def check_tops(s: AblateSettings, ranking: Ranking | None) -> None:
    """Refuse a ``top:K`` of ``s.heads`` that asks for more heads than score above 0 at all in the ranking's table
    (the rest would be heads scoring 0, picked by their index, not by any score)."""
    from headprobe.metrics.summaries import RETRIEVAL_THRESHOLD

    ranked = [] if ranking is None else ranking.heads
    score = "retrieval" if ranking is None else ranking.score
    wu = score in WU_SCORES
    for kind, k in (parse_spec(h) for h in s.heads):
        if kind != "top" or len(ranked) >= k:  # type: ignore[operator]
            continue
        where = "" if ranking is None else f" of {ranking.model} in {ranking.folder}"
        if not ranked:
            what = "copied the needle (every retrieval score is 0)" if wu else f"scores above 0 by {score}"
            raise AblateError(f"`heads` top:{k}: no head{where} {what}; name the heads (LAYER.HEAD,...) instead")
        retrieving = 0 if ranking is None else len(ranking.retrieval_heads)
        what = (
            f"copied the needle at all ({score} score > 0; {retrieving} of them at or above the retrieval-head "
            f"threshold {RETRIEVAL_THRESHOLD})"
            if wu
            else f"score above 0 by {score}"
        )
        raise AblateError(
            f"`heads` top:{k}: only {len(ranked)} heads{where} {what}; ask for top:{len(ranked)} or fewer, or name "
            "the heads (LAYER.HEAD,...)"
        )


def conditions(s: AblateSettings, all_heads: Sequence[Head], *rankings: Ranking | None) -> list[Condition]:
    """The baseline, then every head set of ``s.heads`` in every mode, a ``top`` set per ranking. ``all_heads``:
    the model's heads; ``rankings``: :func:`ranked_heads` of each ``score`` (needed for ``top`` sets, and to keep
    random sets off every top set and off Wu's retrieval heads)."""

    specs = [parse_spec(h) for h in s.heads]
    tops = [k for kind, k in specs if kind == "top"]
    ranks = [r for r in rankings if r is not None] or [None]
    excluded: set[Head] = set()
    for ranking in ranks:
        check_tops(s, ranking)
        if ranking is not None:
            excluded |= set(ranking.heads[: max(tops, default=0)]) | ranking.retrieval_heads  # type: ignore[type-var]
    pool = sorted(set(all_heads) - excluded)
    out = [BASELINE]
    for mode in s.modes:
        for kind, value in specs:
            if kind == "top":
                for ranking in ranks:
                    heads = tuple([] if ranking is None else ranking.heads[: int(value)])  # type: ignore[arg-type]
                    out.append(Condition(top_condition("retrieval" if ranking is None else ranking.score), mode, heads))
            elif kind == "random":
                if len(pool) < int(value):  # type: ignore[arg-type]
                    raise AblateError(f"`heads` random:{value}: only {len(pool)} heads are not retrieval heads")
                for seed in s.seeds:
                    drawn = random.Random(f"headprobe-ablation/{seed}/{value}").sample(pool, int(value))  # type: ignore[arg-type]
                    out.append(Condition("random", mode, tuple(sorted(drawn)), seed))
            else:
                out.append(Condition("heads", mode, tuple(value)))  # type: ignore[arg-type]
    return out
