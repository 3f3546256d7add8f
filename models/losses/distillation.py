"""Distillation from a cross-encoder's scores into the dual encoder (beyond the papers; GPL and
Tevatron do it). Each question's candidates are its positive and its N drawn hard negatives;
`teacher_scores` (B, 1 + N) are the teacher's logits for them in that order."""
from __future__ import annotations

from typing import Any, ClassVar, Mapping

import torch
import torch.nn.functional as F

from .base import EmbeddingLoss, no_weights


class DistillationLoss(EmbeddingLoss):
    """Base: student scores s(q, c) = scale * q . c over each question's own candidates."""

    uses_teacher_scores: ClassVar[bool] = True

    def forward(self, query_batch: Mapping[str, Any], passage_batch: Mapping[str, Any],
                negative_batch: Mapping[str, Any] | None = None, weights: torch.Tensor | None = None,
                teacher_scores: torch.Tensor | None = None) -> torch.Tensor:
        if negative_batch is None:
            raise ValueError(f"{type(self).__name__} needs hard negatives (hard_negatives >= 1)")
        q = self.model.encode_query(query_batch)
        p = self.model.encode_passage(passage_batch)
        n = self.model.encode_passage(negative_batch)
        return self.compute_loss_from_embeddings(q, p, negatives=n, weights=weights, teacher_scores=teacher_scores)

    def student_scores(self, q: torch.Tensor, p: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        """(B, 1 + N): each question against its positive, then its own N negatives."""
        b = q.shape[0]
        if negatives.dim() == 2:
            if negatives.shape[0] % b:
                raise ValueError(f"{negatives.shape[0]} negatives is not a multiple of batch size {b}")
            negatives = negatives.reshape(b, negatives.shape[0] // b, -1)
        candidates = torch.cat([p.unsqueeze(1), negatives], dim=1)  # (B, 1 + N, D)
        return self.scale * torch.einsum("bd,bcd->bc", q, candidates)

    def compute_loss_from_embeddings(self, q, p, negatives=None, weights=None, teacher_scores=None) -> torch.Tensor:
        no_weights(type(self).__name__, weights)
        if teacher_scores is None or negatives is None:
            raise ValueError(f"{type(self).__name__} needs hard negatives and teacher scores")
        student = self.student_scores(q, p, negatives)
        teacher = teacher_scores.to(student.dtype)
        if teacher.shape != student.shape:
            raise ValueError(f"teacher scores {tuple(teacher.shape)} do not match the candidates {tuple(student.shape)}")
        return self.distil(student.float(), teacher.float())

    def distil(self, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class MarginMSELoss(DistillationLoss):
    """Margin-MSE (Hofstaetter et al. 2020): the student's margin s(q, p+) - s(q, n) regresses on
    the teacher's, for every drawn negative; mean over questions and negatives."""

    def distil(self, student, teacher):
        return F.mse_loss(student[:, :1] - student[:, 1:], teacher[:, :1] - teacher[:, 1:])


class ListwiseKLLoss(DistillationLoss):
    """Listwise KL: KL(softmax(teacher / T) || softmax(student)) over each question's candidates,
    averaged over questions."""

    def __init__(self, model, scale: float | None = None, temperature: float = 1.0) -> None:
        super().__init__(model, scale=scale)
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.temperature = float(temperature)

    def distil(self, student, teacher):
        return F.kl_div(F.log_softmax(student, dim=-1), F.log_softmax(teacher / self.temperature, dim=-1),
                        log_target=True, reduction="batchmean")
