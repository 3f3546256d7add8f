"""Shared pieces of the contrastive losses (sentence-transformers-like: an nn.Module built
around the model; `forward` encodes, then calls `compute_loss_from_embeddings`)."""
from __future__ import annotations

from typing import Any, ClassVar, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from .distributed import gather_rows


class EmbeddingLoss(nn.Module):
    """Base: encodes the batches with `model.encode_query` / `model.encode_passage`.

    `negative_batch` holds the hard negatives, question-major: rows i*N .. i*N+N-1 belong to
    question i (N per question). The scale comes from `model.similarity_scale` unless given.
    `uses_weights` says whether the loss consumes per-example weights: the trainer hands the
    batch's weights only to a loss that does, and refuses weighted examples for one that does not.
    Under DDP (torchrun) `forward` gathers every rank's vectors and weights first
    (models/losses/distributed.py): the in-batch negatives are the global batch's, and every rank
    computes the loss of the whole global batch.
    """

    uses_weights: ClassVar[bool] = False

    def __init__(self, model: nn.Module, scale: float | None = None) -> None:
        super().__init__()
        self.model = model
        self._scale = scale

    @property
    def scale(self) -> float:
        if self._scale is not None:
            return float(self._scale)
        return float(getattr(self.model, "similarity_scale", 1.0))

    def forward(
        self,
        query_batch: Mapping[str, Any],
        passage_batch: Mapping[str, Any],
        negative_batch: Mapping[str, Any] | None = None,
        weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        q = self.model.encode_query(query_batch)
        p = self.model.encode_passage(passage_batch)
        n = self.model.encode_passage(negative_batch) if negative_batch is not None else None
        q, p, n, weights = (gather_rows(t) for t in (q, p, n, weights))  # identity in one process
        return self.compute_loss_from_embeddings(q, p, negatives=n, weights=weights)

    def compute_loss_from_embeddings(
        self,
        q: torch.Tensor,
        p: torch.Tensor,
        negatives: torch.Tensor | None = None,
        weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        raise NotImplementedError


def forward_logits(q: torch.Tensor, p: torch.Tensor, negatives: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Question -> passage logits (B, (N+1)*B): columns are the B in-batch passages, then every
    question's hard negatives (paper 003 section 4.3: one question's hard negatives are negatives
    for all questions). The positive of question i is column i."""
    if q.shape[0] != p.shape[0]:
        raise ValueError(f"{q.shape[0]} queries but {p.shape[0]} positive passages")
    candidates = p
    if negatives is not None:
        if negatives.dim() == 3:  # (B, N, D) -> (B*N, D), question-major
            negatives = negatives.reshape(-1, negatives.shape[-1])
        if negatives.shape[0] % q.shape[0] != 0:
            raise ValueError(f"{negatives.shape[0]} negatives is not a multiple of batch size {q.shape[0]}")
        candidates = torch.cat([p, negatives], dim=0)
    return scale * q @ candidates.T


def per_query_cross_entropy(logits: torch.Tensor) -> torch.Tensor:
    """CE of each row with its target on the diagonal (row i -> column i); shape (B,)."""
    targets = torch.arange(logits.shape[0], device=logits.device)
    return F.cross_entropy(logits, targets, reduction="none")


def no_weights(name: str, weights: torch.Tensor | None) -> None:
    if weights is not None:
        raise ValueError(f"{name} takes no per-pair weights; use WeightedInBatchSoftmaxLoss")
