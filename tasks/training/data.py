"""Training data: shuffled batches of any examples (the classifier's, the generator's), and for the
bi-encoder examples, a batch sampler that keeps false negatives out of a batch, and a
Tevatron-like collator (tokenise unpadded, pad once per batch).

Paper 003 section 4.3: every question has a pool of M hard negatives; each step draws N of them.
The draws come from the collator's own seeded RNG, whose state is checkpointed, so a resumed run
draws exactly what an uninterrupted one would.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, NamedTuple, Optional, Sequence

import torch

from models.bi_encoder import format_passages

Passage = tuple[str | None, str]  # (title, text)


@dataclass
class TrainExample:
    qid: str
    query: str
    positive: Passage
    positive_id: str
    negatives: list[Passage] = field(default_factory=list)  # pool of M hard negatives
    weight: float = 1.0
    # A teacher's (cross-encoder's) scores of [positive, *negatives], for distillation losses.
    teacher_scores: list[float] | None = None
    # Alternatives to `query`: when given, the collator uses one of them, drawn per (seed, epoch,
    # qid) (paper 002 section 3.1: one of a passage's C generated queries, afresh each epoch).
    queries: list[str] = field(default_factory=list)


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """Indices 0..n-1 in one epoch's order: a function of (seed, epoch) only, so a resume needs no
    state beyond the epoch and the position in it."""
    order = list(range(n))
    random.Random(f"{seed}:{epoch}").shuffle(order)  # its own RNG: the global streams stay untouched
    return order


class ShuffledBatches:
    """Batches of example indices: each epoch a shuffle seeded by (seed, epoch) cut into batches
    in order; with `drop_last` full batches only, else the last one may be short. The sampler
    contract of run_training: `epoch`, `batch_size`, `len()`, iteration over the rest of the
    current epoch, and an (epoch, position) state."""

    def __init__(self, n: int, batch_size: int, seed: int, drop_last: bool = True) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.n, self.batch_size, self.seed, self.drop_last = n, batch_size, seed, drop_last
        self.epoch = self.position = 0

    def __len__(self) -> int:
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        order = epoch_order(self.n, self.seed, self.epoch)
        while self.position < len(self):
            start = self.position * self.batch_size
            self.position += 1
            yield order[start:start + self.batch_size]
        self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "n": self.n, "batch_size": self.batch_size}

    def load_state_dict(self, state: dict) -> None:
        if (state["n"], state["batch_size"]) != (self.n, self.batch_size):
            raise ValueError(f"sampler state is for {state['n']} examples in batches of {state['batch_size']}, "
                             f"not {self.n} in batches of {self.batch_size}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


class UniqueBatchSampler:
    """Yields lists of example indices.

    Each epoch: a shuffle seeded by (seed, epoch), then greedy packing: walk the waiting examples
    in shuffled order and take each one whose `qid` and `positive_id` are both new to the batch;
    the ones skipped wait for the next batch (they would be false negatives of each other).
    A batch that cannot be filled ends the epoch's full batches; with `drop_last` the examples
    left over are dropped this epoch, otherwise they come as smaller (still unique) batches.

    `state_dict()` is (epoch, position): `position` counts the batches already handed out in
    `epoch`, so iterating after `load_state_dict` continues mid-epoch exactly. Iterating yields
    the rest of the current epoch and then moves to the next epoch.
    """

    def __init__(self, examples: Sequence[TrainExample], batch_size: int, seed: int = 42,
                 drop_last: bool = True) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.keys = [(str(e.qid), str(e.positive_id)) for e in examples]
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self.position = 0
        self._cache: tuple[int, list[list[int]]] | None = None

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        batches: list[list[int]] = []
        waiting = epoch_order(len(self.keys), self.seed, epoch)
        while waiting:
            batch: list[int] = []
            qids: set[str] = set()
            pids: set[str] = set()
            rest: list[int] = []
            for pos, i in enumerate(waiting):
                if len(batch) == self.batch_size:
                    rest.extend(waiting[pos:])
                    break
                qid, pid = self.keys[i]
                if qid in qids or pid in pids:
                    rest.append(i)
                    continue
                batch.append(i)
                qids.add(qid)
                pids.add(pid)
            if len(batch) < self.batch_size and self.drop_last:
                break
            batches.append(batch)
            waiting = rest
        self._cache = (epoch, batches)
        return batches

    def __len__(self) -> int:
        """Batches in the current epoch (the same for every epoch unless duplicates force
        different packings; epoch 0's count is the planning figure)."""
        return len(self.epoch_batches(self.epoch))

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.epoch_batches(self.epoch)
        while self.position < len(batches):
            batch = batches[self.position]
            self.position += 1
            yield list(batch)
        self.epoch += 1
        self.position = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "num_examples": len(self.keys),
                "batch_size": self.batch_size, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        for key in ("num_examples", "batch_size", "seed"):
            mine = {"num_examples": len(self.keys), "batch_size": self.batch_size, "seed": self.seed}[key]
            if key in state and int(state[key]) != mine:
                raise ValueError(f"sampler state has {key}={state[key]}, this sampler has {mine}")
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])


