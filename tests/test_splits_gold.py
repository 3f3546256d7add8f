import pyarrow as pa
import pytest

from tasks import schemas
from tasks.gold import link_qrels_gold, link_span_gold
from tasks.splits import assign_article_splits


def test_splits_are_deterministic_disjoint_and_follow_ratios():
    docs = [f"d{i}" for i in range(20)]
    a = assign_article_splits(docs, {"train": 0.6, "dev": 0.1, "test": 0.3}, seed=1)
    b = assign_article_splits(list(reversed(docs)), {"train": 0.6, "dev": 0.1, "test": 0.3}, seed=1)
    assert a == b
    counts = {s: list(a.values()).count(s) for s in ("train", "dev", "test")}
    assert counts == {"train": 12, "dev": 2, "test": 6}
    assert assign_article_splits(docs, {"train": 0.6, "dev": 0.1, "test": 0.3}, seed=2) != a


def test_explicit_articles_override_ratios_and_conflicts_fail():
    docs = ["a", "b", "c", "d"]
    a = assign_article_splits(docs, {"train": 1.0}, seed=0, explicit={"test": ["c"]})
    assert a["c"] == "test" and {a[d] for d in "abd"} == {"train"}
    with pytest.raises(ValueError, match="'a'"):
        assign_article_splits(docs, {"train": 1.0}, 0, explicit={"test": ["a"], "dev": ["a"]})


def _passages(rows):
    return pa.Table.from_pylist([dict(zip(["pid", "doc_id", "char_start", "char_end"], r)) for r in rows])


def test_span_gold_links_containing_passages_and_counts_unlinked():
    passages = _passages([("d#0", "d", 0, 100), ("d#1", "d", 101, 200), ("e#0", "e", 0, 50)])
    questions = pa.Table.from_pylist([
        {"qid": "q1", "doc_id": "d", "answer_spans": [{"start": 10, "end": 20}, {"start": 150, "end": 160}]},
        {"qid": "q2", "doc_id": "d", "answer_spans": [{"start": 95, "end": 105}]},   # across the boundary
        {"qid": "q3", "doc_id": "zzz", "answer_spans": [{"start": 0, "end": 1}]},
        {"qid": "q4", "doc_id": "e", "answer_spans": []},
    ])
    gold, stats = link_span_gold(questions, passages)
    assert gold.schema == schemas.GOLD
    assert sorted(zip(gold.column("qid").to_pylist(), gold.column("pid").to_pylist())) == [("q1", "d#0"), ("q1", "d#1")]
    assert stats["linked_questions"] == 1 and stats["unlinked_questions"] == 3
    assert stats["unlinked_by_reason"] == {"no_article": 1, "span_across_chunks": 1, "no_span": 1}


def test_qrels_gold_expands_documents_to_passages_with_grades():
    passages = _passages([("d#0", "d", 0, 1), ("d#1", "d", 2, 3), ("e#0", "e", 0, 1)])
    qrels = pa.Table.from_pylist([{"qid": "q", "doc_id": "d", "relevance": 2}, {"qid": "q", "doc_id": "x", "relevance": 1}])
    gold, stats = link_qrels_gold(qrels, passages)
    assert gold.to_pylist() == [{"qid": "q", "pid": "d#0", "relevance": 2}, {"qid": "q", "pid": "d#1", "relevance": 2}]
    assert stats["unlinked_by_reason"] == {"judged_doc_not_in_corpus": 1}
