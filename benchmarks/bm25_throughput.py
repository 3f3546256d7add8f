"""BM25 throughput and quality: Lucene (Anserini index, in-process batch search) vs bm25s, same run.

    python benchmarks/bm25_throughput.py --passages PASSAGES.parquet --questions QUESTIONS.parquet \
        --k 100 --threads 2 [--out results.json]

Without --passages/--questions it builds its own corpus from SQuAD dev (--squad, default
../shared/data/squad/dev-v1.1-partial.json): every paragraph's context cut into 100-word chunks,
titled with the article; questions with their answer strings.

For both systems on the same passages and questions it measures: index build time, batch search
throughput end to end (query text in, a RUNS pyarrow table out, i.e. including reading the results
into Python), and top-20 answer accuracy (DPR has_answer). Both use k1=0.9, b=0.4; bm25s uses the
PyStemmer English stemmer, English stopwords and method='lucene'. JVM start is timed on its own and
reported beside (never inside) the search times. Searches run --repeat times; the first (cold) and
the best of the rest (warm) are reported.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from _bootstrap import DEFAULT_SQUAD  # noqa: E402  (puts the project on sys.path)

from tasks.schemas import RUNS  # noqa: E402

K1, B = 0.9, 0.4


# --------------------------------------------------------------------------- answer check
def load_has_answer():
    """(callable, source): the project's DPR matcher, else a flagged normalized-substring fallback."""
    try:
        from tasks.evaluation.has_answer import has_answer

        return has_answer, "tasks.evaluation.has_answer (DPR tokens)"
    except ImportError:
        import unicodedata

        def _norm(s: str) -> str:
            s = unicodedata.normalize("NFD", s or "").lower()
            s = re.sub(r"[^\w\s]", " ", s)
            return " " + " ".join(s.split()) + " "

        def has_answer(answers, text):
            t = _norm(text)
            return any(_norm(a).strip() and _norm(a) in t for a in answers)

        return has_answer, "FALLBACK normalized substring (tasks.evaluation.has_answer missing)"