class Batch(NamedTuple):
    """A collated bi-encoder batch, in the order the losses take it."""
    queries: dict[str, torch.Tensor]
    positives: dict[str, torch.Tensor]
    negatives: Optional[dict[str, torch.Tensor]]   # N per question, question-major; None without hard negatives
    weights: torch.Tensor                          # (B,): ones unless the pairs are weighted


class TeacherBatch(NamedTuple):
    """A `Batch` with the teacher's (B, 1 + N) scores of each question's positive and drawn negatives."""
    queries: dict[str, torch.Tensor]
    positives: dict[str, torch.Tensor]
    negatives: Optional[dict[str, torch.Tensor]]
    weights: torch.Tensor
    teacher_scores: torch.Tensor


class Collator:
    """examples -> a `Batch` (queries, positives, negatives or None, weights), and with
    `teacher_scores` a `TeacherBatch`: also the (B, 1 + N) teacher scores of each question's positive
    and drawn negatives: an example's own `teacher_scores` (its whole pool, scored beforehand), or
    else the `teacher`'s logits of the pairs this batch draws, scored as the batch is built (GPL
    labels only the triplets it trains on: a run of one epoch over pools of M = 4 scores 1 + N
    pairs per question instead of 1 + M). Those are kept in `teacher_rows` ("epoch:qid" -> scores)
    and in the collator's checkpoint state, so a resumed run's record covers every step.

    Queries and (title, text) pairs are tokenised unpadded (truncated to the max lengths), then
    padded once per batch with `tokenizer.pad` to the batch's longest sequence.
    `negative_batch` holds N = `hard_negatives` passages per question, question-major (rows
    i*N .. i*N+N-1 belong to question i), drawn without replacement from the question's pool
    (with replacement when the pool has fewer than N). Pool entries equal to a positive of this
    batch are skipped when the pool has others (they would be false negatives).
    """

    def __init__(self, tokenizer: Any, query_max_len: int = 32, passage_max_len: int = 128,
                 hard_negatives: int = 0, seed: int = 42, teacher_scores: bool = False,
                 teacher: Optional[Callable[[list[tuple[str, str]]], Sequence[float]]] = None) -> None:
        if tokenizer is None:
            raise ValueError("Collator needs a tokenizer")
        if hard_negatives < 0:
            raise ValueError(f"hard_negatives must be >= 0, got {hard_negatives}")
        self.tokenizer = tokenizer
        self.query_max_len = int(query_max_len)
        self.passage_max_len = int(passage_max_len)
        self.hard_negatives = int(hard_negatives)
        self.seed = seed
        self.teacher_scores = bool(teacher_scores)
        self.teacher = teacher
        self.teacher_rows: dict[str, list[float]] = {}

    # -- checkpoint state: the teacher's record (draws are a function of seed, epoch and question)
    def state_dict(self) -> dict[str, Any]:
        return {"teacher_rows": dict(self.teacher_rows)} if self.teacher_rows else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # checkpoints of older versions kept an RNG state; draws no longer need one
        self.teacher_rows = dict(state.get("teacher_rows") or {})

    # -- tokenisation -----------------------------------------------------------------------
    def _pad(self, encoded) -> dict[str, torch.Tensor]:
        return dict(self.tokenizer.pad(encoded, padding="longest", return_tensors="pt"))

    def encode_queries(self, queries: Sequence[str]) -> dict[str, torch.Tensor]:
        enc = self.tokenizer(list(queries), truncation=True, max_length=self.query_max_len, padding=False)
        return self._pad(enc)

    def encode_passages(self, passages: Sequence[Passage]) -> dict[str, torch.Tensor]:
        titles, texts = format_passages([p[0] for p in passages], [p[1] for p in passages])
        enc = self.tokenizer(titles, texts, truncation=True, max_length=self.passage_max_len, padding=False)
        return self._pad(enc)

    def draw_negatives(self, examples: Sequence[TrainExample], epoch: int = 0) -> list[Passage]:
        """N of each question's pool of M (paper 003 section 4.3), drawn by an RNG seeded with
        (seed, epoch, question): the same question draws the same negatives in the same epoch
        whatever its batch or a resume, and other ones the next epoch."""
        return [examples[row].negatives[i] for row, i in self.draw_negative_indices(examples, epoch)]

    def draw_negative_indices(self, examples: Sequence[TrainExample], epoch: int = 0) -> list[tuple[int, int]]:
        """(example row, index in its pool) of each drawn negative, question-major."""
        n = self.hard_negatives
        positives = {tuple(e.positive) for e in examples}
        drawn: list[tuple[int, int]] = []
        for row, e in enumerate(examples):
            pool = [i for i, p in enumerate(e.negatives) if tuple(p) not in positives] or list(range(len(e.negatives)))
            if not pool:
                raise ValueError(f"question {e.qid!r} has no hard negatives but hard_negatives={n}; "
                                 "use hard_negatives=0 or mine negatives first")
            rng = random.Random(f"{self.seed}:{epoch}:{e.qid}")
            drawn.extend((row, i) for i in (rng.sample(pool, n) if len(pool) >= n else rng.choices(pool, k=n)))
        return drawn

    def teacher_matrix(self, examples: Sequence[TrainExample], drawn: list[tuple[int, int]],
                       queries: Optional[Sequence[str]] = None, epoch: int = 0) -> torch.Tensor:
        """(B, 1 + N) teacher scores: each question's positive, then its drawn negatives in order;
        the teacher scores `queries` (the ones this batch trains on; default each example's own)."""
        n = self.hard_negatives
        rows: list[Optional[list[float]]] = []
        unscored: list[tuple[int, list[int]]] = []
        for row, e in enumerate(examples):
            picked = [i for _, i in drawn[row * n:(row + 1) * n]]
            if e.teacher_scores is not None:
                if len(e.teacher_scores) != 1 + len(e.negatives):
                    raise ValueError(f"question {e.qid!r}: teacher scores must be [positive, *negatives] "
                                     f"({1 + len(e.negatives)} values), got {e.teacher_scores!r}")
                rows.append([e.teacher_scores[0]] + [e.teacher_scores[1 + i] for i in picked])
            elif self.teacher is None:
                raise ValueError(f"question {e.qid!r} carries no teacher scores and the collator has no teacher")
            else:
                rows.append(None)
                unscored.append((row, picked))
        if unscored:
            queries = list(queries) if queries is not None else [e.query for e in examples]
            pairs = [(queries[row], passage[1]) for row, picked in unscored
                     for passage in (examples[row].positive, *(examples[row].negatives[i] for i in picked))]
            logits = [float(x) for x in self.teacher(pairs)]
            if len(logits) != len(pairs):
                raise ValueError(f"the teacher returned {len(logits)} scores for {len(pairs)} pairs")
            for k, (row, _) in enumerate(unscored):
                rows[row] = logits[k * (1 + n):(k + 1) * (1 + n)]
                self.teacher_rows[f"{epoch}:{examples[row].qid}"] = rows[row]
        return torch.tensor(rows, dtype=torch.float32)

    def choose_query(self, example: TrainExample, epoch: int = 0) -> str:
        """`example.query`, or with `example.queries` one of them drawn by an RNG seeded with
        (seed, epoch, qid): the same in any batch and after a resume, another one next epoch."""
        if not example.queries:
            return example.query
        return random.Random(f"{self.seed}:{epoch}:{example.qid}:query").choice(example.queries)

    def __call__(self, examples: Sequence[TrainExample], epoch: int = 0):
        if not examples:
            raise ValueError("empty batch")
        queries = [self.choose_query(e, epoch) for e in examples]
        query_batch = self.encode_queries(queries)
        passage_batch = self.encode_passages([e.positive for e in examples])
        negative_batch, drawn = None, []
        if self.hard_negatives > 0:
            drawn = self.draw_negative_indices(examples, epoch)
            negative_batch = self.encode_passages([examples[row].negatives[i] for row, i in drawn])
        weights = torch.tensor([float(e.weight) for e in examples], dtype=torch.float32)
        if self.teacher_scores:  # distillation: the teacher's scores of the positive and the drawn negatives
            return TeacherBatch(query_batch, passage_batch, negative_batch, weights,
                                self.teacher_matrix(examples, drawn, queries, epoch))
        return Batch(query_batch, passage_batch, negative_batch, weights)
