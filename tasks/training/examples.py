"""Training examples from the pipeline's tables: question, gold passage, BM25 hard-negative pool."""
from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.compute as pc

from tasks.evaluation.has_answer import has_answer
from tasks.training.data import TrainExample


def training_examples(train, questions: pa.Table, passages: pa.Table, gold: pa.Table, bm25_runs: pa.Table,
                      split: str = "train") -> list[TrainExample]:
    """Questions of `split` with a gold passage; negatives: BM25 passages without an answer
    (paper 003 section 4.1, "BM25 filtered by answer"), the top M per question. `train` carries
    negative_pool, hard_negatives, max_questions, batch_size and seed (tasks.config.DenseTrainConfig)."""
    by_pid = {p["pid"]: (p["title"], p["text"]) for p in passages.select(["pid", "title", "text"]).to_pylist()}
    gold_of: dict[str, str] = {}
    for qid, pid in zip(gold.column("qid").to_pylist(), gold.column("pid").to_pylist()):
        gold_of.setdefault(qid, pid)
    ranked: dict[str, list[str]] = {}
    for qid, pid in zip(bm25_runs.column("qid").to_pylist(), bm25_runs.column("pid").to_pylist()):
        ranked.setdefault(qid, []).append(pid)
    examples = []
    for q in questions.filter(pc.equal(questions.column("split"), split)).to_pylist():
        positive = gold_of.get(q["qid"])
        if positive is None:
            continue
        negatives = [by_pid[p] for p in ranked.get(q["qid"], [])
                     if p != positive and not has_answer(q["answers"], by_pid[p][1])][: train.negative_pool]
        if train.hard_negatives and not negatives:
            continue
        examples.append(TrainExample(qid=q["qid"], query=q["question"], positive=by_pid[positive],
                                     positive_id=positive, negatives=negatives))
    if train.max_questions is not None and len(examples) > train.max_questions:
        examples = random.Random(train.seed).sample(examples, train.max_questions)
    if len(examples) < train.batch_size:
        raise ValueError(f"only {len(examples)} training questions in split {split!r} "
                         f"(batch size {train.batch_size}): check the split")
    return examples
