"""Processes, devices and model wrapping (DDP or FSDP2) for ``torchrun`` launches.

A plain ``headprobe train`` run is a world of one process. Under ``torchrun`` the usual
environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``...) is read; the backend is
NCCL on CUDA and gloo on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from headprobe.core.ranks import Ranks
from headprobe.model.transformer import Transformer
from trainer.config import Parallel

CPU = torch.device("cpu")


@dataclass(frozen=True)
class World(Ranks):
    """This process's place in the job (:class:`headprobe.core.ranks.Ranks`: ``rank``, ``size``, ``local_rank``,
    ``is_main``, ``distributed``) and where it computes.

    Attributes:
        device: where this process computes.
    """

    device: torch.device = CPU


def init_world(device: str = "auto") -> World:
    """Start the process group when launched by ``torchrun``; pick the device."""
    launch = Ranks.read_env()  # torchrun's environment, as the analysis reads it
    size, rank, local_rank = launch.size, launch.rank, launch.local_rank
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    if size > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return World(rank, size, local_rank, dev)


def shutdown() -> None:
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def all_reduce_sum(value: float, world: World) -> float:
    if not world.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=world.device)
    dist.all_reduce(t)
    return float(t.item())


def barrier(world: World) -> None:
    if world.distributed:
        dist.barrier()


def wrap(model: Transformer, parallel: Parallel | str, world: World, mixed_precision: bool) -> nn.Module:
    """DDP or FSDP2 (``fully_shard`` per block, then the root) around ``model``.

    With FSDP2 and ``mixed_precision`` parameters are gathered in bfloat16 and gradients reduced in
    float32. Without a process group the model is returned unchanged.
    """
    parallel = Parallel(parallel)
    if parallel is Parallel.NONE or not world.distributed:
        return model
    if parallel is Parallel.DDP:
        from torch.nn.parallel import DistributedDataParallel

        ids = [world.device.index] if world.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    if parallel is Parallel.FSDP:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if mixed_precision
            else MixedPrecisionPolicy()
        )
        for block in model.blocks:
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        return model
    raise ValueError(f"`parallel` {parallel.value!r} must be resolved to none, ddp or fsdp before wrapping")


def unwrap(model: nn.Module) -> Transformer:
    """The :class:`Transformer` inside a DDP wrapper (FSDP2 shards in place, nothing to unwrap)."""
    inner = getattr(model, "module", model)
    assert isinstance(inner, Transformer)
    return inner
