"""FAISS indexes over passage embeddings: build, save/load, search into RUNS tables.

Exact inner product (``IndexFlatIP``) is the default, as in DPR; HNSW and IVF-PQ are the
approximate options for large collections (DESIGN.md section 9).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

import faiss
import numpy as np
import pyarrow as pa

from tasks.schemas import RUNS

INDEX_FILE = "index.faiss"
PARAMS_FILE = "index.json"
_METRICS = {"ip": faiss.METRIC_INNER_PRODUCT, "l2": faiss.METRIC_L2}


def _as_f32(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError("vectors must be 2-D")
    return x


def default_nlist(n: int) -> int:
    """About 4*sqrt(n) lists, but at least 39 training points per list (FAISS's own floor)."""
    return max(1, min(int(4 * math.sqrt(n)), n // 39))


def default_pq_m(d: int) -> int:
    """Largest divisor of d that is <= min(64, d // 4): sub-vectors of >= 4 dimensions."""
    cap = max(1, min(64, d // 4))
    return max(m for m in range(1, cap + 1) if d % m == 0)


def build_index(
    vectors: np.ndarray,
    kind: str = "flat",
    metric: str = "ip",
    hnsw_m: int = 32,
    ef_construction: int = 200,
    ef_search: int = 128,
    nlist: int | None = None,
    pq_m: int | None = None,
    nbits: int = 8,
    nprobe: int = 16,
    train_sample: int | None = 100_000,
    seed: int = 0,
) -> faiss.Index:
    """Build and fill an index over ``vectors`` (row i gets id i).

    kind: ``flat`` (exact), ``hnsw`` (IndexHNSWFlat; hnsw_m, ef_construction, ef_search) or
    ``ivfpq`` (IndexIVFPQ with a flat coarse quantizer; nlist defaults to ``default_nlist``, pq_m to
    ``default_pq_m``, trained on ``train_sample`` random rows, None = all rows).
    metric: ``ip`` (inner product) or ``l2``.
    """
    if metric not in _METRICS:
        raise ValueError(f"metric must be one of {sorted(_METRICS)}, got {metric!r}")
    x = _as_f32(vectors)
    n, d = x.shape
    mt = _METRICS[metric]
    if kind == "flat":
        index = faiss.IndexFlatIP(d) if metric == "ip" else faiss.IndexFlatL2(d)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(d, hnsw_m, mt)
        index.hnsw.efConstruction = ef_construction
        index.hnsw.efSearch = ef_search
    elif kind == "ivfpq":
        nlist = nlist or default_nlist(n)
        pq_m = pq_m or default_pq_m(d)
        if d % pq_m:
            raise ValueError(f"pq_m={pq_m} must divide the dimension {d}")
        quantizer = faiss.IndexFlatIP(d) if metric == "ip" else faiss.IndexFlatL2(d)
        index = faiss.IndexIVFPQ(quantizer, d, nlist, pq_m, nbits, mt)
        # faiss's Python wrapper keeps `quantizer` alive as long as `index` (referenced_objects).
        train = x
        if train_sample is not None and n > train_sample:
            rows = np.random.default_rng(seed).choice(n, size=train_sample, replace=False)
            train = x[np.sort(rows)]
        need = max(nlist, 2 ** nbits)
        if len(train) < need:
            raise ValueError(f"ivfpq needs at least {need} training vectors (nlist={nlist}, "
                             f"2**nbits={2 ** nbits}); got {len(train)}")
        index.train(train)
        index.nprobe = min(nprobe, nlist)
    else:
        raise ValueError(f"kind must be flat, hnsw or ivfpq, got {kind!r}")
    if n:
        index.add(x)
    return index


def index_params(index: faiss.Index) -> dict:
    """Describe an index (kind, metric, dimension, size and its kind's parameters). An id-mapped
    index (a corpus refresh's) is described by the index it wraps, with `id_map: true`."""
    idx = faiss.downcast_index(index)
    id_map = isinstance(idx, faiss.IndexIDMap)
    ntotal = int(idx.ntotal)
    if id_map:
        idx = faiss.downcast_index(idx.index)
    metric = "ip" if idx.metric_type == faiss.METRIC_INNER_PRODUCT else "l2"
    params: dict = {"d": idx.d, "ntotal": ntotal, "metric": metric}
    if id_map:
        params["id_map"] = True
    if isinstance(idx, faiss.IndexHNSWFlat):
        params.update(kind="hnsw", hnsw_m=int(idx.hnsw.nb_neighbors(1)),
                      ef_construction=int(idx.hnsw.efConstruction), ef_search=int(idx.hnsw.efSearch))
    elif isinstance(idx, faiss.IndexIVFPQ):
        params.update(kind="ivfpq", nlist=int(idx.nlist), pq_m=int(idx.pq.M),
                      nbits=int(idx.pq.nbits), nprobe=int(idx.nprobe))
    elif isinstance(idx, faiss.IndexFlat):
        params.update(kind="flat")
    else:
        params.update(kind=type(idx).__name__)
    return params


def save_index(index: faiss.Index, directory: str | Path, extra: dict | None = None) -> Path:
    """Write ``index.faiss`` and ``index.json`` (``index_params`` plus ``extra``) into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    faiss.write_index(index, str(directory / INDEX_FILE))
    params = index_params(index)
    if extra:
        params.update(extra)
    (directory / PARAMS_FILE).write_text(json.dumps(params, indent=2, sort_keys=True))
    return directory


def load_params(directory: str | Path) -> dict:
    return json.loads((Path(directory) / PARAMS_FILE).read_text())


def load_index(directory: str | Path) -> faiss.Index:
    """Read an index written by ``save_index``; search-time settings are restored from the JSON."""
    directory = Path(directory)
    index = faiss.read_index(str(directory / INDEX_FILE))  # concrete type, owns its memory
    params = load_params(directory)
    inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap) else index
    if isinstance(inner, faiss.IndexHNSWFlat) and "ef_search" in params:
        inner.hnsw.efSearch = int(params["ef_search"])
    if isinstance(inner, faiss.IndexIVFPQ) and "nprobe" in params:
        inner.nprobe = int(params["nprobe"])
    return index


def search(
    index: faiss.Index,
    query_vectors: np.ndarray,
    k: int,
    pids: Sequence[str] | pa.Array,
    qids: Sequence[str] | pa.Array,
    system: str = "dense",
    ef_search: int | None = None,
    nprobe: int | None = None,
    batch_size: int = 4096,
    by_id: bool = False,
) -> pa.Table:
    """Top-``k`` search; returns a RUNS table (rank 1..k per question, -1 ids skipped).

    ``pids[i]`` names index row i; with ``by_id``, the vector with id i (an id-mapped index, e.g. a
    corpus refresh's: null where no vector has that id). ``ef_search`` (HNSW) / ``nprobe`` (IVF)
    override the index's setting for this call only.
    """
    q = _as_f32(query_vectors)
    if len(qids) != q.shape[0]:
        raise ValueError(f"{len(qids)} qids for {q.shape[0]} query vectors")
    if k < 1:
        raise ValueError("k must be >= 1")
    idx = faiss.downcast_index(index)
    if not by_id and len(pids) != idx.ntotal:
        raise ValueError(f"{len(pids)} pids for an index of {idx.ntotal} vectors")
    inner = faiss.downcast_index(idx.index) if isinstance(idx, faiss.IndexIDMap) else idx
    params = None
    if ef_search is not None and isinstance(inner, faiss.IndexHNSW):
        params = faiss.SearchParametersHNSW(efSearch=int(ef_search))
    elif nprobe is not None and isinstance(inner, faiss.IndexIVF):
        params = faiss.SearchParametersIVF(nprobe=int(nprobe))
    k_eff = min(k, max(int(idx.ntotal), 1))
    d_parts, i_parts = [], []
    for s in range(0, q.shape[0], batch_size):
        dist, ids = idx.search(q[s:s + batch_size], k_eff, params=params)
        d_parts.append(dist)
        i_parts.append(ids)
    dist = np.concatenate(d_parts) if d_parts else np.zeros((0, k_eff), np.float32)
    ids = np.concatenate(i_parts) if i_parts else np.zeros((0, k_eff), np.int64)
    valid = ids >= 0
    q_rows = np.repeat(np.arange(q.shape[0]), k_eff).reshape(ids.shape)[valid]
    ranks = np.tile(np.arange(1, k_eff + 1, dtype=np.int32), (q.shape[0], 1))
    # FAISS puts missing (-1) results last, so ranks of the valid ones stay 1..m.
    pid_arr = pids if isinstance(pids, pa.Array) else pa.array(pids, type=pa.string())
    qid_arr = qids if isinstance(qids, pa.Array) else pa.array(qids, type=pa.string())
    return pa.table({
        "qid": qid_arr.take(pa.array(q_rows, type=pa.int64())),
        "pid": pid_arr.take(pa.array(ids[valid], type=pa.int64())),
        "rank": pa.array(ranks[valid], type=pa.int32()),
        "score": pa.array(dist[valid].astype(np.float32), type=pa.float32()),
        "system": pa.array([system] * int(valid.sum()), type=pa.string()),
    }, schema=RUNS)
