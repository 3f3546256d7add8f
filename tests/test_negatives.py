"""Negatives strategies on hand-made tables: BM25 answer-free, and context negatives (paper 003
section 4.1), including the half of a single-passage document."""
import pyarrow as pa

from tasks.negatives.mining import answer_free_negatives, context_negatives
from tasks.schemas import NEGATIVES, PAIRS, RUNS
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


TEXT = dict(zip(PASSAGES["pid"].to_pylist(), PASSAGES["text"].to_pylist()))


def test_every_strategy_is_filtered_of_gold_answers_and_judged_relevant_with_counts():
    from tasks.negatives.mining import filter_candidates

    questions = pa.table({"qid": ["q", "r"], "question": ["which number", "what river"], "answers": [["two"], []]})
    gold = pa.table({"qid": ["q"], "pid": ["a#0"]})
    candidates = [("q", "a#0", 1, 0.9), ("q", "a#1", 2, 0.8), ("q", "a#2", 3, 0.7), ("q", "a#3", 4, 0.6),
                  ("r", "b#0", 1, 0.5), ("r", "a#1", 2, 0.4)]
    judged = []

    def judge(pairs):  # the silver-labelling hook: a cross-encoder would score these
        judged.extend(pairs)
        return [text == "three" for _, text in pairs]

    neg, counts = filter_candidates(candidates, questions, TEXT, gold, "coarse", is_relevant=judge)
    assert neg.column("pid").to_pylist() == ["a#1", "b#0", "a#1"] and set(neg.column("strategy").to_pylist()) == {"coarse"}
    assert neg.column("score").to_pylist() == [0.800000011920929, 0.5, 0.4000000059604645]
    assert ("which number", "three") in judged and ("which number", "zero") not in judged  # gold never reaches the judge
    assert counts == {"candidates": 6, "dropped_gold": 1, "dropped_answer": 1, "dropped_relevant": 1, "kept": 3,
                      "filtered_share": 0.5}
    # without answer filtering a2 stays (paper 003 filters by answer; the switch is the config's)
    kept = filter_candidates(candidates, questions, TEXT, gold, "coarse", filter_answers=False)[0]
    assert "a#2" in kept.column("pid").to_pylist()


def test_random_negatives_are_seeded_per_question_and_differ_between_questions():
    from tasks.negatives.mining import random_candidates

    pids = [f"p{i}" for i in range(50)]
    one = list(random_candidates(["q1", "q2"], pids, depth=5, seed=3))
    assert [c[0] for c in one] == ["q1"] * 5 + ["q2"] * 5 and [c[2] for c in one[:5]] == [1, 2, 3, 4, 5]
    assert len({c[1] for c in one[:5]}) == 5  # without replacement
    assert list(random_candidates(["q2"], pids, depth=5, seed=3)) == one[5:]  # independent of the other questions
    assert [c[1] for c in one[:5]] != [c[1] for c in one[5:]]
    assert list(random_candidates(["q1"], pids, depth=5, seed=4)) != one[:5]
    assert len(list(random_candidates(["q1"], pids[:3], depth=5, seed=3))) == 3  # depth beyond the corpus


def test_coarse_and_fine_miners_find_their_kind_of_neighbours():
    """Paper 003 section 4.2 on a hand-made corpus: a low-dimensional (topic-only) encoder ranks
    every on-topic passage alike, a high-dimensional one also ranks the semantically close one first."""
    import numpy as np

    from tasks.negatives.mining import dense_candidates

    pids = ["gold", "same-topic-close", "same-topic-far", "off-topic"]
    coarse = np.array([[1.0, 0.0], [0.9, 0.1], [0.95, 0.05], [0.0, 1.0]], dtype="float32")  # dim 0: the topic
    fine = np.array([[1, 0, 1, 0], [1, 0, 0.9, 0.1], [1, 0, 0, 1], [0, 1, 0, 0]], dtype="float32")
    query_coarse, query_fine = coarse[:1], fine[:1]

    def mined(query, vectors, shard):
        shards = ((pids[i:i + shard], vectors[i:i + shard]) for i in range(0, len(pids), shard))
        return [pid for _, pid, _, _ in dense_candidates(["q"], query, shards, depth=3)]

    assert mined(query_coarse, coarse, 3) == ["gold", "same-topic-far", "same-topic-close"]
    assert mined(query_fine, fine, 1) == ["gold", "same-topic-close", "same-topic-far"]  # shards of one row
    ranks = [c[2] for c in dense_candidates(["q"], query_fine, [(pids, fine)], depth=2)]
    assert ranks == [1, 2]


