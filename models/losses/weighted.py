"""Weighted in-batch softmax (paper 001 section 4.2, eq. 2)."""
from __future__ import annotations

from enum import Enum
from typing import ClassVar

import torch

from .base import EmbeddingLoss, forward_logits, per_query_cross_entropy


class WeightNormalization(str, Enum):
    SUM_OF_WEIGHTS = "sum_of_weights"  # sum_i w_i CE_i / sum_i w_i  (default)
    BATCH_SIZE = "batch_size"          # sum_i w_i CE_i / B
    NONE = "none"                      # sum_i w_i CE_i (eq. 2 literally: a sum over the batch)


def silver_weight(probability: torch.Tensor | float) -> torch.Tensor | float:
    """Paper 001 section 4.2: a mined (silver) pair weighs p(x, y)^2; gold pairs weigh 1."""
    return probability**2


class WeightedInBatchSoftmaxLoss(EmbeddingLoss):
    """Paper 001 eq. 2: each pair's in-batch softmax term times w(x, y) (1 gold, p^2 silver).

    Eq. 2 is written as an unnormalised sum over the batch; we divide by sum_i w_i by default, so
    all weights 1 equals the plain mean in-batch softmax and the loss scale does not depend on how
    many silver pairs a batch holds (zero-weight rows are ignored entirely). `normalization`
    selects the alternatives. Hard negatives, when given, widen the logits as in paper 003 4.3.
    """

    uses_weights: ClassVar[bool] = True

    def __init__(self, model, scale: float | None = None,
                 normalization: WeightNormalization | str = WeightNormalization.SUM_OF_WEIGHTS) -> None:
        super().__init__(model, scale=scale)
        self.normalization = WeightNormalization(normalization)

    def compute_loss_from_embeddings(self, q, p, negatives=None, weights=None) -> torch.Tensor:
        ce = per_query_cross_entropy(forward_logits(q, p, negatives, self.scale))
        if weights is None:
            weights = torch.ones_like(ce)
        weights = torch.as_tensor(weights, dtype=ce.dtype, device=ce.device).reshape(-1)
        if weights.shape[0] != ce.shape[0]:
            raise ValueError(f"{weights.shape[0]} weights for a batch of {ce.shape[0]}")
        if (weights < 0).any():
            raise ValueError("weights must be non-negative")
        # mask, not multiply, so that a zero-weight row with an infinite CE cannot make NaN
        weighted = torch.where(weights > 0, weights * ce, torch.zeros_like(ce)).sum()
        if self.normalization is WeightNormalization.SUM_OF_WEIGHTS:
            total = weights.sum()
            if total <= 0:
                return weighted * 0.0
            return weighted / total
        if self.normalization is WeightNormalization.BATCH_SIZE:
            return weighted / ce.shape[0]
        return weighted
