"""The torch intra-op thread count that every path encoding or scoring computes with.

A float reduction (a matmul's dot products, a layer norm's sums) is split over torch's intra-op
threads, and the split fixes the order its terms are added in: the same model on the same rows
gives other last bits with another thread count. So every path of one build (the stage's own
process, a thread pool's threads, each Dask worker, the DDP ranks) computes with one count, chosen
once: `runner.threads` when configured, else $PFORGE_THREADS, else the count this process computes
with (torch's default: the machine's cores, or $OMP_NUM_THREADS). Left alone, a Dask worker would
compute with 1 (Dask's nanny sets OMP_NUM_THREADS=1 in its workers), as would torchrun's ranks.

The count is a runtime setting (no version changes with it), recorded in an artifact's stats as
`intra_op_threads`. On one machine it makes a version's bytes independent of the runner; across
CPU models the bytes may still differ (other kernels), the versions do not.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator

ENV = "PFORGE_THREADS"


def resolve_threads(configured: int | None = None) -> int:
    """The intra-op thread count a build computes with (see the module docstring)."""
    if configured is not None:
        return int(configured)
    raw = os.environ.get(ENV, "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"${ENV}={raw!r}: expected a whole number of torch threads, 1 or more")
        return int(raw)
    import torch

    return torch.get_num_threads()


@contextlib.contextmanager
def pinned_threads(threads: int) -> Iterator[int]:
    """torch computes with `threads` intra-op threads inside the block, in the calling thread
    (torch's count is per OS thread: each pool thread or worker sets its own), and with its
    previous count afterwards. Set even when torch reports that count already: a library that
    sets OpenMP's count alone (CTranslate2) leaves torch's other pools (MKL) at the old one, and
    torch.set_num_threads sets them all."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class WithThreads:
    """`compute(spec)` run with `threads` intra-op threads: what a runner's worker calls for each
    shard (picklable whenever `compute` is)."""
    compute: Callable[[Any], Any]
    threads: int

    def __call__(self, spec: Any) -> Any:
        with pinned_threads(self.threads):
            return self.compute(spec)


def kept_torch_threads():
    """A library that sets OpenMP's thread count in the thread that calls it (CTranslate2,
    llama.cpp) leaves torch's count there as it was before the block."""
    import torch

    return pinned_threads(torch.get_num_threads())
