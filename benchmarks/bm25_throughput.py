"""BM25 throughput and quality: Lucene (Anserini index, in-process batch search) vs bm25s, same run.

    python benchmarks/bm25_throughput.py --passages PASSAGES.parquet --questions QUESTIONS.parquet \
        --k 100 --threads 2 [--repeat 5] [--out results.json]

Without --passages/--questions it builds its own corpus from SQuAD dev (--squad, default
../shared/data/squad/dev-v1.1-partial.json): every paragraph's context cut into 100-word chunks,
titled with the article; questions with their answer strings.

For both systems on the same passages and questions it measures: index build time, batch search
throughput end to end (query text in, a RUNS pyarrow table out, i.e. including reading the results
into Python), and top-20 answer accuracy (DPR has_answer). Both use k1=0.9, b=0.4; bm25s uses the
PyStemmer English stemmer, English stopwords and method='lucene'.

Timing (benchmarks/timing.py): each system first builds its index and searches all the questions
once (warm-ups, the first in the process); then the index is built --repeat times per system, then
all the questions are searched --repeat times per system, alternated with the order swapped each
repeat. Reported: median (min-max) per system and the ratio of medians with its range, "parity"
where the ranges overlap. The first build and search are shown on their own, one measurement per
system and no ratio: Lucene's include the JVM JIT's warm-up, bm25s (numpy) has none, so they are
not peers (the pipeline searches once per process, so its BM25 stage pays Lucene's warm-up).
JVM start is timed once and reported beside (never inside) the search times.
"""
from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from _bootstrap import DEFAULT_SQUAD  # noqa: E402  (puts the project on sys.path)
import reporting  # noqa: E402
import timing  # noqa: E402
from _shared import load_has_answer, squad_articles  # noqa: E402

from tasks.schemas import RUNS  # noqa: E402

K1, B = 0.9, 0.4


# --------------------------------------------------------------------------- inputs
def squad_corpus(path: Path, words: int = 100) -> tuple[pa.Table, pa.Table]:
    """Passages (paragraph contexts in `words`-word chunks) and questions from a SQuAD json."""
    pids, titles, texts, qids, questions, answers = [], [], [], [], [], []
    for a_i, article in enumerate(squad_articles(path)):
        for p_i, para in enumerate(article.paragraphs):
            toks = para.context.split()
            for c_i in range(0, max(len(toks), 1), words):
                pids.append(f"squad-{a_i}-{p_i}-{c_i // words}")
                titles.append(article.title)
                texts.append(" ".join(toks[c_i:c_i + words]))
            for q in para.questions:
                qids.append(q["qid"])
                questions.append(q["question"])
                answers.append(sorted(q["answers"]))
    passages = pa.table({"pid": pids, "title": titles, "text": texts})
    qs = pa.table({"qid": qids, "question": questions, "answers": answers})
    return passages, qs


def load_inputs(args) -> tuple[pa.Table, pa.Table, str]:
    if args.passages and args.questions:
        passages = pq.read_table(args.passages, columns=["pid", "title", "text"])
        questions = pq.read_table(args.questions, columns=["qid", "question", "answers"])
        return passages, questions, f"{args.passages} + {args.questions}"
    if args.passages or args.questions:
        raise SystemExit("give both --passages and --questions, or neither (SQuAD fallback)")
    passages, questions = squad_corpus(Path(args.squad))
    return passages, questions, f"SQuAD {args.squad} (paragraphs in 100-word chunks)"


# --------------------------------------------------------------------------- systems
class Lucene:
    """Anserini's index and the in-process forge.BatchSearch (tasks.bm25)."""

    name = "lucene (Anserini index, forge.BatchSearch)"

    def __init__(self, passages, queries, k, threads, workdir: Path):
        t0 = time.perf_counter()
        from tasks.bm25.jvm import ensure_jvm

        ensure_jvm()
        self.jvm_start_s = time.perf_counter() - t0
        self.passages, self.queries, self.k, self.threads = passages, queries, k, threads
        self.index_dir = workdir / "lucene-index"
        self.stats: dict = {}
        self.parts: list[dict] = []

    def build(self, _repeat: int) -> None:
        from tasks.bm25.index import build_bm25_index

        self.stats = build_bm25_index(self.passages, self.index_dir, threads=self.threads)  # replaces it

    def search(self, _repeat: int) -> pa.Table:
        from tasks.bm25.search import bm25_search

        parts: dict = {}
        runs = bm25_search(self.index_dir, self.queries, k=self.k, k1=K1, b=B, threads=self.threads,
                           system="lucene", timings=parts)
        self.parts.append(parts)
        return runs


