"""One padded batch encoded as length-sorted pieces, each cut to its own longest row.

A training step must encode its passages together (they are one another's in-batch negatives), so
the collator pads them to the batch's longest; title plus 100 words runs from about 120 to 200
MiniLM tokens, so much of a step's passage tokens are padding (benchmarks/length_pieces.py counts
them). The encoder reads each row alone (attention is masked within a row; pooling reads the row's
own tokens), so encoding the rows in pieces of similar length, each padded to its own longest, gives
the same vectors with less padding (equal to float rounding; in training, dropout draws its masks
per piece), and the loss still sees the whole batch. Only right-padded batches are cut: trimming
columns on the left would move the positions of a left-padded row.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Callable, Mapping

import torch
from torch import nn

logger = logging.getLogger("passage_forge")
Pieces = list[tuple[torch.Tensor, int]]   # (the batch rows of a piece, its longest row's length)


def is_right_padded(attention_mask: torch.Tensor) -> bool:
    """Whether every row's tokens come first and its padding after them."""
    return bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())


def length_pieces(attention_mask: torch.Tensor | None, rows_per_piece: int | None) -> Pieces | None:
    """The rows in pieces of `rows_per_piece`, longest first, with each piece's length; None when
    the batch is encoded whole (no mask, no piece size, too few rows, or not right-padded)."""
    if attention_mask is None or not rows_per_piece or attention_mask.dim() != 2:
        return None
    if attention_mask.shape[0] <= rows_per_piece or not is_right_padded(attention_mask):
        return None
    lengths = attention_mask.sum(dim=1)
    order = torch.argsort(lengths, descending=True, stable=True)
    return [(order[start:start + rows_per_piece], int(lengths[order[start]]))
            for start in range(0, len(order), rows_per_piece)]


def piece_of(inputs: Mapping[str, torch.Tensor], rows: torch.Tensor, length: int) -> dict[str, torch.Tensor]:
    """The model inputs of one piece: its rows, cut to `length` columns."""
    return {name: value[rows, :length] for name, value in inputs.items()}


def batch_pieces(inputs: Mapping[str, torch.Tensor],
                 rows_per_piece: int | None) -> list[tuple[torch.Tensor | None, dict[str, torch.Tensor]]]:
    """(the batch rows, the tensors of `inputs` cut to them) for each piece `length_pieces` cuts
    from the batch, or [(None, inputs)] when it is read whole (so is a batch with a tensor not
    shaped as its mask, such as broadcast position ids)."""
    mask = inputs.get("attention_mask")
    pieces = length_pieces(mask, rows_per_piece)
    if pieces is None or any(value.shape != mask.shape for value in inputs.values()):
        return [(None, dict(inputs))]
    return [(rows, piece_of(inputs, rows, length)) for rows, length in pieces]


def in_batch_order(parts: list[torch.Tensor], rows: list[torch.Tensor | None]) -> torch.Tensor:
    """The pieces' per-row outputs (from `batch_pieces`, in its order) back in the batch's row order
    (differentiable: the gradient reaches every piece)."""
    if len(parts) == 1 and rows[0] is None:
        return parts[0]
    return torch.cat(parts)[torch.argsort(torch.cat(rows))]


def encode_in_pieces(encode: Callable[[Mapping[str, torch.Tensor]], torch.Tensor],
                     inputs: Mapping[str, torch.Tensor], rows_per_piece: int | None) -> torch.Tensor:
    """`encode(inputs)` (one vector a row), computed piece by piece where `length_pieces` cuts the
    batch, the vectors back in the batch's row order."""
    pieces = batch_pieces(inputs, rows_per_piece)
    return in_batch_order([encode(piece) for _, piece in pieces], [rows for rows, _ in pieces])


@contextlib.contextmanager
def encoding_in_pieces(module: nn.Module, rows_per_piece: int | None):
    """Every model in `module` that encodes in pieces (it has `rows_per_piece`: the dual encoder,
    the cross-encoder) cuts its batches into pieces of `rows_per_piece` rows while the block runs;
    a loss holds its model, and xMoCo's its slow copy too (the pre-training objectives read their
    model's setting, models/pretraining/losses.py)."""
    models = [m for m in module.modules() if hasattr(m, "rows_per_piece")]
    if rows_per_piece and not models:   # a loss that keeps its model elsewhere: it trains, only slower
        logger.warning("%s holds no model that encodes in pieces: its batches are encoded whole",
                       type(module).__name__)
    before = [m.rows_per_piece for m in models]
    for model in models:
        model.rows_per_piece = rows_per_piece
    try:
        yield
    finally:
        for model, rows in zip(models, before):
            model.rows_per_piece = rows
