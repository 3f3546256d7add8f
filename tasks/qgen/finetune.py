"""Fine-tune a question generator (models/generator.py's QueryGenerator) on (passage -> question)
pairs of the train split, on the shared training loop (tasks/training/trainer.py `run_training`):
AdamW groups, linear warm-up then decay, clipping, bf16 autocast (CUDA, CPUs with bf16 units),
resumable checkpoints under out_dir/checkpoints/step-XXXXXXX and the best model by dev loss in
out_dir/best, a generator folder (`QueryGenerator.save_pretrained`) that `load_generator` reads.

The dev loss is the generator's mean token loss over the dev pairs (pairs-weighted mean of the
batch losses), in eval mode and without touching the training's random stream; lower is better.
The untrained model is evaluated too and can win. The generator object keeps the last step's
weights; out_dir/best holds the best ones.
"""
from __future__ import annotations

import contextlib
import logging
import shutil
from pathlib import Path
from typing import Optional, Sequence

import torch
from pydantic import Field
from torch import nn

from tasks.training.arguments import ScheduleArgs
from tasks.training.checkpoints import CHECKPOINTS, list_checkpoints
from tasks.training.data import ShuffledBatches
from tasks.training.precision import bf16_autocast, use_bf16
from tasks.training.trainer import run_training

log = logging.getLogger(__name__)

Pair = tuple[tuple[Optional[str], str], str]  # ((title, text), question)


class GeneratorTrainArgs(ScheduleArgs):
    """Settings of a generator fine-tuning run (the device is an argument of the call)."""

    lr: float = Field(1e-4, gt=0, description="peak learning rate (AdamW)")
    batch_size: int = Field(8, ge=1, description="pairs per optimizer step")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay (none on biases and LayerNorm)")
    max_grad_norm: Optional[float] = Field(1.0, ge=0, description="gradient clipping norm; empty or 0: no clipping")
    max_source_len: int = Field(256, ge=1, description="passage tokens (title and text, with the prompt)")
    max_target_len: int = Field(32, ge=1, description="question tokens")


class GeneratorModule(nn.Module):
    """The generator as run_training's model and loss at once: its parameters are the generator's,
    its forward is the generator's training loss, and it saves (checkpoints, best/) and loads as a
    generator folder."""

    def __init__(self, generator) -> None:
        super().__init__()
        self.generator = generator
        self.model = generator.model

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.generator.loss(batch)

    def save_pretrained(self, directory: str | Path) -> Path:
        return self.generator.save_pretrained(directory)

    @classmethod
    def from_pretrained(cls, directory: str | Path, load_tokenizer: bool = False) -> "GeneratorModule":
        from models.generator import load_generator

        return cls(load_generator(str(directory)))


class PairCollate:
    """(passage, question) pairs -> (the generator's training batch,), run_training's collate;
    it keeps no state (the order is the sampler's)."""

    def __init__(self, generator, args: GeneratorTrainArgs) -> None:
        self.generator, self.args = generator, args

    def __call__(self, pairs: Sequence[Pair], epoch: int = 0) -> tuple[dict[str, torch.Tensor]]:
        return (self.generator.training_batch([p for p, _ in pairs], [q for _, q in pairs],
                                              max_source_len=self.args.max_source_len,
                                              max_target_len=self.args.max_target_len),)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class DevLoss:
    """run_training's evaluator: the generator's mean token loss over `pairs` (pairs-weighted mean
    of the batch losses), under bf16 autocast when the training autocasts; lower is better."""

    primary_metric = "dev_loss"
    greater_is_better = False

    def __init__(self, generator, pairs: Sequence[Pair], collate: PairCollate, batch_size: int, bf16: str) -> None:
        self.generator, self.pairs, self.collate, self.batch_size, self.bf16 = generator, pairs, collate, batch_size, bf16

    def __call__(self, model: nn.Module) -> dict[str, float]:
        device = next(self.generator.model.parameters()).device
        autocast = bf16_autocast(device) if use_bf16(self.bf16, device) else contextlib.nullcontext
        total = 0.0
        with autocast():
            for start in range(0, len(self.pairs), self.batch_size):
                chunk = self.pairs[start:start + self.batch_size]
                batch = {k: v.to(device) for k, v in self.collate(chunk)[0].items()}
                total += float(self.generator.loss(batch).float()) * len(chunk)
        return {self.primary_metric: total / len(self.pairs)}


def _drop_unloadable_checkpoints(out_dir: Path) -> None:
    """Checkpoints holding a bare state dict (model.pt) instead of a generator folder cannot
    resume on run_training: they are removed, so the run starts afresh rather than failing."""
    for _, ckpt in list_checkpoints(out_dir):
        if (ckpt / "model.pt").is_file() and not (ckpt / "model").is_dir():
            log.warning("%s holds a generator state dict, which cannot resume: starting afresh", ckpt)
            shutil.rmtree(ckpt, ignore_errors=True)


def finetune_generator(
    generator,
    train_pairs: Sequence[Pair],
    dev_pairs: Sequence[Pair],
    args: GeneratorTrainArgs,
    out_dir: str | Path,
    device: str = "auto",
    progress: bool = False,
) -> dict:
    """Fine-tune `generator` on `train_pairs` ((title, text), question) in batches of a seeded
    shuffle per epoch (the last one may be short); pick the best step by the loss on `dev_pairs`.
    A run started on an out_dir holding checkpoints resumes exactly from the latest one.

    Returns run_training's result ({history, dev_curve: [(step, dev_loss)], best_step,
    best_metric: the best dev loss, start_metric, seconds, pairs_per_second, total_steps,
    resumed_from}), also written to out_dir/history.json.
    """
    if not train_pairs:
        raise ValueError("no train pairs to fine-tune the generator on")
    if not dev_pairs:
        raise ValueError("no dev pairs: the best checkpoint is picked by the dev loss")
    out_dir = Path(out_dir)
    if (out_dir / CHECKPOINTS).is_dir():
        _drop_unloadable_checkpoints(out_dir)
    module = GeneratorModule(generator)
    collate = PairCollate(generator, args)
    sampler = ShuffledBatches(len(train_pairs), args.batch_size, args.seed, drop_last=False)
    evaluator = DevLoss(generator, list(dev_pairs), collate, args.batch_size, args.bf16)
    return run_training(module, module, train_pairs, sampler, collate, args, out_dir, evaluator=evaluator,
                        progress=progress, device=device, eval_at_start=True, desc="generator")
