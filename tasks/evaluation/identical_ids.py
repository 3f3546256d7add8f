"""BEIR's `ignore_identical_ids`: in corpora whose queries are documents too (argument retrieval,
duplicate questions), a query's own document is not a hit; drop it from the run before scoring."""
from __future__ import annotations

from typing import Mapping

import pyarrow as pa


def drop_identical_ids(run: pa.Table, doc_of: Mapping[str, str]) -> pa.Table:
    """`run` without the rows whose passage belongs to the document whose id is the query's id
    (or whose pid is the query's id); the remaining rows of each query are re-ranked 1..n."""
    qids, pids = run.column("qid").to_pylist(), run.column("pid").to_pylist()
    keep = [q != p and doc_of.get(p) != q for q, p in zip(qids, pids)]
    if all(keep):
        return run
    kept = run.filter(pa.array(keep)).sort_by([("qid", "ascending"), ("rank", "ascending")])
    ranks, previous, n = [], None, 0
    for qid in kept.column("qid").to_pylist():
        n = n + 1 if qid == previous else 1
        previous = qid
        ranks.append(n)
    return kept.set_column(kept.schema.get_field_index("rank"), "rank", pa.array(ranks, kept.schema.field("rank").type))
