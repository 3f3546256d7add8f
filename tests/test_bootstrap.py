"""Paired bootstrap intervals (tasks/evaluation/bootstrap.py) on hand-made cases, against the
normal approximation of the same difference, and the config check of evaluation.compare."""
import math

import numpy as np
import pyarrow as pa
import pytest
from pydantic import ValidationError

from tasks.evaluation.bootstrap import compare_systems, comparisons_markdown, paired_bootstrap
from tasks.schemas import QUESTION_RESULTS


def test_identical_systems_differ_by_exactly_nothing():
    hits = [1, 0, 1, 1, 0] * 20
    r = paired_bootstrap(hits, hits, samples=500)
    assert (r["difference"], r["low"], r["high"], r["p_not_better"]) == (0.0, 0.0, 0.0, 1.0)


def test_the_interval_matches_the_normal_approximation_and_is_seeded():
    rng = np.random.default_rng(3)
    b = rng.random(2000) < 0.5
    a = b | (rng.random(2000) < 0.1)  # a finds what b finds and about 5% more
    r = paired_bootstrap(a, b, samples=4000, seed=1)
    diff = a.astype(float) - b.astype(float)
    half = 1.96 * diff.std(ddof=1) / math.sqrt(len(diff))
    assert r["difference"] == pytest.approx(diff.mean())
    assert r["low"] == pytest.approx(diff.mean() - half, abs=0.25 * half)
    assert r["high"] == pytest.approx(diff.mean() + half, abs=0.25 * half)
    assert r["low"] > 0 and r["p_not_better"] == 0.0
    assert paired_bootstrap(a, b, samples=4000, seed=1) == r
    # Pairing matters: the same accuracies unpaired would give a wider interval.
    unpaired_half = 1.96 * math.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
    assert r["high"] - r["low"] < unpaired_half


def test_bad_vectors_are_refused():
    with pytest.raises(ValueError, match="equal, non-empty"):
        paired_bootstrap([1, 0], [1])
    with pytest.raises(ValueError, match="equal, non-empty"):
        paired_bootstrap([], [])


def _results(rows):
    return pa.Table.from_pylist([{"system": s, "qid": q, "split": sp, "first_hit_rank": r} for s, q, sp, r in rows],
                                schema=QUESTION_RESULTS)


def test_compare_systems_uses_the_split_and_the_cut_offs():
    rows = []
    for i in range(40):
        rows.append(("a", f"q{i}", "test", 1 if i % 2 else 10))        # top-1 on half, top-20 always
        rows.append(("b", f"q{i}", "test", 15 if i % 4 else None))      # never top-1, top-20 on three quarters
        rows.append(("a", f"d{i}", "dev", None))
        rows.append(("b", f"d{i}", "dev", 1))
    out = compare_systems(_results(rows), "a", "b", "test", (1, 20), samples=1000)
    assert [(r["k"], r["a"], r["b"], r["difference"], r["questions"]) for r in out] == [
        (1, 0.5, 0.0, 0.5, 40), (20, 1.0, 0.75, 0.25, 40)]
    assert all(r["low"] > 0 for r in out)
    every = compare_systems(_results(rows), "a", "b", "all", (1,), samples=200)
    assert every[0]["questions"] == 80 and every[0]["difference"] == pytest.approx(-0.25)
    table = comparisons_markdown(out)
    assert "| a | b | test | top-1 | 50.0 | 0.0 | +50.0 |" in table and table.count("| yes |") == 2
    with pytest.raises(ValueError, match="no question results of system 'c'"):
        compare_systems(_results(rows), "a", "c")


def test_the_config_refuses_comparisons_of_unknown_systems():
    from tasks.config import PROJECT_ROOT, PipelineConfig, load_config

    raw = load_config(PROJECT_ROOT / "configs" / "squad-open.yaml").model_dump()
    raw["evaluation"]["compare"] = [["two-stage", "minilm-dpr"], ["hybrid(minilm-dpr)", "bm25"]]
    PipelineConfig.model_validate(raw)
    raw["evaluation"]["compare"] = [["two-stage", "dpr"]]
    with pytest.raises(ValidationError, match=r"\['dpr'\] name no system"):
        PipelineConfig.model_validate(raw)


def _runs(system, ranked):
    rows = [{"qid": q, "pid": p, "rank": r, "score": float(-r), "system": system}
            for q, pids in ranked.items() for r, p in enumerate(pids, 1)]
    return pa.Table.from_pylist(rows)


def test_qrels_comparisons_resample_the_per_query_ndcg_that_the_metrics_average():
    """BEIR corpora have no answers: their comparisons resample per-query nDCG@k, the very values
    ir_metrics averages (a judged query a system misses counts 0)."""
    from tasks.evaluation.bootstrap import compare_systems_on_qrels
    from tasks.evaluation.ir_metrics import ir_metrics

    qrels = pa.Table.from_pylist([{"qid": f"q{i}", "pid": f"d{i}", "relevance": 1 + i % 2} for i in range(40)]
                                 + [{"qid": f"q{i}", "pid": f"e{i}", "relevance": 1} for i in range(40)])
    split_of = {f"q{i}": ("test" if i < 30 else "dev") for i in range(40)}
    good = _runs("good", {f"q{i}": [f"d{i}", "x", f"e{i}"] for i in range(40)})
    poor = _runs("poor", {f"q{i}": ["x", "y", f"d{i}"] for i in range(0, 40, 2)})  # misses half the queries
    rows = compare_systems_on_qrels({"good": good, "poor": poor}, qrels, split_of, "good", "poor", split="test",
                                    ks=(10,), samples=1000)
    metrics = ir_metrics(pa.concat_tables([good, poor]), qrels, split_of)
    mean = {r["system"]: r["value"] for r in metrics.to_pylist()
            if r["metric"] == "ndcg_cut" and r["k"] == 10 and r["split"] == "test"}
    (row,) = rows
    assert row["questions"] == 30 and row["metric"] == "ndcg_cut"
    assert row["a"] == pytest.approx(mean["good"], abs=1e-9) and row["b"] == pytest.approx(mean["poor"], abs=1e-9)
    assert row["low"] > 0 and "nDCG@10" in comparisons_markdown(rows)
    with pytest.raises(ValueError, match="no run of system 'absent'"):
        compare_systems_on_qrels({"good": good}, qrels, split_of, "good", "absent")
