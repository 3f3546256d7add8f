"""Bidirectional in-batch softmax (paper 003 section 3, eq. 1-3)."""
from __future__ import annotations

import torch

from .base import EmbeddingLoss, forward_logits, no_weights, per_query_cross_entropy


class BidirectionalSoftmaxLoss(EmbeddingLoss):
    """L = 0.5 * (L_f + L_b) (eq. 3).

    L_f (eq. 1): question -> passages; hard negatives, when given, widen it to (N+1)*B columns.
    L_b (eq. 2): passage -> the batch's questions only; hard negatives are not used in this
    direction (paper 003 footnote 3).
    """

    def compute_loss_from_embeddings(self, q, p, negatives=None, weights=None) -> torch.Tensor:
        no_weights(type(self).__name__, weights)
        forward = per_query_cross_entropy(forward_logits(q, p, negatives, self.scale)).mean()
        backward = per_query_cross_entropy(self.scale * p @ q.T).mean()
        return 0.5 * (forward + backward)
