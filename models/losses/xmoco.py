"""xMoCo: cross momentum contrast (paper 000, section 4).

Four encoders: the model's fast question and passage towers (trained by gradient) and slow copies
of them kept here (moved toward the fast ones after every optimizer step). Two FIFO queues hold
slow vectors: Q_p of passages, Q_q of questions. Each step the batch's slow vectors are pushed into
the queues and then

    L_qp = CE(fast_q(q) . Q_p, target: slow_p(p))     question -> passages
    L_pq = CE(fast_p(p) . Q_q, target: slow_q(q))     passage -> questions
    L    = lam L_qp + (1 - lam) L_pq  (+ w L_hard with hard negatives, section 4.4)

Only the model (the fast towers) is saved or exported; the slow encoders and the queues are this
module's own parameters and buffers, which the trainer checkpoints and restores on resume.
Under torch.distributed the slow vectors and their ids of every rank are gathered before they are
enqueued, so every rank holds the same queues.
"""
from __future__ import annotations

import copy
import functools
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from models.callbacks import TrainerCallback

from .base import EmbeddingLoss, no_weights

QUEUE_SIZE = 16_384   # paper 000 section 5.3: "The queue size of negative examples ... is 16,384"
MOMENTUM = 0.001      # paper 000 section 5.3: momentum coefficient alpha = 0.001
LAMBDA = 0.5          # paper 000 section 4.2: lambda "simply set to 0.5 in all experiments"
EMPTY = -1            # id of a queue slot not yet written

# Text ids: a polynomial hash of the non-pad token ids, modulo two primes below 2^31, combined into
# one non-negative int64 (collisions ~2^-62 per pair: a collision only masks one negative).
_HASH_BASE = 1_000_003
_HASH_PRIMES = (2_147_483_647, 2_147_483_629)


# -- pieces -------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=64)
def _powers(length: int, prime: int) -> torch.Tensor:
    """_HASH_BASE^i mod prime for i < length (CPU, int64)."""
    out, value = [], 1
    for _ in range(length):
        out.append(value)
        value = value * _HASH_BASE % prime
    return torch.tensor(out, dtype=torch.long)


def text_ids(batch: Mapping[str, Any]) -> torch.Tensor:
    """A stable int64 id per row of a tokenised batch: the same token sequence (whatever its
    padding or batch) gives the same id. The collated batches carry token ids only, so this stands
    in for the passage/question id that false-negative masking compares (section 4.5)."""
    ids = batch["input_ids"].long()
    mask = batch.get("attention_mask")
    mask = torch.ones_like(ids) if mask is None else mask.long()
    position = (mask.cumsum(1) - 1).clamp(min=0)  # rank among the real tokens: padding side is irrelevant
    parts = []
    for prime in _HASH_PRIMES:
        tokens = ((ids + 1) * mask) % prime  # +1: token id 0 still counts, padding adds 0
        terms = tokens * _powers(ids.shape[1], prime).to(ids.device)[position] % prime  # < 2^62, no overflow
        parts.append(terms.sum(1) % prime)
    return parts[0] * _HASH_PRIMES[1] + parts[1]


@torch.no_grad()
def momentum_update(slow: nn.Module, fast: nn.Module, alpha: float) -> None:
    """E_slow <- alpha E_fast + (1 - alpha) E_slow, parameter by parameter (section 4.2)."""
    slow_named, fast_named = list(slow.named_parameters()), list(fast.named_parameters())
    if [n for n, _ in slow_named] != [n for n, _ in fast_named]:
        raise ValueError("the slow and fast encoders do not have the same parameters")
    slow_params, fast_params = [p for _, p in slow_named], [p for _, p in fast_named]
    torch._foreach_mul_(slow_params, 1.0 - alpha)
    torch._foreach_add_(slow_params, [p.detach() for p in fast_params], alpha=alpha)


def queue_contrast(fast: torch.Tensor, queue: torch.Tensor, queue_ids: torch.Tensor,
                   target_slots: torch.Tensor, target_ids: torch.Tensor, scale: float) -> torch.Tensor:
    """Per-row CE of `scale * fast . queue` with row i's target at queue slot `target_slots[i]`;
    empty slots and other slots holding the target's id (false negatives, section 4.5) are masked
    out. Shape (B,)."""
    logits = scale * fast @ queue.to(fast.dtype).T
    masked = (queue_ids == EMPTY)[None, :] | (queue_ids[None, :] == target_ids[:, None])
    masked[torch.arange(len(target_slots), device=masked.device), target_slots] = False
    logits = logits.masked_fill(masked, float("-inf"))
    return F.cross_entropy(logits.float(), target_slots, reduction="none")


