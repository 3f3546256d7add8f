import pyarrow as pa
import pytest

from tasks.dense.hybrid import (DEFAULT_GRID, choose_weight, choose_weights, fuse_linear, linear_fusion,
                                reciprocal_rank_fusion)
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


# Three runs for N-way fusion; q2 is absent from R1.
R0 = run([("q1", "a", 3.0), ("q1", "b", 2.0), ("q1", "c", 1.0), ("q2", "x", 5.0)], "r0")
R1 = run([("q1", "b", 10.0), ("q1", "d", 6.0), ("q1", "a", 4.0)], "r1")
R2 = run([("q1", "d", 0.5), ("q1", "e", 0.25), ("q2", "y", 1.0), ("q2", "x", 0.5)], "r2")


def ranked(t, qid):
    return [p for (q, p), _ in sorted(as_dict(t).items(), key=lambda x: x[1][0]) if q == qid]


def test_fuse_linear_three_runs_by_hand():
    out = fuse_linear([R0, R1, R2], [1.0, 0.5, 2.0])
    assert out.schema.equals(RUNS) and set(out["system"].to_pylist()) == {"fusion"}
    got = as_dict(out)
    # q1 mins: R0 1, R1 4, R2 0.25.  a = 3 + 0.5*4 + 2*0.25(fill), b = 2 + 0.5*10 + 2*0.25(fill),
    # c = 1 + 0.5*4(fill) + 2*0.25(fill), d = 1(fill) + 0.5*6 + 2*0.5, e = 1(fill) + 0.5*4(fill) + 2*0.25
    assert {p: s for (q, p), (_, s) in got.items() if q == "q1"} == pytest.approx(
        {"b": 7.5, "a": 5.5, "d": 5.0, "c": 3.5, "e": 3.5})
    # c and e tie at 3.5: c has a real R0 score, e a filled one
    assert ranked(out, "q1") == ["b", "a", "d", "c", "e"]
    # q2: no R1 list (0 on that side); R0 min 5, R2 min 0.5. x = 5 + 2*0.5, y = 5(fill) + 2*1
    assert got[("q2", "y")] == (1, pytest.approx(7.0)) and got[("q2", "x")] == (2, pytest.approx(6.0))
    out4 = fuse_linear([R0, R1, R2], [1.0, 0.5, 2.0], k=4, system="s")
    assert ranked(out4, "q1") == ["b", "a", "d", "c"] and out4["rank"].to_pylist() == [1, 2, 3, 4, 1, 2]
    assert set(out4["system"].to_pylist()) == {"s"}
    with pytest.raises(ValueError):
        fuse_linear([R0, R1, R2], [1.0, 0.5])


def test_fuse_linear_three_run_tie_order():
    # every passage fuses to 2.0 (weights 1, missing=zero); order: R0 raw, R1 raw, R2 raw (a listed
    # passage beats a filled one), then pid
    r0 = run([("q", "z", 2.0), ("q", "m", 1.0), ("q", "n", 1.0), ("q", "c", 1.0), ("q", "b", 1.0)], "r0")
    r1 = run([("q", "y", 2.0), ("q", "m", 1.0), ("q", "n", 1.0), ("q", "c", 0.0)], "r1")
    r2 = run([("q", "a", 2.0), ("q", "c", 1.0), ("q", "b", 1.0)], "r2")
    out = fuse_linear([r0, r1, r2], [1.0, 1.0, 1.0], missing="zero")
    assert set(out["score"].to_pylist()) == {2.0}
    assert ranked(out, "q") == ["z", "m", "n", "c", "b", "y", "a"]


def test_fuse_linear_three_run_missing_fill():
    got = as_dict(fuse_linear([R0, R1, R2], [1.0, 0.5, 2.0], missing="zero"))
    assert {p: s for (_, p), (_, s) in got.items()} == pytest.approx(
        {"a": 5.0, "b": 7.0, "c": 1.0, "d": 4.0, "e": 0.5, "x": 6.0, "y": 2.0})
    # depth=2 cuts each list first, so mins are taken over the cut lists: R0 2, R1 6, R2 0.25; c drops
    got = as_dict(fuse_linear([R0, R1, R2], [1.0, 0.5, 2.0], depth=2))
    assert {p: s for (q, p), (_, s) in got.items() if q == "q1"} == pytest.approx(
        {"b": 7.5, "a": 6.5, "d": 6.0, "e": 5.5})
    # q2 is absent from the anchor run R1: that side adds 0
    got = as_dict(fuse_linear([R1, R0, R2], [1.0, 1.0, 1.0]))
    assert got[("q2", "y")] == (1, pytest.approx(6.0)) and got[("q2", "x")] == (2, pytest.approx(5.5))


def test_choose_weights_coordinate_ascent_finds_unequal_optimum():
    # q1/a fuses to 1 + w1 and q2/b to 1 + w2, so the evaluator can read the weights back.
    r0 = run([("q1", "a", 1.0), ("q2", "b", 1.0)], "r0")
    r1 = run([("q1", "a", 1.0), ("q2", "b", 0.0)], "r1")
    r2 = run([("q1", "a", 0.0), ("q2", "b", 1.0)], "r2")

    def evaluate(t):  # optimum (0.5, 1.5); w1's best depends on w2, so ascent needs two rounds
        d = as_dict(t)
        w1, w2 = d[("q1", "a")][1] - 1.0, d[("q2", "b")][1] - 1.0
        return -2 * (w2 - 1.5) ** 2 - (w1 - w2 + 1) ** 2

    grid = (0.0, 0.5, 1.0, 1.5, 2.0)
    best, scores = choose_weights([r0, r1, r2], evaluate, grid)
    assert best == (1.0, 0.5, 1.5) and scores[best] == 0.0 == max(scores.values())
    assert all(len(w) == 3 and w[0] == 1.0 for w in scores)
    # one round from (1, 1): w1 tried with w2 = 1 (-> 0), then w2 with w1 = 0 (-> 1.5)
    best1, scores1 = choose_weights([r0, r1, r2], evaluate, grid, rounds=1)
    assert best1 == (1.0, 0.0, 1.5)
    assert set(scores1) == {(1.0, g, 1.0) for g in grid} | {(1.0, 0.0, g) for g in grid}


def test_choose_weights_with_two_runs_equals_choose_weight():
    def evaluate(t):  # 1 once b reaches rank 2 in q1 (w > 0.133): a plateau, first point 0.15
        return float(ranked(t, "q1").index("b") < 2)

    best, scores = choose_weight(BM25, DENSE, evaluate)
    assert best == 0.15 and len(scores) == len(DEFAULT_GRID)
    best_n, scores_n = choose_weights([DENSE, BM25], evaluate)
    assert best_n == (1.0, 0.15)
    assert {w[1]: s for w, s in scores_n.items()} == scores and all(w[0] == 1.0 for w in scores_n)
    grid = (1.0, 0.3, 0.0)  # plateau point 1.0 listed first wins the tie
    assert choose_weights([DENSE, BM25], evaluate, grid)[0] == (1.0, choose_weight(BM25, DENSE, evaluate, grid)[0]) \
        == (1.0, 1.0)


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
    from tasks.fusion.tuning import tune_scorer

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
