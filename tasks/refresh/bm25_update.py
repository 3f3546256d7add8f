"""Updating a Lucene BM25 index: a copy of the previous index, with the documents of deleted and
changed passages deleted by id and those of new and changed passages added, through Lucene's
IndexWriter (pyjnius) with Anserini's own analyzer and document generator, so an added document
is what IndexCollection would have made of it.

pyserini 1.6.0's `LuceneIndexer` (Anserini's SimpleIndexer) appends but cannot delete, and logs a
failed document instead of raising, hence the writer here. The index is merged to one segment at
the end, which also expunges the deleted documents: BM25's statistics (document count, average
length, document frequencies) are then those of an index built from scratch."""
from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa

from tasks.bm25.index import _parse_args, count_index_docs, passage_contents
from tasks.bm25.jvm import ensure_jvm
from tasks.progress import with_progress

# The IndexCollection arguments the index was built with (tasks/bm25/index.py): the analyzer and
# the generator come from the same parsed arguments.
_ARGS = ["-collection", "JsonCollection", "-generator", "DefaultLuceneDocumentGenerator", "-input", ".", "-index", "."]
_DELETE_BATCH = 1024


def update_bm25_index(previous_dir: Path, out_dir: Path, delete: pa.Array, add: pa.Table) -> dict:
    """Copy the index at `previous_dir` to `out_dir`, delete the documents whose id is in `delete`,
    add the passages of `add` (pid, title, text), merge to one segment. Raises RuntimeError when
    the result does not hold the expected number of documents."""
    ensure_jvm()
    from jnius import JavaException, autoclass

    previous_dir, out_dir = Path(previous_dir), Path(out_dir)
    before = count_index_docs(previous_dir)
    shutil.copytree(previous_dir, out_dir)
    (out_dir / "write.lock").unlink(missing_ok=True)  # the previous writer's lock file, not a held lock

    args = _parse_args("io.anserini.index.IndexCollection$Args", _ARGS)
    analyzer = autoclass("io.anserini.analysis.DefaultEnglishAnalyzer").fromArguments(
        args.stemmer, args.keepStopwords, args.stopwords)
    generator = autoclass("io.anserini.index.generator.DefaultLuceneDocumentGenerator")(args)
    JsonDocument = autoclass("io.anserini.collection.JsonCollection$Document")
    ArrayList, BytesRef = autoclass("java.util.ArrayList"), autoclass("org.apache.lucene.util.BytesRef")
    TermInSetQuery = autoclass("org.apache.lucene.search.TermInSetQuery")
    config = autoclass("org.apache.lucene.index.IndexWriterConfig")(analyzer)
    config.setOpenMode(autoclass("org.apache.lucene.index.IndexWriterConfig$OpenMode").APPEND)
    config.setSimilarity(autoclass("org.apache.lucene.search.similarities.BM25Similarity")())
    directory = autoclass("org.apache.lucene.store.FSDirectory").open(
        autoclass("java.nio.file.Paths").get(str(out_dir)))
    writer = autoclass("org.apache.lucene.index.IndexWriter")(directory, config)
    deleted = delete.to_pylist()
    try:
        for start in range(0, len(deleted), _DELETE_BATCH):
            # One query per batch of ids (pyjnius cannot pick the Term... overload of deleteDocuments).
            ids = ArrayList()
            for pid in deleted[start:start + _DELETE_BATCH]:
                ids.add(BytesRef(str(pid).encode("utf-8")))
            writer.deleteDocuments(TermInSetQuery("id", ids))
        rows = zip(add.column("pid").to_pylist(), add.column("title").to_pylist(), add.column("text").to_pylist())
        for pid, title, text in with_progress(rows, "refresh: BM25 documents added", every=10_000, total=add.num_rows):
            document = JsonDocument.fromFields(str(pid), passage_contents(title, text))
            writer.addDocument(generator.createDocument(document))
        writer.forceMerge(1)  # one segment, as IndexCollection -optimize leaves it; deletes expunged
        writer.commit()
    except JavaException as exc:
        writer.rollback()
        raise RuntimeError(f"updating the BM25 index {out_dir} failed: {exc}") from exc
    finally:
        if writer.isOpen():
            writer.close()
        directory.close()
    after = count_index_docs(out_dir)
    expected = before - len(deleted) + add.num_rows
    if after != expected:
        raise RuntimeError(f"the updated BM25 index holds {after:,} documents; expected {expected:,} "
                           f"({before:,} - {len(deleted):,} deleted + {add.num_rows:,} added): an id to delete "
                           "was not in the index")
    return {"documents": after, "before": before, "deleted": len(deleted), "added": add.num_rows}
