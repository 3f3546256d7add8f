"""Batch BM25 search with Anserini's own multi-threaded SearchCollection, inside this process's JVM.

pyserini's ``LuceneSearcher.batch_search`` moves every hit through JNI (about 6 s per million hits
here); SearchCollection instead searches all topics on its own thread pool and writes one run file,
which pyarrow reads back in bulk. Flags used (checked against ``SearchCollection -options`` of
anserini 1.7.1):

    -index INDEX -topics TOPICS.tsv -topicReader TsvInt -output RUN.trec -format trec
    -bm25 -bm25.k1 K1 -bm25.b B -hits K -threads N -parallelism 1 -quiet

Topics are written with their position in ``queries`` as an integer id (``TsvInt``), so any qid
string survives and the run comes back in input order; the real qids are restored from that
position. Score ties are broken as Anserini does by default (by docid).
"""
from __future__ import annotations

import logging
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from tasks.bm25.jvm import ensure_jvm
from tasks.schemas import RUNS

logger = logging.getLogger("passage_forge")
_WS = re.compile(r"[\t\r\n\x0b\x0c\x85\u2028\u2029]+")


def empty_runs() -> pa.Table:
    return RUNS.empty_table()


def _sanitize(text: str | None) -> str:
    return _WS.sub(" ", text or "").strip()


def max_clauses() -> int:
    """Lucene's limit on a query's clauses (1024 unless raised): BM25's bag-of-words query has one
    clause per distinct analysed term, and one more makes Lucene throw TooManyClauses."""
    from jnius import autoclass

    return int(autoclass("org.apache.lucene.search.IndexSearcher").getMaxClauseCount())


def _distinct_terms(text: str) -> int:
    from jnius import autoclass

    analyzer = autoclass("io.anserini.analysis.DefaultEnglishAnalyzer").newDefaultInstance()
    return len(set(autoclass("io.anserini.analysis.AnalyzerUtils").analyze(analyzer, text).toArray()))


def fit_clause_limit(text: str, limit: int) -> str:
    """`text`, or its longest prefix of whole words whose distinct analysed terms fit in `limit`
    (a single over-long word is cut by characters). Each term comes from at least one character,
    so a text of at most `limit` characters fits without asking the analyzer."""
    if len(text) <= limit or _distinct_terms(text) <= limit:
        return text
    words = text.split()
    if _distinct_terms(words[0]) > limit:
        words, joiner = list(words[0]), ""  # no space to cut at (e.g. CJK): cut between characters
    else:
        joiner = " "
    lo, hi = 1, len(words) - 1  # words[:lo] fits; words[:hi + 1] does not
    while lo < hi:  # the prefix's distinct terms grow with its length: bisect
        mid = (lo + hi + 1) // 2
        if _distinct_terms(joiner.join(words[:mid])) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return joiner.join(words[:lo])


def _within_clause_limit(queries: list[tuple[str, str]]) -> list[tuple[str, str]]:
    limit = max_clauses()
    long = [i for i, (_, text) in enumerate(queries) if len(_sanitize(text)) > limit]
    if not long:  # the common case: no question is long enough to reach the limit
        return queries
    out = list(queries)
    for i in long:
        qid, text = queries[i]
        clean = _sanitize(text)
        cut = fit_clause_limit(clean, limit)
        if cut != clean:
            logger.warning("bm25: question %s has more distinct terms than Lucene's %d clauses: searching its first "
                           "%d of %d characters", qid, limit, len(cut), len(clean))
            out[i] = (qid, cut)
    return out


