"""Fusion of retrieval runs (BM25, dense, ...): linear score fusion (papers 000, 003) and RRF (paper 003).

Both take and return RUNS tables (tasks.schemas.RUNS). Ties are broken deterministically.
"""
from __future__ import annotations

import math

from typing import Callable, Sequence

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


def fuse_linear(
    runs: Sequence[pa.Table],
    weights: Sequence[float],
    k: int = 100,
    system: str = "fusion",
    missing: str = "min",
    depth: int | None = None,
) -> pa.Table:
    """Fuse N runs by ``score = sum_i weights[i] * score_i`` over the union of their lists.

    Candidates are, per question, the union of all input lists (``depth`` first cuts each list to
    ranks <= depth; None keeps all rows given; a pid listed twice keeps its best score).
    A passage missing from run i gets, with ``missing='min'``, run i's minimum score for that
    question (it scored at most that, since it was not retrieved); with ``missing='zero'``, 0.
    A question absent from run i entirely gets 0 on that side.
    Ties: fused score, then the real score of runs[0], runs[1], ... (a passage found by a list
    beats one filled in), then pid. Returns the top ``k`` per question as a RUNS table.
    """
    if missing not in ("min", "zero"):
        raise ValueError(f"missing must be 'min' or 'zero', got {missing!r}")
    if not runs:
        raise ValueError("no runs to fuse")
    if len(weights) != len(runs):
        raise ValueError(f"{len(runs)} runs but {len(weights)} weights")
    cols = [f"s{i}" for i in range(len(runs))]
    sides = [_top(run, depth).select(["qid", "pid", "score"]).group_by(["qid", "pid"])
             .aggregate([("score", "max")]).rename_columns(["qid", "pid", col])
             for run, col in zip(runs, cols)]
    joined = sides[0]
    for side in sides[1:]:
        joined = joined.join(side, keys=["qid", "pid"], join_type="full outer")
    if joined.num_rows == 0:
        return RUNS.empty_table()
    qids = np.asarray(joined["qid"].to_pylist(), dtype=str)
    pids = np.asarray(joined["pid"].to_pylist(), dtype=str)
    fused, ties = None, []
    for side, col, w in zip(sides, cols, weights):
        raw = joined[col].to_numpy(zero_copy_only=False).astype(np.float64)  # nulls -> nan
        gaps = np.isnan(raw)
        filled = np.where(gaps, 0.0, raw)
        if missing == "min":
            mins = side.group_by("qid").aggregate([(col, "min")])
            lookup = dict(zip(mins["qid"].to_pylist(), mins[f"{col}_min"].to_pylist()))
            filled[gaps] = [lookup.get(q, 0.0) for q in qids[gaps]]
        term = float(w) * filled
        fused = term if fused is None else fused + term
        ties.append(np.where(gaps, -np.inf, raw))
    return _rank_table(qids, pids, [fused] + ties, k, system, fused)


def linear_fusion(
    bm25_runs: pa.Table,
    dense_runs: pa.Table,
    weight: float,
    k: int = 100,
    system: str = "hybrid",
    missing: str = "min",
    depth: int | None = None,
) -> pa.Table:
    """Fuse two runs by ``score = dense + weight * bm25``: ``fuse_linear([dense, bm25], [1, weight])``.

    The weight multiplies the BM25 side (weight 0 = the dense ranking; the dense score's scale
    stays fixed, as in DPR's hybrid). Ties: fused score, then dense, then BM25 score, then pid.
    """
    return fuse_linear([dense_runs, bm25_runs], [1.0, weight], k=k, system=system, missing=missing, depth=depth)


def choose_weights(
    runs: Sequence[pa.Table],
    evaluate_fn: Callable[[pa.Table], float],
    grid: Sequence[float] = DEFAULT_GRID,
    k: int = 100,
    missing: str = "min",
    rounds: int = 3,
    system: str = "fusion",
) -> tuple[tuple[float, ...], dict[tuple[float, ...], float]]:
    """Pick `fuse_linear` weights on the dev split by coordinate ascent over ``grid``.

    runs[0] is the anchor (weight 1.0); the others start at the grid point nearest 1.0. Each round,
    for each other run in order, every grid point is tried with the rest fixed and the one whose
    fused run scores highest under ``evaluate_fn`` is kept (higher is better; ties go to the
    earlier grid point). Stops when a round changes nothing or after ``rounds`` rounds. With two
    runs this is an exhaustive grid search. Returns (best weights, {weights: score}) over every
    weights tuple evaluated; each tuple includes the anchor's 1.0.
    """
    if len(runs) < 2:
        raise ValueError("need at least two runs to weight")
    return coordinate_search(
        len(runs), lambda ws: evaluate_fn(fuse_linear(runs, ws, k=k, system=system, missing=missing)), grid, rounds)


def coordinate_search(count: int, evaluate: Callable[[tuple[float, ...]], float], grid: Sequence[float],
                      rounds: int = 3, stay_on_ties: bool = False) -> tuple[tuple[float, ...], dict[tuple[float, ...], float]]:
    """Weights (1.0, w_1, ..., w_{count-1}) maximising `evaluate` by coordinate search over `grid`.

    The others start at the grid point nearest 1.0; each round tries every grid point for each
    weight in order with the rest fixed. Ties go to the earlier grid point, or with
    `stay_on_ties` to the smallest change from the current weight (a weight then moves only for a
    strictly better score). NaN never wins (all NaN: grid[0], or with `stay_on_ties` no move). Stops when a round changes nothing or after `rounds`.
    Returns (weights, {weights: score}) over every tuple evaluated, in the order tried."""
    if not len(grid):
        raise ValueError("grid is empty")
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    grid = [float(g) for g in grid]
    start = min(grid, key=lambda g: abs(g - 1.0))  # the first of equally near points
    weights = [1.0] + [start] * (count - 1)
    scores: dict[tuple[float, ...], float] = {}

    def score(ws: tuple[float, ...]) -> float:
        if ws not in scores:
            scores[ws] = float(evaluate(ws))
        return scores[ws]

    for _ in range(rounds):
        changed = False
        for i in range(1, count):
            current = weights[i]
            tried = [(score(tuple(weights[:i] + [w] + weights[i + 1:])), w) for w in grid]
            best = max((v for v, _ in tried if not math.isnan(v)), default=None)
            # all NaN: the first grid point, or with stay_on_ties the weight stays
            winners = [w for v, w in tried if v == best] or [current if stay_on_ties else grid[0]]
            choice = min(winners, key=lambda w: abs(w - current)) if stay_on_ties else winners[0]
            changed |= choice != current
            weights[i] = choice
        if not changed:
            break
    return tuple(weights), scores


def choose_weight(
    bm25_dev: pa.Table,
    dense_dev: pa.Table,
    evaluate_fn: Callable[[pa.Table], float],
    grid: Sequence[float] = DEFAULT_GRID,
    k: int = 100,
    missing: str = "min",
) -> tuple[float, dict[float, float]]:
    """Pick the BM25 weight of `linear_fusion` on the dev split: the grid point whose fused run
    scores highest under ``evaluate_fn`` (higher is better; ties go to the earlier grid point).
    Returns (best weight, {weight: score})."""
    (_, best), scores = choose_weights([dense_dev, bm25_dev], evaluate_fn, grid, k=k, missing=missing,
                                       system="hybrid")
    return best, {ws[1]: s for ws, s in scores.items()}


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
