import pyarrow as pa
import pytest

from tasks.dense.hybrid import DEFAULT_GRID, choose_weight, linear_fusion, reciprocal_rank_fusion
from tasks.schemas import RUNS


def run(rows, system):
    """rows: list of (qid, pid, score); ranks follow the order given per qid."""
    ranks, seen = [], {}
    for q, _, _ in rows:
        seen[q] = seen.get(q, 0) + 1
        ranks.append(seen[q])
    return pa.table({"qid": [r[0] for r in rows], "pid": [r[1] for r in rows], "rank": ranks,
                     "score": [r[2] for r in rows], "system": [system] * len(rows)}, schema=RUNS)


BM25 = run([("q1", "a", 10.0), ("q1", "b", 8.0), ("q1", "c", 5.0), ("q2", "x", 3.0)], "bm25")
DENSE = run([("q1", "c", 0.9), ("q1", "d", 0.8), ("q1", "a", 0.5), ("q2", "y", 2.0), ("q2", "x", 1.0)], "dense")


def as_dict(t):
    return {(q, p): (r, s) for q, p, r, s in zip(t["qid"].to_pylist(), t["pid"].to_pylist(),
                                                 t["rank"].to_pylist(), t["score"].to_pylist())}


def test_linear_fusion_by_hand():
    out = linear_fusion(BM25, DENSE, weight=0.1)
    assert out.schema.equals(RUNS) and set(out["system"].to_pylist()) == {"hybrid"}
    got = as_dict(out)
    # q1: bm25 min 5, dense min 0.5. a=0.5+1.0 b=0.5(fill)+0.8 c=0.9+0.5 d=0.8+0.5(fill)
    expected = {"a": 1.5, "c": 1.4, "b": 1.3, "d": 1.3}
    assert {p: s for (q, p), (_, s) in got.items() if q == "q1"} == pytest.approx(expected)
    q1 = [p for p, _ in sorted(((p, r) for (q, p), (r, _) in got.items() if q == "q1"), key=lambda x: x[1])]
    # b and d tie at 1.3: d has a real dense score, b a filled one, so d first
    assert q1 == ["a", "c", "d", "b"]
    # q2: bm25 min 3; y = 2.0 + 0.1*3 = 2.3, x = 1.0 + 0.3 = 1.3
    assert got[("q2", "y")] == (1, pytest.approx(2.3))
    assert got[("q2", "x")] == (2, pytest.approx(1.3))


def test_weight_zero_is_dense_ranking_and_k_cut():
    out = linear_fusion(BM25, DENSE, weight=0.0, k=3)
    d = as_dict(out)
    assert [p for (q, p), (r, _) in sorted(d.items(), key=lambda x: (x[0][0], x[1][0])) if q == "q1"] == ["c", "d", "a"]
    assert out["rank"].to_pylist() == [1, 2, 3, 1, 2]


def test_missing_zero_and_absent_question():
    bm = run([("q1", "a", 4.0), ("q3", "z", 7.0)], "bm25")
    de = run([("q1", "b", 1.0)], "dense")
    got = as_dict(linear_fusion(bm, de, 1.0, missing="zero"))
    assert got[("q1", "a")][1] == pytest.approx(4.0) and got[("q1", "b")][1] == pytest.approx(1.0)
    got = as_dict(linear_fusion(bm, de, 1.0, missing="min"))
    assert got[("q1", "a")][1] == pytest.approx(5.0) and got[("q1", "b")][1] == pytest.approx(5.0)
    assert got[("q3", "z")] == (1, pytest.approx(7.0))  # no dense list for q3: dense side 0
    with pytest.raises(ValueError):
        linear_fusion(bm, de, 1.0, missing="mean")


def test_choose_weight_picks_best_grid_point():
    calls = []

    def evaluate(t):  # toy: prefers weights near 0.35 through the fused score of q1/a
        w = (as_dict(t)[("q1", "a")][1] - 0.5) / 10.0
        calls.append(w)
        return -abs(w - 0.35)

    best, scores = choose_weight(BM25, DENSE, evaluate)
    assert best == pytest.approx(0.35) and len(scores) == len(DEFAULT_GRID) == 41
    assert max(scores, key=scores.get) == best
    best2, _ = choose_weight(BM25, DENSE, lambda t: 1.0, grid=(0.5, 1.0))
    assert best2 == 0.5  # ties go to the first grid point


def test_rrf_by_hand():
    r1 = run([("q", "a", 9.0), ("q", "b", 8.0), ("q", "c", 7.0)], "s1")
    r2 = run([("q", "c", 1.0), ("q", "a", 0.5), ("q", "d", 0.1)], "s2")
    out = reciprocal_rank_fusion([r1, r2], k_rrf=60, k=10)
    got = as_dict(out)
    exp = {"a": 1 / 61 + 1 / 62, "c": 1 / 63 + 1 / 61, "b": 1 / 62, "d": 1 / 63}
    assert {p: s for (_, p), (_, s) in got.items()} == pytest.approx(exp, rel=1e-6)
    assert [p for (_, p), _ in sorted(got.items(), key=lambda x: x[1][0])] == ["a", "c", "b", "d"]
    assert set(out["system"].to_pylist()) == {"rrf"} and out.schema.equals(RUNS)
    assert reciprocal_rank_fusion([r1, r2], k=2).num_rows == 2


def _questions(qids, answers):
    return pa.table({"qid": qids, "question": ["?"] * len(qids), "answers": answers, "split": ["dev"] * len(qids)})


def test_tune_scorer_uses_ndcg_without_answers_and_accuracy_with_them():
    from tasks.dense.hybrid import tune_scorer

    gold = pa.table({"qid": ["q1", "q1", "q2"], "pid": ["c", "d", "x"], "relevance": [2, 1, 1]})
    name, score = tune_scorer("auto", _questions(["q1", "q2"], [[], []]), {}, gold, k=2)
    assert name == "ndcg@2"
    # q1 ranks c, d at 1, 2 (ideal: 2, 1): nDCG 1. q2 ranks y, x: DCG 1/log2(3), ideal 1.
    assert score(DENSE) == pytest.approx((1.0 + 1 / 1.584962500721156) / 2)
    # BM25 ranks a, b for q1 (no gain) and x first for q2.
    assert score(BM25) == pytest.approx(0.5)

    text = {"a": "the answer is paris", "b": "no", "c": "no", "d": "paris", "x": "rome", "y": "no"}
    name, score = tune_scorer("auto", _questions(["q1", "q2"], [["paris"], ["rome"]]), text, gold, k=1)
    assert name == "accuracy@1" and score(BM25) == 1.0 and score(DENSE) == 0.0
    with pytest.raises(ValueError, match="no gold judgements"):
        tune_scorer("ndcg", _questions(["q9"], [[]]), {}, gold, k=10)
