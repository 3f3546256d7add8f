"""Embeddings as Arrow tables: a passages' (pid, vector) table, a search's question vectors
(qid, vector), and the vectors read back as one matrix."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa


def embeddings_table(pids: Sequence[str], vectors: np.ndarray) -> pa.Table:
    """Arrow table ``pid: string, vector: fixed_size_list<float32|float16>[dim]``."""
    vectors = np.asarray(vectors)
    if vectors.ndim != 2:
        raise ValueError("vectors must be 2-D")
    if vectors.dtype not in (np.float32, np.float16):
        raise ValueError(f"vectors must be float32 or float16, got {vectors.dtype}")
    if len(pids) != vectors.shape[0]:
        raise ValueError(f"{len(pids)} pids for {vectors.shape[0]} vectors")
    dim = vectors.shape[1]
    flat = pa.array(np.ascontiguousarray(vectors).reshape(-1))
    vec = pa.FixedSizeListArray.from_arrays(flat, dim)
    return pa.table({"pid": pa.array(pids, type=pa.string()), "vector": vec})


def query_vectors_table(qids: Sequence[str], vectors: np.ndarray) -> pa.Table:
    """``qid: string, vector: fixed_size_list`` (a search stage's question vectors)."""
    return embeddings_table(qids, np.asarray(vectors, dtype=np.float32)).rename_columns(["qid", "vector"])


def vectors_from_table(table: pa.Table) -> tuple[list[str], np.ndarray]:
    """Inverse of ``embeddings_table``: (pids, ``[n, dim]`` array). Zero-copy for one-chunk tables."""
    col = table.column("vector")
    if not pa.types.is_fixed_size_list(col.type):
        raise ValueError(f"vector column must be fixed_size_list, got {col.type}")
    if col.null_count:
        raise ValueError("vector column has nulls")
    dim = col.type.list_size
    arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    if isinstance(arr, pa.ChunkedArray):  # empty table
        arr = pa.concat_arrays(arr.chunks) if arr.num_chunks else pa.array([], type=col.type)
    values = arr.flatten()  # respects slicing offsets, no copy
    if values.null_count:
        raise ValueError("vector values have nulls")
    mat = values.to_numpy(zero_copy_only=True).reshape(-1, dim) if len(values) else \
        np.zeros((0, dim), dtype=values.type.to_pandas_dtype())
    return table.column(table.column_names[0]).to_pylist(), mat  # pid, or qid for question vectors
