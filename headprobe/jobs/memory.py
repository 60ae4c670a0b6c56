"""The memory a run may use: what the device has free (:func:`available_memory`) or the ``memory_limit``
given (:class:`MemoryBudget`), and the refusal, before any work, of a run whose estimate exceeds it
(:func:`require_fits`, :class:`DoesNotFit`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from headprobe.core.errors import HeadprobeError
from headprobe.model.budget import MemoryEstimate


class DoesNotFit(HeadprobeError, RuntimeError):
    """A run would not fit in the memory budget; the message gives the estimate and what to change."""


def available_memory(device: torch.device | str) -> int:
    """Free bytes on ``device``: free GPU memory, or the host's available memory."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


USABLE = 0.9  # the share of the budget a run may plan to use


@dataclass(frozen=True)
class MemoryBudget:
    """The bytes a run may use: the ``memory_limit`` given (``limited``), else what the device has free."""

    bytes: int
    limited: bool = False

    @classmethod
    def of(cls, device: torch.device | str, memory_limit: int | None) -> MemoryBudget:
        return cls(memory_limit, True) if memory_limit else cls(available_memory(device))

    def __str__(self) -> str:
        gib = f"{self.bytes / 2**30:.3g} GiB"
        return f"`memory_limit` allows only {gib}" if self.limited else f"only {gib} is available"

    def fix(self, fix: str) -> str:
        """``fix`` (what to change to need less), with raising the limit first when one was given."""
        return f"raise `memory_limit`, or {fix}" if self.limited else f"{fix}, or use a larger machine"


def require_fits(what: str, estimate: MemoryEstimate, budget: MemoryBudget, fix: str) -> None:
    """Raise :class:`DoesNotFit` when ``estimate`` exceeds the usable share of ``budget``; ``fix`` says how
    to need less."""
    if estimate.total > USABLE * budget.bytes:
        raise DoesNotFit(f"{what} needs about {estimate.describe()}, but {budget}; {budget.fix(fix)}")
