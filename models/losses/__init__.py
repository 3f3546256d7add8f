from .base import EmbeddingLoss
from .bidirectional import BidirectionalSoftmaxLoss
from .in_batch import InBatchSoftmaxLoss
from .weighted import WeightedInBatchSoftmaxLoss, WeightNormalization, silver_weight

__all__ = [
    "BidirectionalSoftmaxLoss",
    "EmbeddingLoss",
    "InBatchSoftmaxLoss",
    "WeightNormalization",
    "WeightedInBatchSoftmaxLoss",
    "silver_weight",
]
