"""What decides the numbers of ``headprobe graft``: :class:`GraftSettings`, checked before any model loads
(torch-free at import: the command line builds its options from it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from headprobe.analysis.settings import MIN_LENGTH
from headprobe.core.errors import HeadprobeError
from headprobe.core.paths import content_keys
from headprobe.core.resume import repeated_lengths
from headprobe.core.settings import DTYPE_HELP, MAX_TOKENS, PROMPT_FORMAT_HELP, check_ranges, setting
from headprobe.graft.parts import default_parts, parse_parts
from headprobe.text.prompt_format import parse_prompt_format


class GraftSettingsError(HeadprobeError, ValueError):
    """Bad graft settings; the message names the setting (in backticks) and the fix."""


@dataclass
class GraftSettings:
    """Everything that decides a graft run's numbers (stored with every result).

    Attributes:
        donor: the checkpoint whose weights are grafted into each base (our checkpoint folder, a local Hugging
            Face model folder or a ``.gguf`` file), of the base's architecture.
        parts: part sets (:mod:`headprobe.graft.parts`), each one hybrid; ``None``: each top-level group in turn
            and all of them. The base (``none``) and the donor (``all``) are always measured too.
        lengths: needle prompt lengths in tokens.
        samples: needle prompts per length (depths spread evenly, needles in turn, as ``analyze``'s).
        needles: the needle set (``builtin``, ``codes`` or a JSON-lines file).
        needle_reach: prompt tokens after the answer span the forced mass counts (``analyze --needle-reach``).
        prompt_format: ``auto``, ``chat``, ``plain`` or a wrapper (:mod:`headprobe.text.prompt_format`).
        max_new_tokens: the decoding budget of a needle answer.
        seed: needle placement and haystack seed.
        heldout: also measure the held-out loss (:func:`headprobe.graft.measure.heldout_losses`).
        dtype: the models' dtype; ``None`` = as saved.
        allow_beyond_trained: lengths beyond what a model was trained on (refused otherwise).
    """

    donor: str = setting("", help="the checkpoint whose weights are grafted (one architecture with each base)")
    parts: list[str] | None = setting(
        None,
        help="a part set to graft (repeat for several): embed, unembed, norms, attn, attn.qk, attn.vo, mlp "
        "(per-layer groups take :LAYERS, e.g. mlp:0-1), param:GLOB, joined by + (mlp:0-1+attn:3); all | none. "
        f"Default: {', '.join(default_parts())}",
        form="texts",
    )
    lengths: list[int] = setting(
        factory=lambda: [1024],
        help="comma list of needle prompt lengths in tokens",
        form="lengths",
        minimum=MIN_LENGTH,
        maximum=MAX_TOKENS,
    )
    samples: int = setting(8, help="needle prompts per length", minimum=1)
    needles: str = setting("builtin", help="builtin | codes (the toy models') | a .jsonl file of needles")
    needle_reach: int = setting(0, help="tokens after the needle's answer span its forced mass counts", minimum=0)
    prompt_format: str = setting("auto", help=PROMPT_FORMAT_HELP)
    max_new_tokens: int = setting(50, help="decoding budget of a needle answer", minimum=1)
    seed: int = setting(0, help="needle placement and haystack seed")
    heldout: bool = setting(True, help="also measure the held-out loss (eval_loss, per split)")
    dtype: str | None = setting(None, help=DTYPE_HELP)
    allow_beyond_trained: bool = setting(False, help="lengths beyond what a model was trained on (refused otherwise)")

    def part_sets(self) -> list[str]:
        """``none`` (the base), the part sets, and ``all`` (the donor), each once, as labels."""
        asked = [parse_parts(p).label for p in (self.parts or default_parts())]
        return list(dict.fromkeys(["none", *asked, "all"]))

    def validate(self) -> None:
        """Raise a :class:`~headprobe.core.errors.HeadprobeError` naming the first bad setting (reads no model)."""
        from headprobe.hooked import check_model, parse_dtype
        from headprobe.text.needles import needle_set

        check_ranges(self, GraftSettingsError)
        if not self.donor:
            raise GraftSettingsError("no `donor`: give the checkpoint whose weights are grafted into the base")
        check_model(self.donor)
        parse_dtype(self.dtype)
        parse_prompt_format(self.prompt_format)
        needle_set(self.needles)
        if self.parts is not None and not self.parts:
            raise GraftSettingsError("no `parts`: name part sets such as embed, mlp:0-1+attn:3, or leave it out")
        self.part_sets()  # a part set that does not parse: PartsError, naming it
        if not self.lengths:
            raise GraftSettingsError(f"no `lengths`: give token counts of at least {MIN_LENGTH}")
        if repeated := repeated_lengths(self.lengths):
            raise GraftSettingsError(repeated)

    def files(self) -> dict[str, dict[str, str]]:
        """A needles file, by content (:func:`headprobe.core.paths.content_keys`); empty for a built-in set."""
        from headprobe.text.needles import NEEDLE_SETS

        return content_keys(needles=None if self.needles in NEEDLE_SETS else self.needles)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"donor": str(Path(self.donor).resolve()) if self.donor else ""} | self.files()
