"""DPR in-batch softmax with optional hard negatives (paper 003 section 4.3)."""
from __future__ import annotations

import torch

from .base import EmbeddingLoss, forward_logits, no_weights, per_query_cross_entropy


class InBatchSoftmaxLoss(EmbeddingLoss):
    """mean_i CE(scale * q_i . [p_1..p_B, n_1..n_{N*B}], target i).

    With N hard negatives per question every question scores (N+1)*B passages.
    """

    def compute_loss_from_embeddings(self, q, p, negatives=None, weights=None) -> torch.Tensor:
        no_weights(type(self).__name__, weights)
        return per_query_cross_entropy(forward_logits(q, p, negatives, self.scale)).mean()
