"""Which query rows a pass analyses: a small typed value instead of a string parsed everywhere."""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import Tensor

from headprobe.core.choice import Choice
from headprobe.core.errors import SettingError


class RowKind(Choice, what="row selection"):
    ALL = "all"  # every position
    LAST = "last"  # the last n positions
    STRIDE = "stride"  # every n-th position, ending at the last


_SPEC = re.compile(r"^(all|last:(\d+)|stride:(\d+))$")


@dataclass(frozen=True)
class Rows:
    """A selection of query rows of a ``length``-token input.

    Attributes:
        kind: all rows, the last ``n``, or every ``n``-th ending at the last.
        n: the count or stride (unused for ``ALL``).
    """

    kind: RowKind = RowKind.ALL
    n: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", RowKind(self.kind))
        if self.kind is not RowKind.ALL and (not isinstance(self.n, int) or self.n < 1):
            raise SettingError(f"`rows` {self.kind.value}:{self.n}: N must be a positive integer")

    @classmethod
    def parse(cls, spec: str | Rows | None) -> Rows:
        """``all`` | ``last:N`` | ``stride:N`` (N a positive integer); ``None`` means all."""
        if isinstance(spec, Rows):
            return spec
        if spec is None:
            return cls()
        m = _SPEC.match(spec.strip())
        if not m:
            raise SettingError(f"`rows` {spec!r}: expected all, last:N or stride:N (N a positive integer)")
        if m.group(1) == "all":
            return cls()
        return cls(RowKind.LAST, int(m.group(2))) if m.group(2) else cls(RowKind.STRIDE, int(m.group(3)))

    def indices(self, length: int) -> Tensor | None:
        """Query indices into a ``length``-token input, or ``None`` for all of them."""
        if self.kind is RowKind.ALL:
            return None
        if self.kind is RowKind.LAST:
            return torch.arange(max(0, length - self.n), length)
        return torch.arange(length - 1, -1, -self.n).flip(0)

    def count(self, length: int) -> int:
        """How many rows of a ``length``-token input are analysed."""
        rows = self.indices(length)
        return length if rows is None else len(rows)

    def __str__(self) -> str:
        return "all" if self.kind is RowKind.ALL else f"{self.kind.value}:{self.n}"
