"""Settings declared once: the fields of a settings dataclass carry what a command line needs (help, the
flag when it is not the field's name, the text form of a list, the range of a number), so a command's
options, defaults and help come from the dataclass that the library takes (``headprobe analyze``:
``AnalyzeSettings``; ``headprobe ruler eval``: ``RulerSettings``; ``headprobe train``: ``TrainConfig``), and
a default lives in one place.

The range of every number is declared with it (:class:`Range`: a settings field's ``minimum`` / ``above`` /
``maximum`` / ``below``; a command's own option as ``Annotated[int, typer.Option(...), Range(minimum=1)]``)
and checked by one rule before any work (:func:`check_ranges`, :meth:`Range.refusal`):
``lr: give a value above 0, got -1.0``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field
from typing import Any, Literal

Form = Literal["names", "numbers", "lengths", "paths", "texts", "path", "count"]
ALL = "all"  # a `count` setting's word for "every one", stored as 0

MAX_TOKENS = 2**24  # the longest input any command takes (16,384K tokens: 64 times the study's 256K)


@dataclass(frozen=True)
class Range:
    """The numbers a setting allows: at least ``minimum`` (or ``above`` it, excluded), at most ``maximum``
    (or ``below`` it, excluded); ``None`` bounds nothing. A list's items are each held to it."""

    minimum: float | None = None
    above: float | None = None
    maximum: float | None = None
    below: float | None = None

    def allows(self, value: float) -> bool:
        """Whether ``value`` lies in the range; ``inf`` and ``nan`` never do (no setting means either)."""
        if not math.isfinite(value):
            return False
        low = (self.minimum is None or value >= self.minimum) and (self.above is None or value > self.above)
        return low and (self.maximum is None or value <= self.maximum) and (self.below is None or value < self.below)

    def __str__(self) -> str:
        """What to give, as a refusal says it: ``at least 1``, ``a value above 0``, ``a value from 0 to 1``,
        ``a value of at least 0 and below 1``."""
        if self.minimum is not None and self.maximum is not None:
            return f"a value from {_number(self.minimum)} to {_number(self.maximum)}"
        low = [f"at least {_number(self.minimum)}"] if self.minimum is not None else []
        low += [f"above {_number(self.above)}"] if self.above is not None else []
        high = [f"at most {_number(self.maximum)}"] if self.maximum is not None else []
        high += [f"below {_number(self.below)}"] if self.below is not None else []
        bounds = " and ".join(low + high)
        if bounds.startswith(("at least", "at most")) and len(low + high) == 1:
            return bounds  # a count's: "give at least 1"
        return ("a value of " if bounds.startswith("at ") else "a value ") + bounds

    def refusal(self, value: Any) -> str | None:
        """Why ``value`` (a number, a list of numbers, or ``None``: not given) is refused, e.g. ``give a value
        above 0, got -1.0``; ``None`` when it is allowed. ``inf`` and ``nan`` are refused whatever the bounds:
        ``give a finite value above 0, got inf``."""
        for item in value if isinstance(value, list | tuple) else [value]:
            if isinstance(item, int | float) and not isinstance(item, bool) and not self.allows(item):
                if math.isfinite(item):
                    return f"give {self}, got {item}"
                bounds = str(self) if self != Range() else ""  # "a value above 0", "at least 0", or no bound
                said = bounds.removeprefix("a value ") if bounds.startswith("a value") else f"of {bounds}"
                return f"give a finite value {said if bounds else ''}".rstrip() + f", got {item}"
        return None


def _number(bound: float) -> str:
    """A bound as a refusal writes it: ``0``, ``0.5``, ``16777216`` (a whole number in full, never ``1.67772e+07``)."""
    return str(int(bound)) if float(bound).is_integer() and abs(bound) < 1e16 else f"{bound:g}"


def setting(
    default: Any = MISSING,
    *,
    factory: Callable[[], Any] | None = None,
    help: str = "",
    flag: str | None = None,
    form: Form | None = None,
    minimum: float | None = None,
    above: float | None = None,
    maximum: float | None = None,
    below: float | None = None,
) -> Any:
    """A settings field (``default``, or ``factory`` for a list) with its command-line ``help``; ``flag`` when
    the option is not named after the field (``--haystack-file`` for ``haystack_files``); ``form``, how a list is
    written on the command line: ``names`` (a comma list), ``numbers`` (a comma list of the field's numbers,
    ``0,1,2``), ``lengths`` (token counts, ``4096,16k``), ``paths`` (the option given once per file) or
    ``texts`` (the option given once per item, an item may hold commas: ``--heads 17.3,18.7``), ``path``
    for a text setting that names one file or folder (taken as a path, stored as its text), and ``count`` for
    a whole number whose 0 means every one, given as a number or as :data:`ALL` (``--keep all``: taken as its
    text, which the settings dataclass turns into the number with :func:`parse_count`); for a number (or
    a list of numbers) its :class:`Range`: ``minimum`` / ``above`` (excluded), ``maximum`` / ``below``
    (excluded)."""
    bounds = Range(minimum, above, maximum, below)
    metadata = {"help": help, "flag": flag, "form": form, "range": bounds if bounds != Range() else None}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def parse_count(value: int | str) -> int | None:
    """A ``count`` setting's value (:data:`Form`): a whole number as it is, :data:`ALL` (any case) as 0, an
    integer's text as that integer; ``None`` for anything else (the caller refuses it, naming its setting)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text == ALL:
        return 0
    try:
        return int(text)  # a negative one too: the range rule refuses it, as every number's
    except ValueError:
        return None


def check_ranges(settings: Any, error: Callable[[str], Exception]) -> None:
    """The one range rule for a settings dataclass: raise ``error`` naming the first field (in backticks,
    shown as its flag on the command line) whose value lies outside the :class:`Range` it declares, what it
    allows and what it got (```lr`: give a value above 0, got -1.0``)."""
    for f in dataclasses.fields(settings):
        bounds = f.metadata.get("range")
        if bounds is not None and (why := bounds.refusal(getattr(settings, f.name))):
            raise error(f"`{f.name}`: {why}")


# help texts of settings that several commands take
MODELS_HELP = "models: our checkpoint folders, local Hugging Face model folders or .gguf files (each: OUT/<model>/)"
DTYPE_HELP = "model dtype: float32 | bfloat16 | float16 | float64 (default: as saved; HF models float32)"
PROMPT_FORMAT_HELP = (
    "how prompts are put to the model: auto (its chat template where it has one, else plain) | chat | plain "
    "(RULER's base) | a wrapper string or file holding {task_template} once (RULER's model template)"
)