class BM25s:
    """bm25s (numpy backend, method='lucene'), with the results read into the same RUNS table."""

    def __init__(self, passages, queries, k, threads):
        import bm25s
        import Stemmer

        self.bm25s, self.stemmer = bm25s, Stemmer.Stemmer("english")
        self.name = f"bm25s {bm25s.__version__} (numpy, method=lucene)"
        self.jvm_start_s = None
        titles = passages.column("title").to_pylist()
        self.corpus = [f"{t}\n{x}" if t else x for t, x in zip(titles, passages.column("text").to_pylist())]
        self.pids = passages.column("pid").combine_chunks()
        self.qids = pa.array([q for q, _ in queries], pa.string())
        self.texts_q = [x for _, x in queries]
        self.k, self.threads = min(k, len(self.corpus)), threads
        self.retriever = None

    def build(self, _repeat: int) -> None:
        tokens = self.bm25s.tokenize(self.corpus, stopwords="en", stemmer=self.stemmer, show_progress=False)
        self.retriever = self.bm25s.BM25(k1=K1, b=B, method="lucene")
        self.retriever.index(tokens, show_progress=False)

    def search(self, _repeat: int) -> pa.Table:
        kk, n = self.k, len(self.texts_q)
        q_tokens = self.bm25s.tokenize(self.texts_q, stopwords="en", stemmer=self.stemmer, show_progress=False)
        docs, scores = self.retriever.retrieve(q_tokens, k=kk, n_threads=self.threads, show_progress=False)
        # Into Python as the same RUNS table Lucene gives (zero-score hits dropped: no match).
        keep = (scores > 0).ravel()
        qi = np.repeat(np.arange(n), kk)[keep]
        ranks = np.tile(np.arange(1, kk + 1, dtype=np.int32), n)[keep]
        return pa.Table.from_arrays(
            [self.qids.take(pa.array(qi)), self.pids.take(pa.array(docs.ravel()[keep])), pa.array(ranks),
             pa.array(scores.ravel()[keep].astype(np.float32)),
             pa.repeat(pa.scalar("bm25s", pa.string()), int(keep.sum()))], schema=RUNS)


