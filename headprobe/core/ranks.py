"""Splitting ``analyze``, ``ruler eval``, ``ablate`` and ``shortctx eval`` over processes started by
``torchrun``.

``torchrun --nproc_per_node=N -m headprobe analyze ...`` starts N copies of the command with the usual
environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``...). Every process loads each
checkpoint (on its own GPU, ``cuda:LOCAL_RANK``), all of them agree on the list of work items before any
is done, each computes the items whose number (counted on from the checkpoint's place in the run, so that
checkpoints of one item each go to the processes in turn) modulo N is its rank and writes them as the job's
usual resumable parts, and the first process, after a barrier, merges the parts into the same result files a
single process writes. A plain run is a world of one and touches none of this.

Processes talk over gloo (CPU sockets) whatever the device: they exchange only small Python objects
(a lock's outcome, an error message), never tensors. ``HEADPROBE_LOG_ITEMS=FILE`` makes every process
append one line ``RANK ITEM`` per item it computed (to see how the work was shared).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

ITEM_LOG = "HEADPROBE_LOG_ITEMS"


@dataclass(frozen=True)
class Ranks:
    """This process's place among the job's processes.

    Attributes:
        rank: global process index (0 writes the merged results).
        size: number of processes.
        local_rank: index on this node (picks the GPU).
    """

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @classmethod
    def read_env(cls) -> Ranks:
        """The launch's ranks from torchrun's environment (one process without it); starts nothing."""
        return cls(
            int(os.environ.get("RANK", "0")),
            int(os.environ.get("WORLD_SIZE", "1")),
            int(os.environ.get("LOCAL_RANK", "0")),
        )

    @classmethod
    def from_env(cls) -> Ranks:
        """:meth:`read_env`, and the gloo group started when there are several processes."""
        ranks = cls.read_env()
        if ranks.distributed:
            import torch.distributed as dist

            if not dist.is_initialized():
                dist.init_process_group("gloo")
        return ranks

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def mine(self, index: int) -> bool:
        """Whether work item ``index`` (numbered alike on every process) is this process's."""
        return index % self.size == self.rank

    def others(self, sizes: list[int], deal: int = 0) -> int:
        """The units of work (``sizes[i]`` in item ``i``, dealt from ``deal`` on) that other processes did:
        what the first process's progress bar advances by once they are all done."""
        return sum(n for i, n in enumerate(sizes) if not self.mine(deal + i))

    def device(self, device: str) -> str:
        """``device`` for this process: ``cuda`` becomes ``cuda:LOCAL_RANK`` when several share a node."""
        if self.distributed and device == "cuda":
            return f"cuda:{self.local_rank}"
        return device

    def did(self, item: str) -> None:
        """Record that this process computed ``item`` (in ``$HEADPROBE_LOG_ITEMS``, when set)."""
        log = os.environ.get(ITEM_LOG)
        if log:
            with open(log, "a", encoding="utf-8") as f:  # one short line per write: appends do not interleave
                f.write(f"{self.rank} {item}\n")

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()

    def gather(self, value: Any) -> list[Any]:
        """``value`` of every process, in rank order (just ``[value]`` alone)."""
        if not self.distributed:
            return [value]
        import torch.distributed as dist

        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, value)
        return out

    @contextlib.contextmanager
    def together(self, caught: tuple[type[Exception], ...], error: type[Exception]) -> Iterator[None]:
        """Run this process's share of the work in the block; then, if any process failed with one of
        ``caught``, every process raises: the failed one its own error, the others ``error(message)``
        (so no process waits for one that gave up, and all record the same failure)."""
        failed = None
        try:
            yield
        except caught as err:
            failed = err
        messages = self.gather(None if failed is None else str(failed))
        if failed is not None:
            raise failed
        message = next((m for m in messages if m is not None), None)
        if message is not None:
            raise error(message)

    @contextlib.contextmanager
    def held_by_main(self, hold: contextlib.AbstractContextManager[Any]) -> Iterator[None]:
        """Enter ``hold`` (e.g. the output folder's lock) on the first process only; every process raises
        the same error when it failed there."""
        if not self.distributed:
            with hold:
                yield
            return
        error = None
        with contextlib.ExitStack() as stack:
            if self.is_main:
                try:
                    stack.enter_context(hold)
                except Exception as err:
                    error = err
            refused = self.gather(None if error is None else (type(error), str(error)))[0]
            if refused is not None:
                raise error if error is not None else refused[0](refused[1])
            yield
            self.barrier()  # the lock is released only once every process is done
