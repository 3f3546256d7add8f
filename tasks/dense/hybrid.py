"""Fusion of BM25 and dense runs: linear score fusion (papers 000, 003) and RRF (paper 003).

Both take and return RUNS tables (tasks.schemas.RUNS). Ties are broken deterministically.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.schemas import RUNS

DEFAULT_GRID: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(41))  # 0.0 .. 2.0


def _rank_table(qids: np.ndarray, pids: np.ndarray, keys: list[np.ndarray], k: int,
                system: str, scores: np.ndarray) -> pa.Table:
    """Sort rows by qid, then by ``keys`` (each descending, first key primary), then pid
    ascending; keep the first ``k`` per qid and number them 1..k."""
    if len(qids) == 0:
        return RUNS.empty_table()
    # np.lexsort sorts by the last key first; descending keys are negated.
    order = np.lexsort([pids] + [-key for key in reversed(keys)] + [qids])
    q_sorted = qids[order]
    starts = np.r_[True, q_sorted[1:] != q_sorted[:-1]]
    group_start = np.maximum.accumulate(np.where(starts, np.arange(len(order)), 0))
    rank = np.arange(len(order)) - group_start + 1
    keep = rank <= k
    sel = order[keep]
    return pa.table({
        "qid": pa.array(qids[sel], type=pa.string()),
        "pid": pa.array(pids[sel], type=pa.string()),
        "rank": pa.array(rank[keep], type=pa.int32()),
        "score": pa.array(scores[sel].astype(np.float32), type=pa.float32()),
        "system": pa.array([system] * int(keep.sum()), type=pa.string()),
    }, schema=RUNS)


def _top(run: pa.Table, depth: int | None) -> pa.Table:
    run = run.select(["qid", "pid", "rank", "score"])
    if depth is not None:
        run = run.filter(pc.less_equal(run["rank"], depth))
    return run


def linear_fusion(
    bm25_runs: pa.Table,
    dense_runs: pa.Table,
    weight: float,
    k: int = 100,
    system: str = "hybrid",
    missing: str = "min",
    depth: int | None = None,
) -> pa.Table:
    """Fuse two runs by ``score = dense + weight * bm25`` over the union of their lists.

    The weight multiplies the BM25 side (weight 0 = the dense ranking; the dense score's scale
    stays fixed, as in DPR's hybrid). Candidates are, per question, the union of both input lists
    (``depth`` first cuts each list to ranks <= depth; None keeps all rows given).
    A passage missing from one list gets, with ``missing='min'``, that list's minimum score for
    that question (it scored at most that, since it was not retrieved); with ``missing='zero'``, 0.
    A question absent from one run entirely gets 0 on that side.
    Ties: fused score, then the real dense score, then the real BM25 score (a passage found by a
    list beats one filled in), then pid. Returns the top ``k`` per question as a RUNS table.
    """
    if missing not in ("min", "zero"):
        raise ValueError(f"missing must be 'min' or 'zero', got {missing!r}")
    bm = _top(bm25_runs, depth).rename_columns(["qid", "pid", "bm_rank", "bm"])
    de = _top(dense_runs, depth).rename_columns(["qid", "pid", "de_rank", "de"])
    bm = bm.select(["qid", "pid", "bm"]).group_by(["qid", "pid"]).aggregate([("bm", "max")]) \
        .rename_columns(["qid", "pid", "bm"])
    de = de.select(["qid", "pid", "de"]).group_by(["qid", "pid"]).aggregate([("de", "max")]) \
        .rename_columns(["qid", "pid", "de"])
    joined = bm.join(de, keys=["qid", "pid"], join_type="full outer")
    if joined.num_rows == 0:
        return RUNS.empty_table()
    qids = np.asarray(joined["qid"].to_pylist(), dtype=str)
    pids = np.asarray(joined["pid"].to_pylist(), dtype=str)
    bm_raw = joined["bm"].to_numpy(zero_copy_only=False).astype(np.float64)  # nulls -> nan
    de_raw = joined["de"].to_numpy(zero_copy_only=False).astype(np.float64)

    def fill(raw: np.ndarray, side: pa.Table, col: str) -> np.ndarray:
        out = raw.copy()
        if missing == "zero":
            return np.where(np.isnan(out), 0.0, out)
        mins = side.group_by("qid").aggregate([(col, "min")])
        lookup = dict(zip(mins["qid"].to_pylist(), mins[f"{col}_min"].to_pylist()))
        gaps = np.isnan(out)
        out[gaps] = [lookup.get(q, 0.0) for q in qids[gaps]]
        return out

    bm_f = fill(bm_raw, bm, "bm")
    de_f = fill(de_raw, de, "de")
    fused = de_f + float(weight) * bm_f
    tie_de = np.where(np.isnan(de_raw), -np.inf, de_raw)
    tie_bm = np.where(np.isnan(bm_raw), -np.inf, bm_raw)
    return _rank_table(qids, pids, [fused, tie_de, tie_bm], k, system, fused)


def choose_weight(
    bm25_dev: pa.Table,
    dense_dev: pa.Table,
    evaluate_fn: Callable[[pa.Table], float],
    grid: Sequence[float] = DEFAULT_GRID,
    k: int = 100,
    missing: str = "min",
) -> tuple[float, dict[float, float]]:
    """Pick the BM25 weight on the dev split: the grid point whose fused run scores highest under
    ``evaluate_fn`` (higher is better; ties go to the earlier grid point).
    Returns (best weight, {weight: score})."""
    if not len(grid):
        raise ValueError("grid is empty")
    scores: dict[float, float] = {}
    best_w, best_s = None, -np.inf
    for w in grid:
        s = float(evaluate_fn(linear_fusion(bm25_dev, dense_dev, w, k=k, missing=missing)))
        scores[float(w)] = s
        if s > best_s:
            best_w, best_s = float(w), s
    if best_w is None:  # every score was nan or -inf
        best_w = float(grid[0])
    return best_w, scores


def reciprocal_rank_fusion(
    runs: Sequence[pa.Table],
    k_rrf: int = 60,
    k: int = 100,
    system: str = "rrf",
) -> pa.Table:
    """Reciprocal rank fusion: score(q, p) = sum over runs containing p of 1 / (k_rrf + rank).

    Paper 003 sec. 4.4 ("Rank fusion") follows Cormack et al. (2009), whose formula this is (k=60);
    ``rank`` is each run's 1-based rank column; a run without p adds nothing. Ties: pid ascending.
    """
    if not runs:
        raise ValueError("no runs to fuse")
    parts = []
    for run in runs:
        t = run.select(["qid", "pid", "rank"])
        contrib = pc.divide(1.0, pc.add(pc.cast(t["rank"], pa.float64()), float(k_rrf)))
        t = t.select(["qid", "pid"]).append_column("c", contrib)
        # one contribution per run: a duplicated (qid, pid) inside a run keeps its best rank
        parts.append(t.group_by(["qid", "pid"]).aggregate([("c", "max")]).rename_columns(["qid", "pid", "c"]))
    allc = pa.concat_tables(parts).group_by(["qid", "pid"]).aggregate([("c", "sum")])
    if allc.num_rows == 0:
        return RUNS.empty_table()
    qids = np.asarray(allc["qid"].to_pylist(), dtype=str)
    pids = np.asarray(allc["pid"].to_pylist(), dtype=str)
    score = allc["c_sum"].to_numpy().astype(np.float64)
    return _rank_table(qids, pids, [score], k, system, score)


def tune_scorer(metric: str, tune_questions: pa.Table, passage_text: Mapping[str, str], gold: pa.Table,
                k: int, match_type: str = "string") -> tuple[str, Callable[[pa.Table], float]]:
    """The score `choose_weight` maximises on the tuning split, as (name, run -> float).

    'accuracy': share of questions with an answer-bearing passage in the top k (DPR's measure);
    'ndcg': mean graded nDCG@k over the split's judged questions (BEIR data has no answer strings);
    'auto': accuracy when the questions carry answers, else nDCG."""
    from tasks.evaluation.ir_metrics import ir_metrics
    from tasks.evaluation.qa_metrics import carries_answers, first_hit_ranks

    if metric == "auto":
        metric = "accuracy" if carries_answers(tune_questions) else "ndcg"
    if metric == "accuracy":
        def accuracy(run: pa.Table) -> float:
            ranks = first_hit_ranks(run, passage_text, tune_questions, match_type, k).column("first_hit_rank")
            return sum(1 for r in ranks.to_pylist() if r is not None and r <= k) / max(len(ranks), 1)
        return f"accuracy@{k}", accuracy
    if metric != "ndcg":
        raise ValueError(f"unknown tuning metric {metric!r}: accuracy, ndcg or auto")
    judged = gold.filter(pc.is_in(gold.column("qid"), value_set=tune_questions.column("qid")))
    if judged.num_rows == 0:
        raise ValueError("hybrid: no gold judgements for the tuning questions to choose the BM25 weight by nDCG")

    def ndcg(run: pa.Table) -> float:
        rows = ir_metrics(run, judged, p_at=(), recall_at=(), ndcg_at=(k,), mrr_at=()).to_pylist()
        return next((r["value"] for r in rows if r["split"] == "all"), 0.0)  # a fused run is one system
    return f"ndcg@{k}", ndcg
