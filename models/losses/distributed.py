"""In-batch negatives across ranks: under torch.distributed (DDP under torchrun) every rank
encodes its slice of the global batch; `gather_rows` hands every rank the whole global batch's
vectors, so a contrastive loss scores each question against every rank's passages, exactly as one
process with the global batch would (the multi-GPU setups of DPR and its successors)."""
from __future__ import annotations

import torch
import torch.distributed as dist


def world_size() -> int:
    """Ranks of the initialised default process group; 1 without one."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size()


class _GatherRows(torch.autograd.Function):
    """all_gather along rows, differentiable: each rank's loss may depend on every rank's rows, so
    the backward sums the gradients of all ranks (all_reduce) and keeps this rank's rows."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, tensor.contiguous())
        ctx.rows = slice(dist.get_rank() * tensor.shape[0], (dist.get_rank() + 1) * tensor.shape[0])
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous().clone()  # all_reduce works in place; autograd may reuse `grad`
        dist.all_reduce(grad)
        return grad[ctx.rows]


def gather_rows(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """Every rank's `tensor` (each the same shape) concatenated in rank order, gradients flowing
    back to each rank's own rows; the tensor itself (or None) without a process group of 2+ ranks.

    With every rank computing the global batch's loss from the gathered vectors, the summed
    backward times DDP's mean over ranks gives exactly the single-process gradient."""
    if tensor is None or world_size() == 1:
        return tensor
    if not tensor.requires_grad:  # weights, teacher scores: data, no autograd node needed
        parts = [torch.empty_like(tensor) for _ in range(world_size())]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts)
    return _GatherRows.apply(tensor)