# --------------------------------------------------------------------------- quality
def top_k_accuracy(runs: pa.Table, questions: pa.Table, passages: pa.Table, has_answer, k=20) -> float:
    text_of = dict(zip(passages.column("pid").to_pylist(),
                       (f"{t}\n{x}" if t else x for t, x in zip(passages.column("title").to_pylist(),
                                                            passages.column("text").to_pylist()))))
    answers = dict(zip(questions.column("qid").to_pylist(), questions.column("answers").to_pylist()))
    top = runs.filter(pa.compute.less_equal(runs.column("rank"), k))
    hit = set()
    # DPR matches on the passage text; title + text here as both systems index both.
    for qid, pid in zip(top.column("qid").to_pylist(), top.column("pid").to_pylist()):
        if qid not in hit and has_answer(answers[qid], text_of[pid]):
            hit.add(qid)
    return len(hit) / max(1, len(answers))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passages", type=Path)
    ap.add_argument("--questions", type=Path)
    ap.add_argument("--squad", type=Path, default=DEFAULT_SQUAD)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    timing.add_repeat_argument(ap, what="index builds and searches of all the questions per system")
    ap.add_argument("--accuracy-k", type=int, default=20)
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    passages, questions, source = load_inputs(args)
    queries = list(zip(questions.column("qid").to_pylist(), questions.column("question").to_pylist()))
    has_answer, has_answer_src = load_has_answer()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pforge-bm25-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)

    systems = {"lucene": Lucene(passages, queries, args.k, args.threads, workdir),
               "bm25s": BM25s(passages, queries, args.k, args.threads)}
    first_build_s, first_s = {}, {}
    for key, system in systems.items():  # first build and search in the process: warm-ups, shown apart
        t = time.perf_counter()
        system.build(-1)
        first_build_s[key] = time.perf_counter() - t
        t = time.perf_counter()
        system.search(-1)
        first_s[key] = time.perf_counter() - t
    build_s, _ = timing.alternate({key: s.build for key, s in systems.items()}, args.repeat)
    search_s, runs = timing.alternate({key: s.search for key, s in systems.items()}, args.repeat)

    n_q = len(queries)
    builds = {key: timing.summarize(v) for key, v in build_s.items()}
    qps = {key: timing.summarize(timing.rates(n_q, v)) for key, v in search_s.items()}
    acc = f"top{args.accuracy_k}_accuracy"
    results = []
    for key, system in systems.items():
        results.append({
            "system": system.name, "jvm_start_s": system.jvm_start_s, "index_s": build_s[key],
            "search_s": search_s[key], "first_index_s": first_build_s[key], "first_search_s": first_s[key],
            "qps": qps[key].values,
            "qps_median": qps[key].median, "first_search_qps": n_q / first_s[key], "rows": runs[key].num_rows,
            acc: top_k_accuracy(runs[key], questions, passages, has_answer, args.accuracy_k)})
    qps_ratio = timing.ratio(qps["lucene"], qps["bm25s"])
    build_ratio = timing.ratio(builds["lucene"], builds["bm25s"])
    out = {
        "source": source, "passages": passages.num_rows, "questions": n_q, "k": args.k,
        "threads": args.threads, "k1": K1, "b": B, "has_answer": has_answer_src, "repeat": args.repeat,
        "cpus": os.cpu_count(), "python": platform.python_version(), "systems": results,
        "qps_ratio_lucene_over_bm25s": vars(qps_ratio), "index_s_ratio_lucene_over_bm25s": vars(build_ratio),
        "lucene_index_stats": systems["lucene"].stats,
    }

    print("\n" + reporting.header("BM25 throughput: Lucene vs bm25s", __file__, argv))
    print(f"BM25 throughput: {out['passages']:,} passages, {n_q:,} questions, "
          f"top-{args.k}, {args.threads} threads, k1={K1} b={B} ({source}); os.cpu_count() {os.cpu_count()}")
    print(timing.protocol_line(args.repeat, list(systems)))
    print(f"answer check: {has_answer_src}\n")
    rows = []
    for key, r in zip(systems, results):
        jvm = f"{r['jvm_start_s']:.2f}" if r["jvm_start_s"] is not None else "-"
        rows.append([r["system"], timing.fmt_summary(builds[key], ".2f"), timing.fmt_summary(qps[key], ",.0f"),
                     f"{r['first_index_s']:.2f} s, {r['first_search_qps']:,.0f} q/s", jvm, f"{r[acc]:.4f}"])
    rows.append(["ratio lucene / bm25s", timing.fmt_ratio(build_ratio) + " (time)",
                 timing.fmt_ratio(qps_ratio) + " (q/s)", "no ratio: not peers", "", ""])
    print(reporting.markdown_table(["system", "index build s median (range)", "q/s median (range)",
                                 "first build, first search (one run each)", "JVM start s", acc], rows))
    print("\nfirst build / first search: the first in the process, untimed warm-ups measured once per system "
          "and not compared: Lucene's include the JVM JIT's warm-up, bm25s (numpy) has none.")
    print("per-repeat search seconds: " + "; ".join(
        f"{k} " + ", ".join(f"{s:.3f}" for s in v) for k, v in search_s.items()))
    parts = systems["lucene"].parts[-1]
    print("lucene last search split: " + ", ".join(f"{k} {v:.3f}s" for k, v in parts.items()))
    if args.out:
        print(f"\nwrote {reporting.write_json(args.out, out)}")
    return out


if __name__ == "__main__":
    main()
