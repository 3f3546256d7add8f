"""Training the cross-attention classifier through the shared training loop
(tasks/training/trainer.run_training: AdamW, warm-up and decay, bf16 autocast on CUDA and on CPUs
with bf16 units, exact resume), and its classification report in the shape of paper 001 table 2."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import torch
from pydantic import Field

from tasks.training.arguments import LENGTH_PIECES_HELP, LengthPieces, ScheduleArgs, rows_per_piece
from tasks.training.data import ShuffledBatches  # the classifier's sampler (full batches only)

Pair = tuple[str, str]


class ClassifierTrainArgs(ScheduleArgs):
    """The classifier's schedule. Paper 001 section 5.1 (full size): 10 epochs, batch 256,
    learning rate 3e-5; the defaults here are CPU-sized except the learning rate."""
    lr: float = Field(3e-5, gt=0, description="peak learning rate (paper 001 section 5.1: 3e-5)")
    batch_size: int = Field(16, ge=2, description="pairs per step (paper 001 section 5.1: 256)")
    max_length: int = Field(256, ge=8, description="tokens of question and passage together")
    length_pieces: LengthPieces = Field("auto", description=LENGTH_PIECES_HELP)


class PairCollator:
    """(pair, label) examples -> (features, labels): tokenised by the model, padded per batch."""

    def __init__(self, model) -> None:
        self.model = model

    def __call__(self, examples: Sequence[tuple[Pair, int]], epoch: int = 0):
        features = self.model.collate([pair for pair, _ in examples])
        return features, torch.tensor([float(label) for _, label in examples])

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class DevClassification:
    """The evaluator of the classifier's dev split: AUC, log-loss and accuracy. `primary` picks
    the checkpoint: AUC by default, since a classifier that predicts the base rate everywhere
    is well calibrated and wins on log-loss while it ranks nothing (it happened at CPU size)."""

    def __init__(self, pairs: Sequence[Pair], labels: Sequence[int], batch_size: int = 64,
                 primary: str = "auc") -> None:
        if primary not in ("auc", "log_loss"):
            raise ValueError(f"the classifier's dev metric is auc or log_loss, not {primary!r}")
        self.pairs, self.labels, self.batch_size = list(pairs), np.asarray(labels), batch_size
        self.primary_metric, self.greater_is_better = primary, primary == "auc"

    def __call__(self, model) -> dict[str, float]:
        p = np.clip(model.score(self.pairs, batch_size=self.batch_size), 1e-7, 1 - 1e-7)
        y = self.labels
        return {"auc": auc(y, p), "log_loss": float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))),
                "accuracy": float(np.mean((p >= 0.5) == (y == 1)))}


def train_classifier(model, pairs: Sequence[Pair], labels: Sequence[int], args: ClassifierTrainArgs, out_dir,
                     evaluator: Optional[Any] = None, device: str = "auto", progress: bool = False) -> dict:
    """Binary cross-entropy on (pair, label) examples; returns run_training's result (out_dir/best
    holds the best model by the evaluator's primary metric when an evaluator is given)."""
    from models.cross_encoder import BinaryCrossEntropyLoss
    from models.length_pieces import encoding_in_pieces
    from tasks.training.trainer import run_training

    examples = list(zip(pairs, labels))
    if len(examples) < args.batch_size:
        raise ValueError(f"only {len(examples)} classifier pairs for a batch of {args.batch_size}")
    with encoding_in_pieces(model, rows_per_piece(args.length_pieces, device)):
        return run_training(model, BinaryCrossEntropyLoss(model), examples,
                            ShuffledBatches(len(examples), args.batch_size, args.seed), PairCollator(model), args,
                            out_dir, evaluator=evaluator, progress=progress, device=device, eval_at_start=False,
                            desc="cross-encoder")


# -- the report (paper 001 table 2) -----------------------------------------------------------

def auc(labels: Sequence[int], scores: Sequence[float]) -> float:
    """Area under the ROC curve: the probability that a random positive outscores a random
    negative (ties count half); NaN without both classes."""
    y, s = np.asarray(labels), np.asarray(scores, dtype=np.float64)
    pos, neg = s[y == 1], s[y == 0]
    if not len(pos) or not len(neg):
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s))
    sorted_s = s[order]
    i = 0
    while i < len(s):  # average ranks over ties
        j = i
        while j + 1 < len(s) and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[y == 1].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def classification_metrics(labels: Sequence[int], predicted: Sequence[bool], scores: Sequence[float] | None) -> dict:
    y, yhat = np.asarray(labels) == 1, np.asarray(predicted, dtype=bool)
    tp, fp, fn = int((y & yhat).sum()), int((~y & yhat).sum()), int((y & ~yhat).sum())
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    return {"accuracy": float((y == yhat).mean()) if len(y) else float("nan"), "precision": precision,
            "recall": recall, "f1": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
            "auc": auc(labels, scores) if scores is not None else float("nan")}


def best_threshold(labels: Sequence[int], scores: Sequence[float]) -> float:
    """The score threshold with the best accuracy (ties: the lowest), for a scorer with no
    natural cut such as a dual encoder's cosine; chosen on held-out pairs, never the reported ones."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels) == 1
    candidates = np.unique(s)
    accuracy = [float(((s >= t) == y).mean()) for t in candidates]
    return float(candidates[int(np.argmax(accuracy))]) if len(candidates) else 0.0


def classification_report(labels: Sequence[int], cross_p: Sequence[float], dual_scores: Sequence[float] | None,
                          dual_threshold: float | None) -> list[dict]:
    """Rows of paper 001 table 2: majority baseline (always false), the dual encoder with its
    tuned threshold, the cross-attention classifier at p >= 0.5."""
    rows = [{"model": "majority (always false)", **classification_metrics(labels, [False] * len(labels), None)}]
    if dual_scores is not None and dual_threshold is not None:
        rows.append({"model": f"dual encoder (cosine >= {dual_threshold:.3f})",
                     **classification_metrics(labels, np.asarray(dual_scores) >= dual_threshold, dual_scores)})
    rows.append({"model": "cross-attention (p >= 0.5)",
                 **classification_metrics(labels, np.asarray(cross_p) >= 0.5, cross_p)})
    return rows
