"""What decides a short-context evaluation's numbers: :class:`ShortCtxSettings`, checked before any work
(and importable without torch: the command line builds ``headprobe shortctx eval``'s options from it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from headprobe.core.paths import content_keys
from headprobe.core.resume import resume_key
from headprobe.core.settings import DTYPE_HELP, check_ranges, setting
from headprobe.evals.shortctx.items import LOADERS, Item, ShortCtxError, builtin_items, load_task

BUILTIN = "builtin"


@dataclass
class ShortCtxSettings:
    """What decides a short-context evaluation's numbers.

    Attributes:
        task: ``builtin`` or a loader of :data:`headprobe.evals.shortctx.items.LOADERS`.
        file: the task's local file in its original format (every task but ``builtin``).
        limit: evaluate only the first ``limit`` items.
        dtype: the model's dtype (:data:`headprobe.hooked.DTYPES`); ``None`` = as saved.
    """

    task: str = setting(BUILTIN, help=f"{BUILTIN}, {', '.join(LOADERS)}")
    file: str | None = setting(None, help="the task's local file (original format)", form="path")
    limit: int | None = setting(None, help="evaluate only the first N items", minimum=1)
    dtype: str | None = setting(None, help=DTYPE_HELP)

    def validate(self) -> None:
        """Raise naming the first bad setting (a number out of its range, a bad dtype, an unknown task, a task
        without its file); reads no file."""
        from headprobe.hooked import parse_dtype

        check_ranges(self, ShortCtxError)
        parse_dtype(self.dtype)
        if self.task != BUILTIN and self.task not in LOADERS:
            raise ShortCtxError(f"unknown `task` {self.task!r}; choose {BUILTIN} or one of {', '.join(LOADERS)}")
        if self.task != BUILTIN and self.file is None:
            raise ShortCtxError(f"`task` {self.task} needs `file` with the task's local data")
        if self.task == BUILTIN and self.file is not None:
            raise ShortCtxError(
                f"`file` {self.file} goes with a benchmark's own data, and `task` builtin has none; name the task the "
                f"file holds ({', '.join(LOADERS)}), or drop `file`"
            )

    def items(self) -> list[Item]:
        """The task's items (raises as :meth:`validate`, or naming a file that does not load)."""
        self.validate()
        items = builtin_items() if self.task == BUILTIN else load_task(self.task, str(self.file))
        return items[: self.limit]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with the task file's content (``file_sha256``: :func:`headprobe.core.paths.content_keys`)
        when one is given."""
        return asdict(self) | content_keys(file=self.file)

    def key(self, checkpoint: str | Path, prompt_start: list[int]) -> dict[str, Any]:
        """The resume key of the task's items: the checkpoint and every setting, the file by its content too (an
        edited file is another task's data)."""
        return resume_key(checkpoint=str(Path(checkpoint).resolve()), prompt_start=prompt_start, **self.to_dict())
