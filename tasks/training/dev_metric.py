"""The dev metric that picks a training run's checkpoint (TopKDevEvaluator): the share of dev
questions with a gold passage in the model's top k over a small pool (the dev documents' passages
plus optional random distractors). Cheap enough to run a few times per training run on a CPU."""
from __future__ import annotations

import random
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def dev_pool(questions: pa.Table, passages: pa.Table, gold: pa.Table, split: str, distractors: int = 0,
             max_questions: int | None = None, seed: int = 0) -> tuple[list[str], list[str], list[tuple[str, str]], dict[str, set[int]]]:
    """(qids, question texts, pool passages as (title, text), {qid: indices of its gold passages in the pool}).

    The pool holds every passage of a document that a dev question's gold passage belongs to (the
    hardest confusers of a SQuAD question are its own article's passages), plus `distractors`
    passages drawn at random from the rest."""
    dev = questions.filter(pc.equal(questions.column("split"), split))
    relevant = gold.filter(pc.greater(gold.column("relevance"), 0))
    gold_of: dict[str, set[str]] = {}
    for qid, pid in zip(relevant.column("qid").to_pylist(), relevant.column("pid").to_pylist()):
        gold_of.setdefault(qid, set()).add(pid)
    qids = [q for q in dev.column("qid").to_pylist() if q in gold_of]
    if max_questions is not None and len(qids) > max_questions:
        kept = set(random.Random(seed).sample(qids, max_questions))
        qids = [q for q in qids if q in kept]
    if not qids:
        raise ValueError(f"dev metric: no question of split {split!r} has a gold passage; give the split "
                         "questions or set the system's train.select_on_dev: false")
    text_of = dict(zip(dev.column("qid").to_pylist(), dev.column("question").to_pylist()))

    pids = passages.column("pid").to_pylist()
    doc_of = dict(zip(pids, passages.column("doc_id").to_pylist()))
    wanted_docs = {doc_of[p] for q in qids for p in gold_of[q] if p in doc_of}
    chosen = [i for i, p in enumerate(pids) if doc_of[p] in wanted_docs]
    rest = sorted(set(range(len(pids))) - set(chosen))
    chosen += random.Random(seed).sample(rest, min(distractors, len(rest)))
    chosen.sort()
    pool_pids = [pids[i] for i in chosen]
    index_of = {p: i for i, p in enumerate(pool_pids)}
    titles, texts = passages.column("title").to_pylist(), passages.column("text").to_pylist()
    pool = [(titles[i] or "", texts[i]) for i in chosen]
    gold_idx = {q: {index_of[p] for p in gold_of[q] if p in index_of} for q in qids}
    return qids, [text_of[q] for q in qids], pool, gold_idx


def top_k_hit_rate(query_vectors: np.ndarray, passage_vectors: np.ndarray, gold_idx: list[set[int]], k: int) -> float:
    """Share of queries whose top-k passages (by inner product) include a gold index."""
    scores = query_vectors.astype(np.float32) @ passage_vectors.astype(np.float32).T
    k = min(k, scores.shape[1])
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    return float(np.mean([bool(gold & set(row.tolist())) for gold, row in zip(gold_idx, top)]))


class TopKDevEvaluator:
    """The trainer's checkpoint chooser, in sentence-transformers' evaluator shape:
    `evaluator(model) -> {primary_metric: share of questions with a gold pool passage in the top k}`.

    `encode(model, texts, side)` returns vectors (side 'query' for the question texts, 'passage'
    for the pool's (title, text) pairs); `gold_idx` maps each qid to its gold indices in the pool.
    """

    greater_is_better = True

    def __init__(self, qids: list[str], queries: list[str], pool: list[tuple[str, str]],
                 gold_idx: dict[str, set[int]], k: int, encode: Callable[[object, list, str], np.ndarray],
                 name: str = "dev") -> None:
        if len(qids) != len(queries):
            raise ValueError(f"{len(qids)} qids but {len(queries)} queries")
        self.queries, self.pool, self.k, self.encode = queries, pool, k, encode
        self.gold = [gold_idx[q] for q in qids]
        self.primary_metric = f"{name}_top{k}"

    def __call__(self, model) -> dict[str, float]:
        hit_rate = top_k_hit_rate(self.encode(model, self.queries, "query"),
                                  self.encode(model, self.pool, "passage"), self.gold, self.k)
        return {self.primary_metric: hit_rate}
