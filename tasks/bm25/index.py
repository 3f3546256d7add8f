"""Build a Lucene BM25 index over passages with Anserini's IndexCollection, inside this process's JVM.

Passages are written as Anserini JsonCollection files (``{"id": pid, "contents": title\\ntext}``),
one file per indexing thread, in a temporary folder, then indexed with:

    -collection JsonCollection -generator DefaultLuceneDocumentGenerator
    -input TMP -index INDEX_DIR -threads N -optimize -quiet

No ``-storeRaw``/``-storeContents``/``-storePositions``/``-storeDocvectors``: stored text would make
every search hit read it (halving search speed) and nothing downstream needs it; the passage text
lives in the passages table.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable

import pyarrow as pa
import pyarrow.compute as pc

from tasks.bm25.jvm import ensure_jvm


def _batches(passages: pa.Table | pa.RecordBatch | Iterable[pa.RecordBatch]) -> Iterable[pa.RecordBatch]:
    if isinstance(passages, pa.Table):
        yield from passages.to_batches(max_chunksize=65536)
    elif isinstance(passages, pa.RecordBatch):
        yield passages
    else:
        yield from passages


def passage_contents(title: str | None, text: str | None) -> str:
    """What a passage's Lucene document holds in its `contents` field: the title, then the text."""
    return f"{title}\n{text or ''}" if title else (text or "")


def write_json_collection(passages, folder: Path, n_files: int = 1,
                          progress: Callable[[int], None] | None = None) -> int:
    """Write passages as JsonCollection jsonl files (round-robin over ``n_files``); returns the count."""
    folder.mkdir(parents=True, exist_ok=True)
    n_files = max(1, n_files)
    files = [open(folder / f"part-{i:03d}.jsonl", "w", encoding="utf-8") for i in range(n_files)]
    dumps = json.JSONEncoder(ensure_ascii=False).encode
    count = 0
    try:
        for batch in _batches(passages):
            names = batch.schema.names
            for col in ("pid", "text"):
                if col not in names:
                    raise ValueError(f"passages need a {col!r} column; got {names}")
            pid_col = batch.column(names.index("pid")).cast(pa.string())
            if pid_col.null_count:
                raise ValueError("passage with a null pid")
            if pc.any(pc.match_substring_regex(pid_col, r"\s")).as_py():
                # Anserini's TREC run lines are space-separated: a pid with whitespace can't round-trip.
                raise ValueError("passage pids must not contain whitespace")
            pids = pid_col.to_pylist()
            texts = batch.column(names.index("text")).to_pylist()
            titles = (batch.column(names.index("title")).to_pylist() if "title" in names
                      else [None] * len(pids))
            lines = [dumps({"id": str(pid), "contents": passage_contents(title, text)})
                     for pid, title, text in zip(pids, titles, texts)]
            # Spread contiguous slices over the files so each indexing thread gets a share.
            step = -(-len(lines) // n_files) if lines else 0
            for i, f in enumerate(files):
                chunk = lines[i * step:(i + 1) * step]
                if chunk:
                    f.write("\n".join(chunk))
                    f.write("\n")
            count += len(lines)
            if progress is not None:
                progress(count)
    finally:
        for f in files:
            f.close()
    return count


def _parse_args(args_class: str, argv: list[str]):
    """Parse ``argv`` into an Anserini Args bean with args4j; raises ValueError on bad flags."""
    from jnius import JavaException, autoclass

    args = autoclass(args_class)()
    parser = autoclass("org.kohsuke.args4j.CmdLineParser")(args)
    jargv = autoclass("java.util.ArrayList")()
    for a in argv:
        jargv.add(str(a))
    try:
        parser.parseArgument(jargv)
    except JavaException as exc:
        raise ValueError(f"Anserini rejected arguments {argv}: {exc}") from exc
    return args


def count_index_docs(index_dir: Path) -> int:
    """Number of live documents in a Lucene index folder."""
    ensure_jvm()
    from jnius import autoclass

    paths = autoclass("java.nio.file.Paths")
    fs_dir = autoclass("org.apache.lucene.store.FSDirectory").open(paths.get(str(index_dir)))
    reader = autoclass("org.apache.lucene.index.DirectoryReader").open(fs_dir)
    try:
        return int(reader.numDocs())
    finally:
        reader.close()
        fs_dir.close()


def build_bm25_index(passages, index_dir: Path, threads: int = 2,
                     progress: Callable[[int], None] | None = None) -> dict:
    """Index ``passages`` (pid, title, text) into ``index_dir`` (replaced if present).

    ``passages``: a pyarrow Table, a RecordBatch or an iterable of RecordBatches.
    ``progress``: called with the number of passages written so far.
    Returns stats: documents, empty, skipped, errors, write_seconds, index_seconds, seconds.
    Raises RuntimeError when the index does not hold exactly one document per input passage.
    """
    ensure_jvm()
    from jnius import JavaException, autoclass

    index_dir = Path(index_dir)
    threads = max(1, int(threads))
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="pforge-bm25-collection-"))
    try:
        n_input = write_json_collection(passages, tmp, n_files=threads, progress=progress)
        t1 = time.perf_counter()
        if index_dir.exists():
            shutil.rmtree(index_dir)
        index_dir.parent.mkdir(parents=True, exist_ok=True)
        argv = ["-collection", "JsonCollection",
                "-generator", "DefaultLuceneDocumentGenerator",
                "-input", str(tmp),
                "-index", str(index_dir),
                "-threads", str(threads),
                "-optimize",
                "-quiet"]
        args = _parse_args("io.anserini.index.IndexCollection$Args", argv)
        try:
            indexer = autoclass("io.anserini.index.IndexCollection")(args)
            indexer.run()
        except JavaException as exc:
            raise RuntimeError(f"Anserini IndexCollection failed: {exc}") from exc
        counters = indexer.getCounters()
        t2 = time.perf_counter()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    stats = {
        "documents": int(counters.indexed.get()),
        "input_passages": n_input,
        "empty": int(counters.empty.get()),
        "unindexable": int(counters.unindexable.get()),
        "skipped": int(counters.skipped.get()),
        "errors": int(counters.errors.get()),
        "write_seconds": t1 - t0,
        "index_seconds": t2 - t1,
        "seconds": t2 - t0,
        "threads": threads,
    }
    in_index = count_index_docs(index_dir) if n_input else 0
    stats["index_docs"] = in_index
    if stats["documents"] != n_input or in_index != n_input:
        raise RuntimeError(
            f"BM25 index holds {in_index} documents (indexer counted {stats['documents']}) for "
            f"{n_input} input passages (empty={stats['empty']}, skipped={stats['skipped']}, "
            f"unindexable={stats['unindexable']}, errors={stats['errors']})")
    return stats
