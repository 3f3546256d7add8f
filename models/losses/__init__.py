from torch import nn

from .base import EmbeddingLoss
from .bidirectional import BidirectionalSoftmaxLoss
from .distillation import ListwiseKLLoss, MarginMSELoss
from .in_batch import InBatchSoftmaxLoss
from .weighted import WeightedInBatchSoftmaxLoss, WeightNormalization, silver_weight
from .xmoco import XMoCoLoss

# The losses by the name a config gives them (sentence-transformers-like: each an nn.Module built
# around the model). A new objective registers here and is then selectable by name.
LOSSES: dict[str, type] = {
    "dpr": InBatchSoftmaxLoss,
    "bidirectional": BidirectionalSoftmaxLoss,
    "weighted": WeightedInBatchSoftmaxLoss,
    "margin_mse": MarginMSELoss,
    "listwise_kl": ListwiseKLLoss,
    "xmoco": XMoCoLoss,  # paper 000: momentum encoders and queues (needs shared: false)
}


def check_loss_options(name: str, options: dict) -> None:
    """Raise ValueError when the loss registered as `name` does not take the keyword `options`
    (so a config's typo fails when it is loaded, not at the first training step)."""
    import inspect

    cls = LOSSES[name]
    try:
        inspect.signature(cls.__init__).bind(None, None, **options)
    except TypeError as exc:
        raise ValueError(f"loss {name!r} does not take options {sorted(options)}: {exc}") from None


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
    "ListwiseKLLoss",
    "MarginMSELoss",
    "WeightNormalization",
    "WeightedInBatchSoftmaxLoss",
    "XMoCoLoss",
    "build_loss",
    "check_loss_options",
    "silver_weight",
]