# --------------------------------------------------------------------------- inputs
def squad_corpus(path: Path, words: int = 100) -> tuple[pa.Table, pa.Table]:
    """Passages (paragraph contexts in `words`-word chunks) and questions from a SQuAD json."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))["data"]
    pids, titles, texts, qids, questions, answers = [], [], [], [], [], []
    for a_i, article in enumerate(data):
        title = article["title"].replace("_", " ")
        for p_i, para in enumerate(article["paragraphs"]):
            toks = para["context"].split()
            for c_i in range(0, max(len(toks), 1), words):
                pids.append(f"squad-{a_i}-{p_i}-{c_i // words}")
                titles.append(title)
                texts.append(" ".join(toks[c_i:c_i + words]))
            for qa in para["qas"]:
                qids.append(qa["id"])
                questions.append(qa["question"])
                answers.append(sorted({x["text"] for x in qa["answers"]}))
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
def run_lucene(passages, queries, k, threads, workdir: Path, repeat: int) -> dict:
    t0 = time.perf_counter()
    from tasks.bm25.jvm import ensure_jvm

    ensure_jvm()
    jvm_s = time.perf_counter() - t0
    from tasks.bm25.index import build_bm25_index
    from tasks.bm25.search import bm25_search

    index_dir = workdir / "lucene-index"
    stats = build_bm25_index(passages, index_dir, threads=threads)
    times, parts, runs = [], [], None
    for _ in range(repeat):
        timing: dict = {}
        t = time.perf_counter()
        runs = bm25_search(index_dir, queries, k=k, k1=K1, b=B, threads=threads, system="lucene",
                           timings=timing)
        times.append(time.perf_counter() - t)
        parts.append(timing)
    best = int(np.argmin(times[1:])) + 1 if len(times) > 1 else 0
    return {"system": "lucene (Anserini index, forge.BatchSearch)", "jvm_start_s": jvm_s,
            "index_s": stats["seconds"], "index_stats": stats, "search_s": times,
            "search_parts": parts[best], "runs": runs, "best": best}


def run_bm25s(passages, queries, k, threads, repeat: int) -> dict:
    import bm25s
    import Stemmer

    stemmer = Stemmer.Stemmer("english")
    titles = passages.column("title").to_pylist()
    texts = passages.column("text").to_pylist()
    pids = passages.column("pid").combine_chunks()
    corpus = [f"{t}\n{x}" if t else x for t, x in zip(titles, texts)]
    t = time.perf_counter()
    tokens = bm25s.tokenize(corpus, stopwords="en", stemmer=stemmer, show_progress=False)
    retriever = bm25s.BM25(k1=K1, b=B, method="lucene")
    retriever.index(tokens, show_progress=False)
    index_s = time.perf_counter() - t
    qids = pa.array([q for q, _ in queries], pa.string())
    texts_q = [x for _, x in queries]
    kk = min(k, len(corpus))
    times, runs = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        q_tokens = bm25s.tokenize(texts_q, stopwords="en", stemmer=stemmer, show_progress=False)
        docs, scores = retriever.retrieve(q_tokens, k=kk, n_threads=threads, show_progress=False)
        # Into Python as the same RUNS table Lucene gives (zero-score hits dropped: no match).
        n = len(texts_q)
        keep = (scores > 0).ravel()
        qi = np.repeat(np.arange(n), kk)[keep]
        ranks = np.tile(np.arange(1, kk + 1, dtype=np.int32), n)[keep]
        runs = pa.Table.from_arrays(
            [qids.take(pa.array(qi)), pids.take(pa.array(docs.ravel()[keep])), pa.array(ranks),
             pa.array(scores.ravel()[keep].astype(np.float32)),
             pa.repeat(pa.scalar("bm25s", pa.string()), int(keep.sum()))], schema=RUNS)
        times.append(time.perf_counter() - t)
    best = int(np.argmin(times[1:])) + 1 if len(times) > 1 else 0
    return {"system": f"bm25s {bm25s.__version__} (numpy, method=lucene)", "jvm_start_s": None,
            "index_s": index_s, "search_s": times, "runs": runs, "best": best}


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
    ap.add_argument("--repeat", type=int, default=3, help="search runs per system (first = cold)")
    ap.add_argument("--accuracy-k", type=int, default=20)
    ap.add_argument("--systems", default="lucene,bm25s")
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    passages, questions, source = load_inputs(args)
    queries = list(zip(questions.column("qid").to_pylist(), questions.column("question").to_pylist()))
    has_answer, has_answer_src = load_has_answer()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pforge-bm25-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)

    results = []
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    for name in systems:
        if name == "lucene":
            r = run_lucene(passages, queries, args.k, args.threads, workdir, args.repeat)
        elif name == "bm25s":
            r = run_bm25s(passages, queries, args.k, args.threads, args.repeat)
        else:
            raise SystemExit(f"unknown system {name}")
        runs = r.pop("runs")
        r["rows"] = runs.num_rows
        r["qps_cold"] = len(queries) / r["search_s"][0]
        r["qps_warm"] = len(queries) / r["search_s"][r["best"]]
        r[f"top{args.accuracy_k}_accuracy"] = top_k_accuracy(runs, questions, passages, has_answer,
                                                             args.accuracy_k)
        if r.get("jvm_start_s") is not None:
            r["qps_cold_with_jvm_start"] = len(queries) / (r["search_s"][0] + r["jvm_start_s"])
        results.append(r)

    out = {
        "source": source, "passages": passages.num_rows, "questions": len(queries), "k": args.k,
        "threads": args.threads, "k1": K1, "b": B, "has_answer": has_answer_src,
        "cpus": os.cpu_count(), "python": platform.python_version(), "systems": results,
    }
    by = {r["system"].split()[0]: r for r in results}
    if "lucene" in by and "bm25s" in by:
        out["qps_ratio_lucene_over_bm25s_warm"] = by["lucene"]["qps_warm"] / by["bm25s"]["qps_warm"]
        out["qps_ratio_lucene_over_bm25s_cold"] = by["lucene"]["qps_cold"] / by["bm25s"]["qps_cold"]

    acc = f"top{args.accuracy_k}_accuracy"
    print(f"\nBM25 throughput: {out['passages']:,} passages, {out['questions']:,} questions, "
          f"top-{args.k}, {args.threads} threads, k1={K1} b={B} ({source})")
    print(f"answer check: {has_answer_src}\n")
    print(f"| system | index build s | search s (warm) | q/s warm | q/s cold | JVM start s | {acc} |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        jvm = f"{r['jvm_start_s']:.2f}" if r.get("jvm_start_s") is not None else "-"
        print(f"| {r['system']} | {r['index_s']:.2f} | {r['search_s'][r['best']]:.3f} | "
              f"{r['qps_warm']:,.0f} | {r['qps_cold']:,.0f} | {jvm} | {r[acc]:.4f} |")
    if "qps_ratio_lucene_over_bm25s_warm" in out:
        print(f"\nq/s ratio lucene / bm25s: warm {out['qps_ratio_lucene_over_bm25s_warm']:.2f}x, "
              f"cold {out['qps_ratio_lucene_over_bm25s_cold']:.2f}x")
    if "lucene" in by:
        parts = by["lucene"]["search_parts"]
        print("lucene warm search split: " + ", ".join(f"{k} {v:.3f}s" for k, v in parts.items()))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2, default=str))
        print(f"\nwrote {args.out}")
    return out


if __name__ == "__main__":
    main()
