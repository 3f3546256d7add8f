from torch import nn

from .base import EmbeddingLoss
from .bidirectional import BidirectionalSoftmaxLoss
from .in_batch import InBatchSoftmaxLoss
from .weighted import WeightedInBatchSoftmaxLoss, WeightNormalization, silver_weight

# The losses by the name a config gives them (sentence-transformers-like: each an nn.Module built
# around the model). A new objective registers here and is then selectable by name.
LOSSES: dict[str, type] = {
    "dpr": InBatchSoftmaxLoss,
    "bidirectional": BidirectionalSoftmaxLoss,
    "weighted": WeightedInBatchSoftmaxLoss,
}


def build_loss(name: str, model, **options) -> nn.Module:
    """The loss registered as `name`, built around `model`; `options` go to its constructor
    (e.g. `scale=`, or `normalization=` for "weighted")."""
    try:
        cls = LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown loss {name!r}; known losses: {', '.join(sorted(LOSSES))}") from None
    return cls(model, **options)


__all__ = [
    "LOSSES",
    "BidirectionalSoftmaxLoss",
    "EmbeddingLoss",
    "InBatchSoftmaxLoss",
    "WeightNormalization",
    "WeightedInBatchSoftmaxLoss",
    "build_loss",
    "silver_weight",
]
