"""Query-as-context pre-training (paper 002): masking, the heads dropped after pre-training, and
the coCondenser and CoT-MAE objectives as loss modules the bi-encoder trainer runs."""
from .heads import MlmHead, TransformerHead, load_bert_mlm_head
from .losses import (
    PRETRAINING_LOSSES,
    CoCondenserLoss,
    CotMaeLoss,
    PretrainingLoss,
    build_pretraining_loss,
    contrastive_loss,
    masked_lm_sum,
    middle_layer_of,
)
from .masking import IGNORE, MaskSpec, mask_tokens, masked_count, step_generator

__all__ = [
    "IGNORE",
    "PRETRAINING_LOSSES",
    "CoCondenserLoss",
    "CotMaeLoss",
    "MaskSpec",
    "MlmHead",
    "PretrainingLoss",
    "TransformerHead",
    "build_pretraining_loss",
    "contrastive_loss",
    "load_bert_mlm_head",
    "mask_tokens",
    "masked_count",
    "masked_lm_sum",
    "middle_layer_of",
    "step_generator",
]
