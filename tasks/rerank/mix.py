"""A reranked head mixed with the run it came from. Per question, the first-stage run's top `depth`
passages are ordered by (1 - alpha) * z(first-stage score) + alpha * z(classifier logit), each
score z-scored over that question's head so that neither scale decides; alpha is chosen on a
tuning split. Paper 000's settings re-rank candidates by a linear combination of BM25 and the
model's score; here the classifier's logit takes BM25's place. The rest of the run follows the
head in its own order."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from tasks.schemas import RUNS

DEFAULT_ALPHAS: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(21))  # 0 (first stage) .. 1 (classifier)


@dataclass(frozen=True)
class Head:
    """One question's run cut at the rerank depth: the head's passages in first-stage order with
    both scores z-scored over the head, then the tail's passages in first-stage order."""
    pids: list[str]
    first: np.ndarray
    logit: np.ndarray
    tail: list[str]


def standardised(values: np.ndarray) -> np.ndarray:
    """`values` minus their mean over their standard deviation; all zeros when they are all equal."""
    spread = float(values.std())
    return (values - values.mean()) / spread if spread > 0 else np.zeros_like(values)


def heads_of(first: pa.Table, reranked: pa.Table, depth: int) -> dict[str, Head]:
    """{qid: Head} for every question of `reranked` (a `rerank_run` of `first` at `depth`): the
    first-stage scores of `first`'s top `depth`, the classifier's logits from `reranked`."""
    logit_of = dict(zip(zip(reranked.column("qid").to_pylist(), reranked.column("pid").to_pylist()),
                        reranked.column("score").to_pylist()))
    wanted = set(reranked.column("qid").to_pylist())
    first = first.sort_by([("qid", "ascending"), ("rank", "ascending")])
    rows: dict[str, tuple[list, list, list, list]] = {}
    for qid, pid, rank, score in zip(first.column("qid").to_pylist(), first.column("pid").to_pylist(),
                                     first.column("rank").to_pylist(), first.column("score").to_pylist()):
        if qid not in wanted:
            continue
        pids, scores, logits, tail = rows.setdefault(qid, ([], [], [], []))
        if rank > depth:
            tail.append(pid)
            continue
        if (qid, pid) not in logit_of:
            raise ValueError(f"question {qid!r}: passage {pid!r} is in the first stage's top {depth} but not in the "
                             "reranked run (was it reranked at another depth?)")
        pids.append(pid)
        scores.append(score)
        logits.append(logit_of[(qid, pid)])
    missing = sorted(wanted - set(rows))
    if missing:
        raise ValueError(f"{len(missing)} reranked questions have no first-stage run, e.g. {missing[:3]}")
    return {qid: Head(pids, standardised(np.asarray(scores, dtype=np.float64)),
                      standardised(np.asarray(logits, dtype=np.float64)), tail)
            for qid, (pids, scores, logits, tail) in rows.items()}


def mixed_run(heads: dict[str, Head], alpha: float, system: str) -> pa.Table:
    """RUNS of `system`: each head by (1 - alpha) * z(first) + alpha * z(logit) (ties keep the
    first-stage order), then its tail. Tail scores: the head's lowest mixed score minus the rank
    distance, so scores fall with the ranks."""
    rows: dict[str, list] = {"qid": [], "pid": [], "rank": [], "score": [], "system": []}
    for qid in sorted(heads):
        head = heads[qid]
        mixed = (1.0 - alpha) * head.first + alpha * head.logit
        order = sorted(range(len(head.pids)), key=lambda i: (-mixed[i], i))
        floor = float(mixed.min()) if len(head.pids) else 0.0
        ranked = [(head.pids[i], float(mixed[i])) for i in order]
        ranked += [(pid, floor - distance) for distance, pid in enumerate(head.tail, 1)]
        for rank, (pid, score) in enumerate(ranked, 1):
            for key, value in (("qid", qid), ("pid", pid), ("rank", rank), ("score", score), ("system", system)):
                rows[key].append(value)
    return pa.table(rows, schema=RUNS)


def choose_alpha(heads: dict[str, Head], evaluate: Callable[[pa.Table], float],
                 alphas: Sequence[float] = DEFAULT_ALPHAS, system: str = "mix") -> tuple[float, dict[float, float]]:
    """The alpha whose mixed run of `heads` (the tuning questions) scores highest under `evaluate`
    (higher is better; ties go to the earlier alpha). Returns (alpha, {alpha: score})."""
    if not len(alphas):
        raise ValueError("no alphas to choose from")
    scores = {float(a): float(evaluate(mixed_run(heads, float(a), system))) for a in alphas}
    best = max(scores.values())
    return next(a for a, s in scores.items() if s == best), scores
