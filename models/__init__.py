"""Torch modules: encoders, pooling, the bi-encoder and the losses."""
from .bi_encoder import BiEncoder, BiEncoderConfig, format_passage, format_passages
from .checkpoints import resolve_checkpoint
from .losses import (
    BidirectionalSoftmaxLoss,
    InBatchSoftmaxLoss,
    WeightedInBatchSoftmaxLoss,
    WeightNormalization,
)
from .pooling import Pooling, pool

__all__ = [
    "BiEncoder",
    "BiEncoderConfig",
    "BidirectionalSoftmaxLoss",
    "InBatchSoftmaxLoss",
    "Pooling",
    "WeightNormalization",
    "WeightedInBatchSoftmaxLoss",
    "format_passage",
    "format_passages",
    "pool",
    "resolve_checkpoint",
]
