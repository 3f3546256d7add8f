import numpy as np
import pyarrow as pa
import pytest

from tasks.training.dev_metric import TopKDevEvaluator, dev_pool, top_k_hit_rate

PASSAGES = pa.table({"pid": [f"p{i}" for i in range(8)], "doc_id": ["A", "A", "A", "B", "B", "C", "C", "D"],
                     "title": ["A", "A", "A", "B", "B", "C", "C", None], "text": [f"text {i}" for i in range(8)]})
QUESTIONS = pa.table({"qid": ["q1", "q2", "q3", "q4"], "question": ["one", "two", "three", "four"],
                      "split": ["dev", "dev", "train", "dev"]})
GOLD = pa.table({"qid": ["q1", "q2", "q3", "q4"], "pid": ["p1", "p3", "p5", "p6"], "relevance": [1, 1, 1, 0]})


def test_pool_is_the_dev_documents_plus_distractors():
    qids, queries, pool, gold = dev_pool(QUESTIONS, PASSAGES, GOLD, "dev")
    # q4's only judgement is non-relevant; q3 is train: the pool is documents A and B.
    assert qids == ["q1", "q2"] and queries == ["one", "two"]
    assert pool == [("A", "text 0"), ("A", "text 1"), ("A", "text 2"), ("B", "text 3"), ("B", "text 4")]
    assert gold == {"q1": {1}, "q2": {3}}
    _, _, pool, gold = dev_pool(QUESTIONS, PASSAGES, GOLD, "dev", distractors=2, seed=3)
    assert len(pool) == 7 and pool[:5] == [("A", "text 0"), ("A", "text 1"), ("A", "text 2"), ("B", "text 3"), ("B", "text 4")]
    assert set(pool[5:]) < {("C", "text 5"), ("C", "text 6"), ("", "text 7")}  # a missing title becomes ''
    assert gold == {"q1": {1}, "q2": {3}}
    with pytest.raises(ValueError, match="no question of split 'test'"):
        dev_pool(QUESTIONS, PASSAGES, GOLD, "test")


def test_top_k_hit_rate_by_hand():
    q = np.array([[1.0, 0.0], [0.0, 1.0]])
    p = np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.7]])
    # q0 ranks p0, p2, p1; q1 ranks p1, p2, p0
    assert top_k_hit_rate(q, p, [{2}, {1}], k=1) == 0.5
    assert top_k_hit_rate(q, p, [{2}, {1}], k=2) == 1.0
    assert top_k_hit_rate(q, p, [{1}, {0}], k=2) == 0.0


def test_dev_metric_encodes_queries_and_pool_with_the_model():
    qids, queries, pool, gold = dev_pool(QUESTIONS, PASSAGES, GOLD, "dev")
    calls = []

    def encode(model, texts, side):
        calls.append((model, side, len(texts)))
        if side == "query":
            return np.eye(5)[[1, 3]]      # q1 -> p1, q2 -> p3
        return np.eye(5)
    evaluator = TopKDevEvaluator(qids, queries, pool, gold, 1, encode)
    assert evaluator.primary_metric == "dev_top1" and evaluator.greater_is_better
    assert evaluator("m") == {"dev_top1": 1.0}
    assert calls == [("m", "query", 2), ("m", "passage", 5)]
