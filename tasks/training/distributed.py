"""Data-parallel training under torchrun (DDP): the same loop as one process.

`run_training` enters `process_group(device)`. Under torchrun (RANK, LOCAL_RANK and WORLD_SIZE set,
2+ ranks) it initialises the default process group, NCCL on CUDA (device cuda:LOCAL_RANK) and gloo
otherwise, unless the caller already did (flows/ddp.py does, to share a stage's inputs first); it
destroys only a group it initialised. The `Ranks` it yields tell the loop which slice of each
global batch is this rank's, wrap the loss module in DistributedDataParallel, and say which rank
writes (rank 0). Without torchrun it yields `Ranks()`, whose every method is the identity: the
single-process run is unchanged.

Inside the block every rank computes with rank 0's torch intra-op thread count (models/threads.py:
$PFORGE_THREADS, else rank 0's own count; torchrun sets OMP_NUM_THREADS=1 unless told otherwise),
so ranks on unlike machines still sum their floats alike; the count is restored afterwards.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn

from models.threads import pinned_threads, resolve_threads

TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


def torchrun_world_size() -> int:
    """WORLD_SIZE when torchrun started this process, else 1."""
    if not all(name in os.environ for name in TORCHRUN_VARIABLES):
        return 1
    return int(os.environ["WORLD_SIZE"])


def is_main_process() -> bool:
    """Rank 0, or no torchrun at all: the process that writes outputs and registers artifacts."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return torchrun_world_size() == 1 or int(os.environ["RANK"]) == 0


@dataclass(frozen=True)
class Ranks:
    """This process's place among the training ranks (rank 0 of 1 without torchrun)."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    intra_op_threads: int | None = None  # what every rank computes with (None: this process's own count)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def shard(self, indices: list[int]) -> list[int]:
        """This rank's contiguous slice of a global batch: every rank draws the same seeded global
        order, so the data is split, not duplicated; rank order is the order the losses gather
        vectors in (models/losses/distributed.py), so the gathered batch is the global one."""
        if not self.distributed:
            return indices
        if len(indices) % self.world_size:
            raise ValueError(f"a batch of {len(indices)} does not split over {self.world_size} ranks: make "
                             "batch_size (the global batch) a multiple of the number of ranks")
        per_rank = len(indices) // self.world_size
        return indices[self.rank * per_rank:(self.rank + 1) * per_rank]

    def wrap(self, module: nn.Module) -> nn.Module:
        """`module` in DistributedDataParallel (which averages the gradients over ranks and starts
        every rank from rank 0's parameters and buffers). Unused parameters are allowed (BERT's
        pooler); buffers are not re-broadcast every step (a loss that keeps state in them, such as
        xMoCo's queues, keeps them equal itself)."""
        if not self.distributed:
            return module
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=device_ids, find_unused_parameters=True,
                                       forward_sync_buffers=False)  # torch 2.13: synced at init only

    def mean(self, value: torch.Tensor) -> float:
        """The mean over ranks of a scalar (the logged loss is the global batch's)."""
        value = value.detach().float()
        if self.distributed:
            value = value.reshape(()).clone()
            dist.all_reduce(value)
            value = value / self.world_size
        return float(value.cpu())

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` (picklable), on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


@contextlib.contextmanager
def process_group(device: torch.device) -> Iterator[Ranks]:
    """The ranks of this run (see the module docstring); `device` 'cuda' becomes cuda:LOCAL_RANK."""
    owned = False
    if torchrun_world_size() > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        owned = True
    if not dist.is_initialized() or dist.get_world_size() == 1:
        with pinned_threads(resolve_threads()) as threads:  # $PFORGE_THREADS, else unchanged
            yield Ranks(device=device, intra_op_threads=threads)
        return
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", torch.cuda.current_device())))
    try:
        box = [resolve_threads()]
        dist.broadcast_object_list(box, src=0)  # rank 0's count on every rank
        with pinned_threads(box[0]) as threads:
            yield Ranks(dist.get_rank(), dist.get_world_size(), device, threads)
    finally:
        if owned:
            dist.destroy_process_group()
