"""Bi-encoder training: data (examples, unique batch sampler, collator) and the trainer."""
from .data import Collator, TrainExample, UniqueBatchSampler
from .trainer import TrainerArgs, latest_checkpoint, train_bi_encoder

__all__ = ["Collator", "TrainExample", "TrainerArgs", "UniqueBatchSampler", "latest_checkpoint",
           "train_bi_encoder"]