def hard_negative_contrast(fast_q: torch.Tensor, fast_p: torch.Tensor, fast_n: torch.Tensor,
                           scale: float) -> torch.Tensor:
    """L_hard (section 4.4): per-row CE of each fast question against its fast positive and its
    own N hard negatives (fast_n question-major, B*N rows), positive first. Shape (B,).
    The paper's sum runs over P u {p} only: other questions' passages reach a question through Q_p."""
    batch, dim = fast_q.shape
    if fast_n.shape[0] % batch:
        raise ValueError(f"{fast_n.shape[0]} hard negatives is not a multiple of batch size {batch}")
    candidates = torch.cat([fast_p[:, None, :], fast_n.reshape(batch, -1, dim)], dim=1)  # (B, 1+N, D)
    logits = scale * torch.einsum("bd,bkd->bk", fast_q, candidates)
    return F.cross_entropy(logits.float(), torch.zeros(batch, dtype=torch.long, device=logits.device),
                           reduction="none")


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def gather_ranks(tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(every rank's `tensor` concatenated in rank order, this rank's index); without
    torch.distributed, (tensor, 0). Every rank must pass the same shape."""
    if not _distributed() or torch.distributed.get_world_size() == 1:
        return tensor, 0
    parts = [torch.empty_like(tensor) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(parts, tensor.contiguous())
    return torch.cat(parts), torch.distributed.get_rank()


class VectorQueue(nn.Module):
    """A FIFO ring of `size` vectors with an int64 id per slot (EMPTY until written). `push`
    writes a whole batch at once at the pointer, wrapping around, and overwrites the oldest."""

    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        if size < 1:
            raise ValueError(f"queue size must be >= 1, got {size}")
        self.register_buffer("vectors", torch.zeros(size, dim))
        self.register_buffer("ids", torch.full((size,), EMPTY, dtype=torch.long))
        self.register_buffer("pointer", torch.zeros((), dtype=torch.long))

    @property
    def size(self) -> int:
        return self.vectors.shape[0]

    @torch.no_grad()
    def push(self, vectors: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Enqueue `vectors` (n, D) with their `ids` (n,); returns the n slots written, in order."""
        n = vectors.shape[0]
        if n > self.size:
            raise ValueError(f"pushing {n} vectors into a queue of {self.size}: the batch would overwrite itself")
        slots = (self.pointer + torch.arange(n, device=self.ids.device)) % self.size
        self.vectors[slots] = vectors.detach().to(self.vectors.dtype)
        self.ids[slots] = ids.to(self.ids.device)
        self.pointer.copy_((self.pointer + n) % self.size)
        return slots


def slow_copy(model: nn.Module) -> nn.Module:
    """A frozen deep copy of `model` (its tokenizer is not copied): the slow encoders start as the
    fast ones (section 4.3: all four encoders come from the same base model)."""
    tokenizer = getattr(model, "tokenizer", None)
    memo = {id(tokenizer): None} if tokenizer is not None else {}
    slow = copy.deepcopy(model, memo)
    slow.requires_grad_(False)
    return slow


# -- the loss -----------------------------------------------------------------------------------

class XMoCoLoss(EmbeddingLoss, TrainerCallback):
    """xMoCo (paper 000 section 4) around a two-tower model (`shared: false`).

    Options: `queue_size` (both queues), `momentum` (alpha of the slow update), `lam` (weight of
    L_qp), `scale` (logit scale; the paper's plain inner product, so the model's
    similarity_scale by default), `hard_negative_weight` (w of L_hard; it applies when the batch
    carries hard negatives, whose slow vectors are enqueued into Q_p whatever w is).
    The slow encoders run in the loss module's train/eval mode: dropout 0.1 in all encoders
    (section 5.3).
    """

    def __init__(self, model: nn.Module, queue_size: int = QUEUE_SIZE, momentum: float = MOMENTUM,
                 lam: float = LAMBDA, scale: float | None = None, hard_negative_weight: float = 1.0) -> None:
        super().__init__(model, scale=scale)
        config = getattr(model, "config", None)
        if getattr(config, "shared", True):
            raise ValueError("xmoco needs separate question and passage towers (model `shared: false`): its fast "
                             "question and passage encoders have their own parameters (paper 000 section 4.2)")
        if not 0.0 < momentum <= 1.0:
            raise ValueError(f"momentum must be in (0, 1], got {momentum}")
        if not 0.0 <= lam <= 1.0:
            raise ValueError(f"lam must be in [0, 1], got {lam}")
        if hard_negative_weight < 0:
            raise ValueError(f"hard_negative_weight must be >= 0, got {hard_negative_weight}")
        self.momentum = float(momentum)
        self.lam = float(lam)
        self.hard_negative_weight = float(hard_negative_weight)
        self.slow = slow_copy(model)
        dim = int(model.embedding_dim)
        self.passage_queue = VectorQueue(int(queue_size), dim)   # Q_p
        self.question_queue = VectorQueue(int(queue_size), dim)  # Q_q

    @property
    def queue_size(self) -> int:
        return self.passage_queue.size

    # -- encoding ---------------------------------------------------------------------------
    def forward(self, query_batch, passage_batch, negative_batch=None, weights=None) -> torch.Tensor:
        no_weights(type(self).__name__, weights)
        fast_q = self.model.encode_query(query_batch)
        fast_p = self.model.encode_passage(passage_batch)
        fast_n = None
        if negative_batch is not None and self.hard_negative_weight > 0:
            fast_n = self.model.encode_passage(negative_batch)
        with torch.no_grad():  # gradients reach only the fast encoders (section 4.2)
            slow_q = self.slow.encode_query(query_batch)
            slow_p = self.slow.encode_passage(passage_batch)
            slow_n = self.slow.encode_passage(negative_batch) if negative_batch is not None else None
        return self.compute_loss_from_embeddings(
            fast_q, fast_p, fast_n, slow_q=slow_q, slow_p=slow_p, slow_negatives=slow_n,
            question_ids=text_ids(query_batch), passage_ids=text_ids(passage_batch),
            negative_ids=text_ids(negative_batch) if negative_batch is not None else None)

    def compute_loss_from_embeddings(self, q, p, negatives=None, weights=None, *, slow_q, slow_p,
                                     question_ids, passage_ids, slow_negatives=None,
                                     negative_ids=None) -> torch.Tensor:
        """`q`, `p`, `negatives`: fast vectors (negatives question-major, may be None);
        `slow_*`: the slow vectors of the same texts; `*_ids`: their int64 ids. Enqueues the slow
        vectors, then returns lam L_qp + (1 - lam) L_pq + w L_hard (batch means)."""
        no_weights(type(self).__name__, weights)
        question_slots, passage_slots = self.enqueue(slow_q, question_ids, slow_p, passage_ids,
                                                     slow_negatives, negative_ids)
        # Section 4.2: the slow vectors are pushed first, then q is pitted against all of Q_p, so the
        # candidates include the current batch (its batch-training note: the in-batch-negative effect).
        l_qp = queue_contrast(q, self.passage_queue.vectors, self.passage_queue.ids, passage_slots,
                              passage_ids, self.scale)
        l_pq = queue_contrast(p, self.question_queue.vectors, self.question_queue.ids, question_slots,
                              question_ids, self.scale)
        loss = self.lam * l_qp.mean() + (1.0 - self.lam) * l_pq.mean()  # section 4.2
        if negatives is not None and self.hard_negative_weight > 0:
            # section 4.4: L_hard added "under the multitask framework", question-to-passage only
            loss = loss + self.hard_negative_weight * hard_negative_contrast(q, p, negatives, self.scale).mean()
        return loss

    # -- queues -----------------------------------------------------------------------------
    @torch.no_grad()
    def enqueue(self, slow_q, question_ids, slow_p, passage_ids, slow_negatives=None, negative_ids=None):
        """Push the batch's slow vectors (gathered over ranks) into the queues: questions into
        Q_q; positives, then hard negatives (section 4.4), into Q_p. Returns this rank's
        (question slots, positive passage slots), the targets of L_pq and L_qp."""
        all_q, rank = gather_ranks(slow_q.float())
        all_qids, _ = gather_ranks(question_ids)
        all_p, _ = gather_ranks(slow_p.float())
        all_pids, _ = gather_ranks(passage_ids)
        passages, pids = all_p, all_pids
        if slow_negatives is not None:
            all_n, _ = gather_ranks(slow_negatives.float())
            all_nids, _ = gather_ranks(negative_ids)
            passages, pids = torch.cat([all_p, all_n]), torch.cat([all_pids, all_nids])
        self.check_queue_size(all_q.shape[0], passages.shape[0])
        question_slots = self.question_queue.push(all_q, all_qids)
        passage_slots = self.passage_queue.push(passages, pids)
        local = slice(rank * slow_q.shape[0], (rank + 1) * slow_q.shape[0])
        return question_slots[local], passage_slots[local]

    def check_queue_size(self, questions: int, passages: int) -> None:
        """A queue must hold at least two (global) batches (section 5.3's smallest queue, 2 x batch,
        is in-batch negatives) and every passage vector one step pushes."""
        need = max(2 * questions, passages)
        if self.queue_size < need:
            raise ValueError(f"xmoco queue_size {self.queue_size} is too small for a global batch of {questions} "
                             f"questions and {passages} passage vectors per step: it must be at least {need} "
                             "(2 x batch, and every positive and hard negative of a step)")

    # -- trainer hooks ----------------------------------------------------------------------
    def on_step_end(self, step: int, model: nn.Module, optimizer) -> None:
        momentum_update(self.slow, self.model, self.momentum)  # after every step (section 4.2)
