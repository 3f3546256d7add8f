"""Bi-encoder training: data (examples, unique batch sampler, collator) and the trainer."""
from .arguments import TrainerArgs
from .checkpoints import latest_checkpoint
from .data import Collator, TrainExample, UniqueBatchSampler
from .trainer import train_bi_encoder

__all__ = ["Collator", "TrainExample", "TrainerArgs", "UniqueBatchSampler", "latest_checkpoint",
           "train_bi_encoder"]
