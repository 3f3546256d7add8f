"""Training examples from the pipeline's data: pairs (query, positive passage, weight) and a
negatives table (qid, pid, strategy, rank). Any generator, miner or labeller feeds any trainer."""
from __future__ import annotations

import logging
import random

import pyarrow as pa
import pyarrow.compute as pc

from tasks.training.data import TrainExample

logger = logging.getLogger("passage_forge")


def examples_from_pairs(pairs: pa.Table, negatives: pa.Table | None, passages: pa.Table, *, negative_pool: int,
                        hard_negatives: int, batch_size: int, seed: int, max_questions: int | None = None,
                        split: str | None = "train") -> list[TrainExample]:
    """One example per pair of `split` (None: all); its hard-negative pool is the top
    `negative_pool` (M, paper 003 section 4.3) of the query's negatives by rank (several
    strategies: interleaved by rank). With `hard_negatives` > 0, a pair whose query has no mined
    negatives (a silver pair of a synthetic query: no miner ran on it) draws from random passages
    of other documents instead, so it still reaches training."""
    by_pid = {p["pid"]: (p["title"], p["text"]) for p in passages.select(["pid", "title", "text"]).to_pylist()}
    doc_of = dict(zip(passages.column("pid").to_pylist(), passages.column("doc_id").to_pylist())) \
        if "doc_id" in passages.column_names else {}
    pids = sorted(by_pid)
    if split is not None:
        pairs = pairs.filter(pc.equal(pairs.column("split"), split))
    ranked: dict[str, list[tuple[int, str, str | None]]] = {}
    if negatives is not None:
        texts = negatives.column("text").to_pylist() if "text" in negatives.column_names else [None] * negatives.num_rows
        for qid, pid, rank, text in zip(*(negatives.column(c).to_pylist() for c in ("qid", "pid", "rank")), texts):
            ranked.setdefault(qid, []).append((rank, pid, text))
    examples, filled = [], 0
    for row in pairs.to_pylist():
        positive = by_pid[row["pid"]]
        pool: dict[str, tuple] = {}
        for _, pid, text in sorted(ranked.get(row["qid"], []), key=lambda r: (r[0], r[1])):
            if pid != row["pid"] and pid not in pool:
                # A negative outside the corpus (half of the positive's document) carries its text.
                pool[pid] = by_pid[pid] if text is None else (positive[0], text)
        pool_list = list(pool.values())[:negative_pool]
        if hard_negatives and not pool_list:
            pool_list = [by_pid[pid] for pid in random_pool(row["qid"], row["pid"], pids, doc_of, negative_pool, seed)]
            filled += 1
        examples.append(TrainExample(qid=row["qid"], query=row["query"], positive=positive, positive_id=row["pid"],
                                     negatives=pool_list, weight=float(row["weight"])))
    if filled:
        logger.info("%d of %d pairs have no mined negatives (queries no miner ran on): their pools are random "
                    "passages of other documents", filled, len(examples))
    if max_questions is not None and len(examples) > max_questions:
        examples = random.Random(seed).sample(examples, max_questions)
    if len(examples) < batch_size:
        raise ValueError(f"only {len(examples)} training pairs in split {split!r} "
                         f"(batch size {batch_size}): check the split and the pairs")
    return examples


def random_pool(qid: str, positive: str, pids: list[str], doc_of: dict, size: int, seed: int) -> list[str]:
    """`size` passages drawn for `qid` by an RNG seeded with (seed, qid), none of the positive's
    document (the positive itself when documents are unknown)."""
    rng = random.Random(f"{seed}:{qid}:random-pool")
    own = doc_of.get(positive)
    drawn: list[str] = []
    for _ in range(50 * size):  # rejection sampling: a document is a small share of a corpus
        if len(drawn) == size:
            break
        pid = pids[rng.randrange(len(pids))]
        if pid != positive and pid not in drawn and (own is None or doc_of.get(pid) != own):
            drawn.append(pid)
    return drawn


def training_examples(train, questions: pa.Table, passages: pa.Table, gold: pa.Table, bm25_runs: pa.Table,
                      split: str = "train", match_type: str = "string") -> list[TrainExample]:
    """Gold pairs of `split` with answer-free BM25 negatives, in one call (benchmarks use it; the
    pipeline runs the same three steps as stages). `train` carries negative_pool, hard_negatives,
    max_questions, batch_size and seed."""
    from tasks.gold.linking import gold_pairs
    from tasks.negatives.mining import answer_free_negatives

    in_split = questions.filter(pc.equal(questions.column("split"), split))
    text = dict(zip(passages.column("pid").to_pylist(), passages.column("text").to_pylist()))
    negatives = answer_free_negatives(bm25_runs, in_split, text, gold, "bm25", depth=10**9, match_type=match_type)
    return examples_from_pairs(gold_pairs(in_split, gold), negatives, passages, negative_pool=train.negative_pool,
                               hard_negatives=train.hard_negatives, batch_size=train.batch_size, seed=train.seed,
                               max_questions=train.max_questions, split=split)
