"""Memory-bounded exact dense top-k, for mining hard negatives over a whole corpus.

Paper 003 section 4.2 mines "coarse" (25-d) and "fine" (512-d) semantic negatives as the top M
passages of every training question by dot product over all passages; paper 002 (figure 3) mines
the second retriever's negatives with the first retriever the same way. `blocked_top_k` does that
search exactly while holding only the running ``[questions, k]`` best plus one
``query_block x shard`` score tile: never a questions x passages matrix, never all the passage
vectors. The passage side streams from the embeddings Parquet (`iter_vector_shards`), so memory is
bounded by a shard whatever the corpus size.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tasks.compute.embeddings import vectors_from_table

READ_BUFFER = 8 << 20  # bytes of a Parquet column chunk read at a time


@dataclass(frozen=True)
class TopK:
    """Per question, the best passages (higher score first, ties by corpus order) and their scores."""
    pids: list[list[str]]
    scores: np.ndarray  # [questions, min(k, corpus)] float32


def iter_vector_shards(files: Sequence[Path], rows: int) -> Iterator[tuple[list[str], np.ndarray]]:
    """Stream an embeddings table (`embeddings_table`'s schema) as (pids, float32 ``[n, dim]``)
    shards of at most `rows` rows, file by file in the given order; never reads a whole file
    (memory: one shard plus the Parquet row group it comes from)."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    for f in files:
        # pre_buffer (pyarrow's default) keeps every column chunk read so far until the file is
        # closed: memory would grow with the file. Without it, and with column chunks streamed
        # through a buffer instead of read whole, about one decoded row group is held at a time.
        with pq.ParquetFile(f, pre_buffer=False, buffer_size=READ_BUFFER) as parquet:
            for batch in parquet.iter_batches(batch_size=rows, columns=["pid", "vector"]):
                pids, vectors = vectors_from_table(pa.Table.from_batches([batch]))
                del batch
                yield pids, vectors.astype(np.float32, copy=False)  # float16 storage: one shard's copy
                del pids, vectors  # hold nothing of this row group while the next one is decoded


def _tile_top(tile, kk: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores and column indices of each row's `kk` best in a torch ``[rows, cols]`` tile; where ties
    straddle the cut, the earliest columns win (torch.topk picks among them arbitrarily)."""
    import torch

    if kk >= tile.shape[1]:
        cols = np.broadcast_to(np.arange(tile.shape[1]), tile.shape)
        return tile.numpy(), cols
    vals, idx = torch.topk(tile, kk, dim=1, sorted=False)
    cut = vals.min(dim=1).values
    crowded = ((tile >= cut[:, None]).sum(dim=1) > kk).nonzero().flatten().tolist()
    for r in crowded:  # rare on real vectors: redo the row with a stable sort
        order = torch.from_numpy(np.argsort(-tile[r].numpy(), kind="stable")[:kk])
        idx[r], vals[r] = order, tile[r, order]
    return vals.numpy(), idx.numpy()


def _merge(best_s: np.ndarray, best_p: np.ndarray, new_s: np.ndarray, new_p: np.ndarray,
           k: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep each row's `k` best of the running best and a tile's candidates: score desc, position asc."""
    scores = np.concatenate([best_s, new_s], axis=1)
    pos = np.concatenate([best_p, new_p], axis=1)
    order = np.lexsort((pos, -scores), axis=1)[:, :k]
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(pos, order, axis=1)


def blocked_top_k(queries: np.ndarray, shards: Iterable[tuple[Sequence[str], np.ndarray]], k: int,
                  query_block: int = 1024) -> TopK:
    """Exact inner-product top-`k` of every query over all `shards` (pids, ``[n, dim]`` vectors),
    in corpus order. Each shard is scored `query_block` queries at a time (float32 matmul, top-k of
    the tile, merge with the running best), then dropped. `k` above the corpus size ranks the
    whole corpus."""
    import torch

    queries = np.asarray(queries)
    if queries.ndim != 2:
        raise ValueError(f"queries must be 2-D [questions, dim], got shape {queries.shape}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if query_block < 1:
        raise ValueError(f"query_block must be >= 1, got {query_block}")
    queries = torch.from_numpy(np.array(queries, dtype=np.float32))  # own copy
    n_q, dim = queries.shape
    best_s = np.zeros((n_q, 0), np.float32)
    best_p = np.zeros((n_q, 0), np.int64)
    pid_of: dict[int, str] = {}  # pids of the positions in the running best only, not the corpus
    start = 0
    for pids, vectors in shards:
        vectors = np.asarray(vectors)
        if vectors.ndim != 2 or vectors.shape[1] != dim:
            raise ValueError(f"shard vectors must be [n, {dim}] like the queries, got shape {vectors.shape}")
        if len(pids) != vectors.shape[0]:
            raise ValueError(f"shard has {len(pids)} pids for {vectors.shape[0]} vectors")
        n = vectors.shape[0]
        if n == 0:
            continue
        with warnings.catch_warnings():  # Arrow's zero-copy arrays are read-only; they are only read
            warnings.simplefilter("ignore", UserWarning)
            shard_t = torch.from_numpy(np.asarray(vectors, dtype=np.float32)).T
        kk = min(k, n)
        merged_s, merged_p = [], []
        for b in range(0, n_q, query_block):
            # All the arithmetic in torch: one thread pool (numpy's BLAS beside it oversubscribes the cores).
            tile = torch.mm(queries[b:b + query_block], shard_t)
            s, cols = _tile_top(tile, kk)
            ms, mp = _merge(best_s[b:b + query_block], best_p[b:b + query_block], s, cols + start, k)
            merged_s.append(ms)
            merged_p.append(mp)
            del tile, s, cols
        if n_q:
            best_s, best_p = np.concatenate(merged_s), np.concatenate(merged_p)
        fresh = np.unique(best_p[best_p >= start])
        pid_of.update((p, pids[p - start]) for p in fresh.tolist())
        if len(pid_of) > 2 * best_p.size:  # forget pids that fell out of every question's best
            pid_of = {p: pid_of[p] for p in np.unique(best_p).tolist()}
        start += n
        del pids, vectors, shard_t  # before the next shard is read, not after
    if start == 0:
        raise ValueError("no passages: the shards are empty")
    if n_q == 0:
        best_s = np.zeros((0, min(k, start)), np.float32)
    return TopK([[pid_of[p] for p in row] for row in best_p.tolist()], best_s)
