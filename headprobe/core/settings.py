"""Settings declared once: the fields of a settings dataclass carry what a command line needs (help, the
flag when it is not the field's name, the text form of a list), so a command's options, defaults and help
come from the dataclass that the library takes (``headprobe analyze``: ``AnalyzeSettings``; ``headprobe
ruler eval``: ``RulerSettings``; ``headprobe train``: ``TrainConfig``), and a default lives in one place."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, field
from typing import Any, Literal

Form = Literal["names", "lengths", "paths"]


def setting(
    default: Any = MISSING,
    *,
    factory: Callable[[], Any] | None = None,
    help: str,
    flag: str | None = None,
    form: Form | None = None,
) -> Any:
    """A settings field (``default``, or ``factory`` for a list) with its command-line ``help``; ``flag`` when
    the option is not named after the field (``--haystack-file`` for ``haystack``); ``form``, how a list is
    written on the command line: ``names`` (a comma list), ``lengths`` (token counts, ``4096,16k``) or
    ``paths`` (the option given once per file)."""
    metadata = {"help": help, "flag": flag, "form": form}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


# help texts of settings that several commands take
MODELS_HELP = "models: our checkpoint folders, local Hugging Face model folders or .gguf files (each: OUT/<model>/)"
DTYPE_HELP = "model dtype: float32 | bfloat16 | float16 | float64 (default: as saved; HF models float32)"
PROMPT_FORMAT_HELP = (
    "how prompts are put to the model: auto (its chat template where it has one, else plain) | chat | plain "
    "(RULER's base) | a wrapper string or file holding {task_template} once (RULER's model template)"
)