def test_mixed_expands_to_its_members_and_its_pool_draws_from_every_strategy():
    from tasks.negatives.stages import NegativesConfig
    from tasks.training.data import Collator

    config = NegativesConfig(dense={"coarse": {"system": "c"}, "fine": {"system": "f"}})
    assert config.expand(["mixed"]) == ["coarse", "fine", "bm25", "context"]
    assert config.expand(["bm25", "mixed"]) == ["bm25", "coarse", "fine", "context"]
    passages = pa.table({"pid": [f"p{i}" for i in range(30)], "title": ["T"] * 30, "text": [f"text {i}" for i in range(30)]})
    rows = [{"qid": "q", "pid": f"p{10 * s + r}", "strategy": name, "rank": r, "score": None, "text": None}
            for s, name in enumerate(["coarse", "fine", "bm25"]) for r in range(1, 4)]
    pairs = _pairs([("q", "query", "p29"), ("q2", "other", "p28")])
    negatives = pa.Table.from_pylist(rows + [{**rows[0], "qid": "q2"}], schema=NEGATIVES)
    (example, _) = examples_from_pairs(pairs, negatives, passages, negative_pool=9, hard_negatives=2, batch_size=2, seed=0)
    strategy_of = {(r["pid"]): r["strategy"] for r in rows}
    # interleaved by rank: the top M holds every strategy's best
    assert [strategy_of[f"p{p[1].split()[1]}"] for p in example.negatives[:3]] == ["coarse", "fine", "bm25"]
    collator = Collator(_StubTokenizer(), hard_negatives=2, seed=1)
    drawn = {strategy_of[f"p{t.split()[1]}"] for epoch in range(20) for _, t in collator.draw_negatives([example], epoch)}
    assert drawn == {"coarse", "fine", "bm25"}


class _StubTokenizer:
    """Only draw_negatives is called: no tokenisation happens."""


def test_pairs_no_miner_ran_on_reach_training_with_random_negatives_of_other_documents():
    """A silver pair of a synthetic query has no BM25 negatives (BM25 mines the questions): with
    hard negatives on, it trains on random passages of other documents rather than being dropped."""
    runs = pa.table({"qid": ["q1", "q1"], "pid": ["a#1", "a#2"], "rank": [1, 2], "score": [2.0, 1.0],
                     "system": ["bm25"] * 2}, schema=RUNS)
    bm25 = answer_free_negatives(runs, pa.table({"qid": ["q1"], "answers": [["zero"]]}),
                                 dict(zip(PASSAGES["pid"].to_pylist(), PASSAGES["text"].to_pylist())),
                                 pa.table({"qid": ["q1"], "pid": ["a#0"]}), "bm25", depth=10)
    pairs = _pairs([("q1", "what is zero", "a#0"), ("syn:b#0:0", "what flows through paris", "b#0"),
                    ("syn:a#3:0", "three", "a#3")])
    examples = {e.qid: e for e in examples_from_pairs(pairs, bm25, PASSAGES, negative_pool=3, hard_negatives=1,
                                                      batch_size=2, seed=0)}
    assert sorted(examples) == ["q1", "syn:a#3:0", "syn:b#0:0"]
    assert examples["q1"].negatives == [("A", "one"), ("A", "two")]          # its mined ones, as before
    assert examples["syn:b#0:0"].negatives and all(title == "A" for title, _ in examples["syn:b#0:0"].negatives)
    assert examples["syn:a#3:0"].negatives == [("B", PASSAGES["text"][4].as_py())]  # the only other document
    again = {e.qid: e for e in examples_from_pairs(pairs, bm25, PASSAGES, negative_pool=3, hard_negatives=1,
                                                   batch_size=2, seed=0)}
    assert again["syn:b#0:0"].negatives == examples["syn:b#0:0"].negatives   # seeded
    # Without hard negatives nothing is drawn.
    plain = examples_from_pairs(pairs, bm25, PASSAGES, negative_pool=3, hard_negatives=0, batch_size=2, seed=0)
    assert [e.negatives for e in plain if e.qid.startswith("syn:")] == [[], []]
