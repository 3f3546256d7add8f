"""Hooks into the training loop (transformers' TrainerCallback idea, smaller).

`tasks.training.trainer.run_training` (and `train_bi_encoder(..., callbacks=[...])`) calls each
hook at a fixed point of every step; a loss module that also subclasses `TrainerCallback`
(`class MyLoss(EmbeddingLoss, TrainerCallback)`) has its hooks called too, before the other callbacks', so an objective with state of its own (momentum
encoders, queues) plugs in without editing the loop.

State: callbacks own their state. The trainer checkpoints the loss module's own parameters and
buffers (those not belonging to the model) together with the model, so a loss that keeps its
state there resumes exactly; anything else a callback keeps is neither saved nor restored by the
trainer. A resumed run calls `on_train_begin` again and then continues at the checkpoint's step.
A hook that draws random numbers shifts the training's random stream (which the checkpoints
record), so draw them deterministically or from a generator of your own.
"""
from __future__ import annotations

from typing import Any, Mapping

from torch import nn
from torch.optim import Optimizer


class TrainerCallback:
    """Base class: every hook is a no-op; override the ones you need. `step` counts optimizer
    updates: the first training step is 1; an evaluation of the untrained model is at step 0."""

    def on_train_begin(self, model: nn.Module, optimizer: Optimizer) -> None:
        """Once per call of the trainer, after set-up (and after restoring a checkpoint), before
        the first evaluation or step."""

    def on_batch(self, step: int, batch: tuple) -> None:
        """Before the forward of training step `step`; `batch` is the collated batch on the training
        device (the bi-encoder's: queries, positives, negatives, weights, by name; negatives None
        without hard negatives; weights always given, ones when unweighted)."""

    def on_step_end(self, step: int, model: nn.Module, optimizer: Optimizer) -> None:
        """After training step `step`'s optimizer.step() and scheduler.step(), before that step's
        evaluation and checkpoint."""

    def on_evaluate(self, step: int, metrics: Mapping[str, float]) -> None:
        """After each dev evaluation at `step`, with the evaluator's full metrics dict."""
