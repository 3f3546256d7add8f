"""Negatives strategies on hand-made tables: BM25 answer-free, and context negatives (paper 003
section 4.1), including the half of a single-passage document."""
import pyarrow as pa

from tasks.negatives.mining import answer_free_negatives, context_negatives
from tasks.schemas import PAIRS, RUNS
from tasks.training.examples import examples_from_pairs

PASSAGES = pa.table({
    "pid": ["a#0", "a#1", "a#2", "a#3", "b#0"],
    "doc_id": ["a", "a", "a", "a", "b"],
    "chunk_index": [0, 1, 2, 3, 0],
    "title": ["A", "A", "A", "A", "B"],
    "text": ["zero", "one", "two", "three", "the river seine flows through paris where the eiffel tower stands"],
})


def _pairs(rows):
    return pa.Table.from_pylist([{"qid": q, "query": text, "pid": pid, "source": "gold", "weight": 1.0, "split": "train"}
                                 for q, text, pid in rows], schema=PAIRS)


def test_context_negatives_are_the_other_passages_of_the_document_nearest_first():
    neg = context_negatives(_pairs([("q1", "what", "a#2")]), PASSAGES)
    assert neg.column("pid").to_pylist() == ["a#1", "a#3", "a#0"]  # distance 1, 1, then 2
    assert neg.column("rank").to_pylist() == [1, 2, 3]
    assert set(neg.column("strategy").to_pylist()) == {"context"} and neg.column("text").null_count == 3


def test_a_single_passage_document_gives_the_half_that_does_not_answer():
    pairs = _pairs([("q1", "where is the eiffel tower", "b#0"), ("q2", "which river flows through paris", "b#0")])
    answers = {"q1": ["eiffel tower"], "q2": ["seine"]}
    neg = context_negatives(pairs, PASSAGES, answers).to_pylist()
    first_half, second_half = "the river seine flows through", "paris where the eiffel tower stands"
    assert [(n["qid"], n["pid"], n["text"]) for n in neg] == [("q1", "b#0~half1", first_half), ("q2", "b#0~half2", second_half)]
    # Without answer strings (synthetic questions) the half sharing fewer words with the query is the negative.
    synthetic = context_negatives(_pairs([("s1", "eiffel tower stands where", "b#0")]), PASSAGES).to_pylist()
    assert synthetic[0]["text"] == first_half


def test_half_passages_reach_the_training_examples_with_their_text():
    pairs = _pairs([("q1", "where is the eiffel tower", "b#0"), ("q2", "what", "a#2")])
    neg = context_negatives(pairs, PASSAGES, {"q1": ["eiffel tower"]})
    examples = examples_from_pairs(pairs, neg, PASSAGES, negative_pool=2, hard_negatives=1, batch_size=2, seed=0)
    by_qid = {e.qid: e for e in examples}
    assert by_qid["q1"].negatives == [("B", "the river seine flows through")]
    assert by_qid["q2"].negatives == [("A", "one"), ("A", "three")]  # the top M=2 by rank


def test_bm25_negatives_drop_gold_and_answer_bearing_passages_and_keep_run_order():
    runs = pa.table({"qid": ["q"] * 4, "pid": ["a#0", "a#1", "a#2", "a#3"], "rank": [1, 2, 3, 4],
                     "score": [4.0, 3.0, 2.0, 1.0], "system": ["bm25"] * 4}, schema=RUNS)
    questions = pa.table({"qid": ["q"], "answers": [["two"]]})
    gold = pa.table({"qid": ["q"], "pid": ["a#0"]})
    neg = answer_free_negatives(runs, questions, dict(zip(PASSAGES["pid"].to_pylist(), PASSAGES["text"].to_pylist())),
                                gold, "bm25", depth=3)
    assert neg.column("pid").to_pylist() == ["a#1"]  # a#0 gold, a#2 holds the answer, a#3 beyond depth
    assert neg.column("rank").to_pylist() == [2]
