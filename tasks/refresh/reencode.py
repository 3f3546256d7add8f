"""New passage vectors: new and changed passages are encoded, the vectors of unchanged passages
are carried over byte for byte (never re-encoded)."""
from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa

from tasks.dense.encode import embeddings_table
from tasks.refresh.diff import Diff, diff_passages, rows_with

# (title, text) pairs -> [n, dim] vectors; `done` of `total` were encoded before this call
EncodeFn = Callable[[list[tuple[str, str]], int, int], np.ndarray]


def refresh_vectors(previous: pa.Table, previous_passages: pa.Table, passages: pa.Table, encode: EncodeFn,
                    shard_size: int = 100_000) -> tuple[pa.Table, Diff, dict]:
    """(embeddings of `passages`, the passage diff, stats). `previous` holds the vectors of
    `previous_passages`."""
    columns = ["pid", "title", "text"]
    diff = diff_passages(previous_passages.select(columns), passages.select(columns))
    carried = rows_with(previous, "pid", diff.unchanged).select(["pid", "vector"])
    if carried.num_rows != len(diff.unchanged):
        raise ValueError(f"the previous embeddings hold {carried.num_rows:,} of the {len(diff.unchanged):,} "
                         "unchanged passages' vectors: they were not computed from the previous passages")
    todo = rows_with(passages, "pid", diff.fresh)
    dtype = previous.schema.field("vector").type.value_type
    parts = [carried]
    for start in range(0, todo.num_rows, shard_size):
        shard = todo.slice(start, shard_size)
        pairs = list(zip(shard.column("title").to_pylist(), shard.column("text").to_pylist()))
        vectors = encode(pairs, start, todo.num_rows)
        table = embeddings_table(shard.column("pid").to_pylist(), vectors.astype(dtype.to_pandas_dtype(), copy=False))
        if table.schema.field("vector").type != previous.schema.field("vector").type:
            raise ValueError(f"the encoder gives {table.schema.field('vector').type} vectors; the previous "
                             f"embeddings hold {previous.schema.field('vector').type}")
        parts.append(table)
    out = pa.concat_tables([p.cast(previous.select(["pid", "vector"]).schema) for p in parts])
    stats = {"passages": out.num_rows, "reencoded": todo.num_rows, "carried_over": carried.num_rows,
             "removed": len(diff.deleted), "dim": previous.schema.field("vector").type.list_size}
    return out, diff, stats
