"""Cross-attention classifier (paper 001 section 4.1): "[CLS] question [SEP] passage [SEP]" through a
BERT-style encoder with a one-logit head; p = sigmoid(logit) is the probability that the passage
answers the question.

The saved folder is a plain transformers sequence-classification checkpoint with its tokenizer,
so `sentence_transformers.CrossEncoder(folder)` loads it (one label: sigmoid activation) and
scores exactly what `CrossEncoderModel.score` scores.
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from .checkpoints import resolve_checkpoint
from .length_pieces import encode_in_pieces

CONFIG_NAME = "cross_encoder_config.json"
_MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# sentence-transformers reads this from config.json to pick predict()'s activation
_ST_ACTIVATION = "torch.nn.modules.activation.Sigmoid"

Pair = tuple[str, str]  # (question, passage)


class CrossEncoderModel(nn.Module):
    """`forward(features)` -> one logit per pair, shape (B,); `score(pairs)` -> probabilities."""

    def __init__(self, backbone: nn.Module, tokenizer: Any, max_length: int = 256) -> None:
        super().__init__()
        if getattr(backbone.config, "num_labels", 1) != 1:
            raise ValueError(f"a cross-encoder has one logit; the backbone has {backbone.config.num_labels} labels")
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.max_length = int(max_length)
        # Rows per length-sorted piece of a batch (models/length_pieces.py); None: whole batches.
        # How fast, not what: set for a training run by `encoding_in_pieces`, never saved.
        self.rows_per_piece: int | None = None

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def from_base(cls, base: str, max_length: int = 256) -> "CrossEncoderModel":
        """A base encoder (an alias such as 'minilm', a hub name or a folder) with a freshly
        initialised one-logit head (paper 001 section 4.1: BERT fine-tuned as a classifier)."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
        from transformers.utils import logging as hf_logging

        path = resolve_checkpoint(base)
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # "newly initialized: classifier" is the point here
        try:
            backbone = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
        finally:
            hf_logging.set_verbosity(verbosity)
        return cls(backbone, AutoTokenizer.from_pretrained(path), max_length)

    @classmethod
    def from_pretrained(cls, directory: str | Path, load_tokenizer: bool = True) -> "CrossEncoderModel":
        """A folder written by `save_pretrained` (or any one-label sequence-classification
        checkpoint: then max_length comes from the tokenizer, capped at 512)."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        directory = Path(directory)
        settings = json.loads((directory / CONFIG_NAME).read_text()) if (directory / CONFIG_NAME).is_file() else {}
        backbone = AutoModelForSequenceClassification.from_pretrained(str(directory), num_labels=1)
        tokenizer = AutoTokenizer.from_pretrained(str(directory)) if load_tokenizer else None
        max_length = settings.get("max_length") or min(int(getattr(tokenizer, "model_max_length", 512) or 512), 512)
        return cls(backbone, tokenizer, max_length)

    def save_pretrained(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.backbone.config.sentence_transformers = {"activation_fn": _ST_ACTIVATION}
        self.backbone.save_pretrained(directory)
        if self.tokenizer is not None:
            # CrossEncoder(folder) truncates at the tokenizer's model_max_length: make it ours
            self.tokenizer.model_max_length = self.max_length
            self.tokenizer.save_pretrained(directory)
        (directory / CONFIG_NAME).write_text(json.dumps({"max_length": self.max_length}, indent=2))
        return directory

    # -- forward ----------------------------------------------------------------------------
    def forward(self, features: Mapping[str, torch.Tensor]) -> torch.Tensor:
        inputs = {k: v for k, v in features.items() if k in _MODEL_INPUTS}
        return encode_in_pieces(lambda piece: self.backbone(**piece).logits.squeeze(-1), inputs, self.rows_per_piece)

    def tokenize(self, pairs: Sequence[Pair]) -> dict[str, list]:
        """Unpadded token ids of the pairs, truncated to `max_length` (longest segment first, as
        sentence-transformers does)."""
        questions = [q for q, _ in pairs]
        passages = [p for _, p in pairs]
        return self.tokenizer(questions, passages, truncation="longest_first", max_length=self.max_length,
                              padding=False)

    def collate(self, pairs: Sequence[Pair]) -> dict[str, torch.Tensor]:
        """Pairs -> one padded batch (padding to the batch's longest pair)."""
        return dict(self.tokenizer.pad(self.tokenize(pairs), padding="longest", return_tensors="pt"))

    @torch.inference_mode()
    def logits(self, pairs: Sequence[Pair], batch_size: int = 64, device: str | torch.device | None = None,
               bf16: bool = False, progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        """One logit per pair, in the pairs' order. The pairs are tokenised in one call and
        batched longest first, so each batch pads to nearly its own length; `progress(done,
        total)` after each batch."""
        if not len(pairs):
            return np.zeros(0, dtype=np.float32)
        device = torch.device(device) if device is not None else next(self.parameters()).device
        encoded = self.tokenize(pairs)
        lengths = np.array([len(ids) for ids in encoded["input_ids"]])
        order = np.argsort(-lengths, kind="stable")
        keys = [k for k in encoded.keys() if k in _MODEL_INPUTS]
        out = np.empty(len(pairs), dtype=np.float32)
        was_training = self.training
        self.eval()
        # bf16 autocast on the CPU as on CUDA when asked: fast with bf16 units (AMX, avx512_bf16), emulated elsewhere
        autocast = (lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)) if bf16 \
            else contextlib.nullcontext
        try:
            for start in range(0, len(order), batch_size):
                rows = order[start:start + batch_size]
                batch = self.tokenizer.pad({k: [encoded[k][i] for i in rows] for k in keys}, padding="longest",
                                           return_tensors="pt")
                batch = {k: v.to(device) for k, v in batch.items()}
                with autocast():
                    values = self(batch)
                out[rows] = values.float().cpu().numpy()
                if progress is not None:
                    progress(min(start + batch_size, len(order)), len(order))
        finally:
            self.train(was_training)
        return out

    def score(self, pairs: Sequence[Pair], batch_size: int = 64, device: str | torch.device | None = None,
              bf16: bool = False, progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        """p = sigmoid(logit) per pair (paper 001 section 4.3 keeps pairs with p >= 0.5)."""
        return sigmoid(self.logits(pairs, batch_size, device, bf16, progress))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(np.float32)


class BinaryCrossEntropyLoss(nn.Module):
    """The classifier's loss: BCE on the logit, labels 1 (gold) and 0 (sampled negatives)."""

    def __init__(self, model: CrossEncoderModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, features: Mapping[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        logits = self.model(features)
        return nn.functional.binary_cross_entropy_with_logits(logits.float(), labels.float())


