"""New passages from a document diff: the passages of unchanged documents are carried over as they
are (same pid, same row), those of changed and deleted documents dropped, and changed and new
documents chunked again with the settings the previous passages were made with."""
from __future__ import annotations

import pyarrow as pa

from tasks import schemas
from tasks.chunking.chunker import chunk_documents
from tasks.refresh.diff import Diff, diff_documents, rows_with


def refresh_passages(previous: pa.Table, previous_documents: pa.Table, documents: pa.Table,
                     words: int, stride: int | None) -> tuple[pa.Table, Diff]:
    """(passages, document diff). Passages whose document is not in either documents table (DPR
    passage files) are carried over untouched."""
    doc_diff = diff_documents(previous_documents.select(["doc_id", "content_hash", "title"]),
                              documents.select(["doc_id", "content_hash", "title"]))
    kept = rows_with(previous, "doc_id", doc_diff.touched, keep=False).select(schemas.PASSAGES.names)
    # Chunk pids are doc_id#index: an unchanged chunk of a changed document keeps its pid, so the
    # passage diff downstream finds it unchanged and its vector is carried over.
    fresh = rows_with(documents, "doc_id", doc_diff.fresh).to_pylist()
    chunks = pa.Table.from_pylist(list(chunk_documents(fresh, words, stride)), schema=schemas.PASSAGES)
    return pa.concat_tables([kept.cast(schemas.PASSAGES), chunks]), doc_diff
