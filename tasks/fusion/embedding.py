"""Embedding fusion (paper 003 section 4.4): each model's embeddings multiplied by a coefficient and
concatenated, then one exact inner-product retrieval over the fused vectors.

The coefficients sit on the question side only. A fused question q = [c_1 q_1, ..., c_n q_n]
against a fused passage p = [p_1, ..., p_n] scores q.p = sum_i c_i q_i.p_i, the same score as
scaling the passages instead (the paper scales "the question (or document) embeddings"); putting
them on the questions leaves the passage index independent of the coefficients, so one index
serves every candidate tried on dev and the final retrieval. The first model keeps coefficient 1:
scaling all of them by one factor changes no ranking.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import pyarrow as pa

from tasks.compute import faiss_index
from tasks.dense.hybrid import DEFAULT_GRID, coordinate_search


def fuse_vectors(vectors: Sequence[np.ndarray], coefficients: Sequence[float]) -> np.ndarray:
    """``[c_1 v_1, ..., c_n v_n]`` row by row (float32): the models' vectors for the same rows,
    each scaled by its coefficient, concatenated along the dimension. Questions get the tuned
    coefficients, passages all 1 (see the module docstring)."""
    if not len(vectors):
        raise ValueError("no vectors to fuse")
    if len(coefficients) != len(vectors):
        raise ValueError(f"{len(vectors)} vector sets but {len(coefficients)} coefficients")
    mats = [np.asarray(v) for v in vectors]
    if any(m.ndim != 2 for m in mats):
        raise ValueError("vectors must be 2-D")
    rows = {m.shape[0] for m in mats}
    if len(rows) != 1:
        raise ValueError(f"vector sets have different row counts {[m.shape[0] for m in mats]}")
    return np.concatenate([np.float32(c) * m.astype(np.float32, copy=False) for m, c in zip(mats, coefficients)],
                          axis=1)


def rows_in_order(ids: Sequence[str], vectors: np.ndarray, order: Sequence[str], system: str,
                  kind: str = "pid") -> np.ndarray:
    """``vectors`` (row i belongs to ``ids[i]``) reordered so that row j belongs to ``order[j]``.
    Errors name ``system`` when an id of ``order`` has no vector or an id has two."""
    position = {key: i for i, key in enumerate(ids)}
    if len(position) != len(ids):
        raise ValueError(f"{system}: the same {kind} has several vectors")
    missing = [key for key in order if key not in position]
    if missing:
        raise ValueError(f"{system}: no vector for {len(missing)} {kind}(s), e.g. {missing[:3]}")
    if len(ids) == len(order) and list(ids) == list(order):
        return np.asarray(vectors)  # already in order: no copy of a corpus-sized matrix
    return np.asarray(vectors)[np.fromiter((position[key] for key in order), dtype=np.int64, count=len(order))]


def align_vectors(named: Sequence[tuple[str, Sequence[str], np.ndarray]],
                  kind: str = "pid") -> tuple[list[str], list[np.ndarray]]:
    """Put every model's vectors in one row order: the first model's.

    ``named`` holds (system, ids, vectors) per model (pids of its passage embeddings, or qids of its
    question vectors). Every model must cover the same ids: an id one model lacks would drop out of
    the fused corpus silently, so it is an error naming the system that lacks it.
    Returns (ids, [vectors per model, rows in the order of ids])."""
    if not named:
        raise ValueError("no models to align")
    first_system, order, _ = named[0]
    order = list(order)
    out = []
    for system, ids, vectors in named:
        if len(ids) != len(np.asarray(vectors)):
            raise ValueError(f"{system}: {len(ids)} {kind}s for {len(np.asarray(vectors))} vectors")
        extra = set(ids).difference(order)
        if extra:
            raise ValueError(f"{first_system}: no vector for {len(extra)} {kind}(s) that {system} has, "
                             f"e.g. {sorted(extra)[:3]}")
        out.append(rows_in_order(ids, vectors, order, system, kind))
    return order, out


def fused_passage_index(passage_vectors: Sequence[np.ndarray]):
    """Exact inner-product (FAISS flat) index over the unscaled concatenated passage vectors."""
    return faiss_index.build_index(fuse_vectors(passage_vectors, [1.0] * len(passage_vectors)), kind="flat")


def retrieve(index, pids: Sequence[str], query_vectors: Sequence[np.ndarray], qids: Sequence[str],
             coefficients: Sequence[float], k: int, system: str = "embedding") -> pa.Table:
    """Top ``k`` of each question's fused vector over ``index`` (`fused_passage_index`), a RUNS table."""
    return faiss_index.search(index, fuse_vectors(query_vectors, coefficients), k, pids, qids, system=system)


def tune_coefficients(
    index,
    pids: Sequence[str],
    query_vectors: Sequence[np.ndarray],
    qids: Sequence[str],
    evaluate_fn: Callable[[pa.Table], float],
    k: int = 100,
    grid: Sequence[float] = DEFAULT_GRID,
    rounds: int = 3,
    system: str = "embedding",
) -> tuple[tuple[float, ...], dict[tuple[float, ...], float]]:
    """Choose the coefficients on the tuning questions by coordinate search over ``grid``.

    ``query_vectors`` (one array per model) and ``qids`` hold the tuning questions only; each
    candidate retrieves the top ``k`` of the whole corpus (``index``) for them and is scored by
    ``evaluate_fn`` (higher is better: the linear fusion's tune metric). Model 0 keeps 1.0; the
    others start at the grid point nearest 1.0. Each round, for each other model in order, every
    grid point is tried with the rest fixed. Ties keep the smallest change from the current
    coefficient, then the earlier grid point: a coefficient moves only for a strictly better score,
    so equal-scoring plateaus do not drift. Stops when a round changes nothing or after ``rounds``.
    Returns (coefficients, {coefficients: score}) over every tuple tried, in the order tried.
    """
    if len(query_vectors) < 2:
        raise ValueError("need at least two models to weight")
    return coordinate_search(
        len(query_vectors), lambda cs: evaluate_fn(retrieve(index, pids, query_vectors, qids, cs, k, system=system)),
        grid, rounds, stay_on_ties=True)
