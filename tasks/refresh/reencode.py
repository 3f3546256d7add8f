"""New passage vectors: new and changed passages are encoded, the vectors of unchanged passages
are carried over byte for byte (never re-encoded)."""
from __future__ import annotations

from typing import Callable

import pyarrow as pa

from tasks.refresh.diff import Diff, diff_passages, rows_with

# passages (pid, title, text) -> their embeddings table (pid, vector), in the same order
EncodeFn = Callable[[pa.Table], pa.Table]


def refresh_vectors(previous: pa.Table, previous_passages: pa.Table, passages: pa.Table,
                    encode: EncodeFn) -> tuple[pa.Table, Diff, dict]:
    """(embeddings of `passages`, the passage diff, stats). `previous` holds the vectors of
    `previous_passages`; `encode` gets the new and changed passages only (none: not called)."""
    columns = ["pid", "title", "text"]
    diff = diff_passages(previous_passages.select(columns), passages.select(columns))
    carried = rows_with(previous, "pid", diff.unchanged).select(["pid", "vector"])
    if carried.num_rows != len(diff.unchanged):
        raise ValueError(f"the previous embeddings hold {carried.num_rows:,} of the {len(diff.unchanged):,} "
                         "unchanged passages' vectors: they were not computed from the previous passages")
    todo = rows_with(passages, "pid", diff.fresh)
    parts = [carried]
    if todo.num_rows:
        table = encode(todo.select(["pid", "title", "text"]))
        if table.column("pid").to_pylist() != todo.column("pid").to_pylist():
            raise ValueError("the encoder's vectors are not the new and changed passages', in order")
        if table.schema.field("vector").type != previous.schema.field("vector").type:
            raise ValueError(f"the encoder gives {table.schema.field('vector').type} vectors; the previous "
                             f"embeddings hold {previous.schema.field('vector').type}")
        parts.append(table.select(["pid", "vector"]))
    out = pa.concat_tables([p.cast(previous.select(["pid", "vector"]).schema) for p in parts])
    stats = {"passages": out.num_rows, "reencoded": todo.num_rows, "carried_over": carried.num_rows,
             "removed": len(diff.deleted), "dim": previous.schema.field("vector").type.list_size}
    return out, diff, stats
