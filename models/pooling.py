"""Pooling of token states into one vector per sequence."""
from __future__ import annotations

from enum import Enum

import torch


class Pooling(str, Enum):
    CLS = "cls"    # hidden state of the first token ([CLS]); papers 001/003
    MEAN = "mean"  # attention-mask-weighted mean of the token states


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor | None, pooling: Pooling | str) -> torch.Tensor:
    """Pool `hidden` (B, T, H) to (B, H)."""
    pooling = Pooling(pooling)
    if pooling is Pooling.CLS:
        return hidden[:, 0]
    if attention_mask is None:
        return hidden.mean(dim=1)
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