def write_topics(queries: Sequence[tuple[str, str]], path: Path) -> int:
    """Write ``position \\t text`` lines; queries with empty text are left out (no hits anyway)."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for i, (_qid, text) in enumerate(queries):
            clean = _sanitize(text)
            if clean:
                f.write(f"{i}\t{clean}\n")
                n += 1
    return n


def read_trec_run(path: Path) -> pa.Table:
    """Read a TREC run file (qid Q0 docid rank score tag) as columns qidx, pid, rank, score."""
    if path.stat().st_size == 0:
        return pa.table({"qidx": pa.array([], pa.int64()), "pid": pa.array([], pa.string()),
                         "rank": pa.array([], pa.int32()), "score": pa.array([], pa.float32())})
    names = ["qidx", "q0", "pid", "rank", "score", "tag"]
    return pacsv.read_csv(
        path,
        read_options=pacsv.ReadOptions(column_names=names, block_size=16 << 20, use_threads=True),
        parse_options=pacsv.ParseOptions(delimiter=" ", quote_char=False, double_quote=False),
        convert_options=pacsv.ConvertOptions(
            column_types={"qidx": pa.int64(), "pid": pa.string(), "rank": pa.int32(),
                          "score": pa.float32()},
            include_columns=["qidx", "pid", "rank", "score"],
            strings_can_be_null=False, quoted_strings_can_be_null=False),
    )


def _run_search_collection(argv: list[str]) -> None:
    from jnius import JavaException, autoclass

    from tasks.bm25.index import _parse_args

    args = _parse_args("io.anserini.search.SearchCollection$Args", argv)
    try:
        searcher = autoclass("io.anserini.search.SearchCollection")(args)
        try:
            searcher.run()
        finally:
            searcher.close()
    except JavaException as exc:
        raise RuntimeError(f"Anserini SearchCollection failed: {exc}") from exc


def _run_forge_batch_search(index_dir: Path, topics: Path, run_file: Path, k: int, k1: float, b: float,
                            threads: int) -> bool:
    """The project's batch searcher (tasks/bm25/java): ids from doc values, not stored fields.
    Returns False when its classes are not on the JVM's classpath (no javac at start-up)."""
    from jnius import JavaException, autoclass

    try:
        searcher = autoclass("forge.BatchSearch")
    except JavaException:
        return False
    try:
        searcher.run(str(index_dir), str(topics), str(run_file), int(k), float(k1), float(b), max(1, int(threads)))
    except JavaException as exc:
        raise RuntimeError(f"BM25 batch search over {index_dir} failed: {exc}") from exc
    return True


def bm25_search(index_dir: Path, queries: list[tuple[str, str]], k: int = 100, k1: float = 0.9,
                b: float = 0.4, threads: int = 2, system: str = "bm25",
                timings: dict | None = None) -> pa.Table:
    """Top-``k`` BM25 passages per query as a RUNS table (ranks 1..k, scores descending).

    Rows come in query order, then rank. Queries without hits have no rows. ``timings``, when
    given, receives write/search/read seconds.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    queries = list(queries)
    if not queries:
        return empty_runs()
    index_dir = Path(index_dir)
    if not index_dir.is_dir():
        raise FileNotFoundError(f"no BM25 index at {index_dir}")
    ensure_jvm()
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="pforge-bm25-search-"))
    try:
        topics = tmp / "topics.tsv"
        run_file = tmp / "run.trec"
        if write_topics(_within_clause_limit(queries), topics) == 0:
            return empty_runs()
        t1 = time.perf_counter()
        argv = ["-index", str(index_dir),
                "-topics", str(topics),
                "-topicReader", "TsvInt",
                "-output", str(run_file),
                "-format", "trec",
                "-bm25", "-bm25.k1", repr(float(k1)), "-bm25.b", repr(float(b)),
                "-hits", str(int(k)),
                "-threads", str(max(1, int(threads))),
                "-parallelism", "1",
                "-quiet"]
        if not _run_forge_batch_search(index_dir, topics, run_file, k, k1, b, threads):
            _run_search_collection(argv)
        if not run_file.exists():
            raise RuntimeError(f"Anserini SearchCollection wrote no run file for {index_dir}")
        t2 = time.perf_counter()
        raw = read_trec_run(run_file)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    qidx = raw.column("qidx").to_numpy()
    rank = raw.column("rank").to_numpy()
    # SearchCollection writes topics in id order, ranks ascending; sort only if it ever does not.
    if len(qidx) > 1:
        d_q = np.diff(qidx)
        if (d_q < 0).any() or ((d_q == 0) & (np.diff(rank) <= 0)).any():
            order = np.lexsort((rank, qidx))
            raw = raw.take(pa.array(order))
            qidx = raw.column("qidx").to_numpy()
    qids = pa.array([str(q) for q, _ in queries], pa.string())
    table = pa.Table.from_arrays(
        [qids.take(pa.array(qidx)),
         raw.column("pid"),
         raw.column("rank"),
         raw.column("score"),
         pa.repeat(pa.scalar(system, pa.string()), len(qidx))],
        schema=RUNS)
    if timings is not None:
        t3 = time.perf_counter()
        timings.update(write_seconds=t1 - t0, search_seconds=t2 - t1, read_seconds=t3 - t2,
                       seconds=t3 - t0)
    return table
