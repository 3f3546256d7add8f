"""Peak memory of exact dense top-k mining as the corpus grows: ours (tasks.negatives.blocked_topk
over shards streamed from the embeddings Parquet) vs faiss.IndexFlatIP holding all the vectors
(peer), same questions, same k, same file, same run.

    .venv/bin/python benchmarks/mining_memory.py [--sizes 10000,100000,1000000] [--queries 1000] \
        [--dim 384] [--k 100] [--rows 16384] [--query-block 1024] [--threads 2] [--dir /tmp] [--out r.json]

Data: random unit vectors (seeded), `--dim` wide. For each corpus size the passages are written
once, by a subprocess, as the pipeline's embeddings table (`embeddings_table`, float32, through
storage's `ParquetTableWriter`: zstd, 65,536-row row groups, 500,000-row part files) into a
temporary folder under `--dir`, deleted afterwards; the questions are a `.npy` beside it.

Systems, each run in a fresh subprocess per corpus size so that one's peak cannot leak into the
other's (peak = `resource.getrusage(RUSAGE_SELF).ru_maxrss`, Linux KB; both children import the
same modules (numpy, pyarrow, torch, faiss, the project) before anything is measured, and that
baseline is reported beside the peak). Linux carries ru_maxrss across fork + exec, so a child's
starts at its parent's peak: the parent here only starts processes and compares ids, and every
child also reports VmHWM (the peak of its own address space) as a cross-check.

- ours: `blocked_top_k(questions, iter_vector_shards(files, rows=--rows), k, --query-block)`;
- peer: `faiss.IndexFlatIP` filled from the same Parquet, read `--rows` rows at a time (its
  leanest load: the index then holds every vector, never a second copy), then `index.search`.

Seconds are each child's load-and-search time (reading the Parquet included), one run each: this
is a memory benchmark, not the alternated timing protocol of benchmarks/timing.py. Agreement:
the fraction of questions whose ranked top-k ids are identical in both, and the mean overlap of
the top-k id sets (float32 sums in a different order may swap near-equal scores).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import _bootstrap  # noqa: F401  (puts the project on sys.path)
import reporting  # noqa: E402

GENERATE_ROWS = 65_536  # vectors generated and written at a time


def _rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KB


def _hwm_mb() -> float:
    """VmHWM, the peak RSS of this address space (a cross-check: Linux keeps ru_maxrss across
    fork + exec, so a child's ru_maxrss starts at its parent's peak; the parent stays small)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def write_corpus(folder: Path, n: int, n_queries: int, dim: int, seed: int = 0) -> list[Path]:
    """The passages as an embeddings table (pids "0".."n-1") and the questions as queries.npy."""
    from storage.parquet import ParquetTableWriter
    from tasks.compute.embeddings import embeddings_table

    rng = np.random.default_rng(seed)
    np.save(folder / "queries.npy", _unit(rng, n_queries, dim))
    writer = None
    for start in range(0, n, GENERATE_ROWS):
        stop = min(start + GENERATE_ROWS, n)
        table = embeddings_table([str(i) for i in range(start, stop)], _unit(rng, stop - start, dim))
        writer = writer or ParquetTableWriter(folder, table.schema)
        writer.write_batch(table)
    writer.close()
    return sorted((folder / "data").glob("*.parquet"))


# --------------------------------------------------------------------------- children
def child(system: str, folder: Path, k: int, rows: int, query_block: int, threads: int) -> dict:
    """One system's run in this (fresh) process; prints nothing, returns the measurements."""
    import faiss
    import torch

    from tasks.negatives.blocked_topk import blocked_top_k, iter_vector_shards

    torch.set_num_threads(threads)
    faiss.omp_set_num_threads(threads)
    files = sorted((folder / "data").glob("*.parquet"))
    queries = np.load(folder / "queries.npy")
    baseline = _rss_mb()
    t = time.perf_counter()
    if system == "ours":
        top = blocked_top_k(queries, iter_vector_shards(files, rows), k=k, query_block=query_block)
        ids = np.array([[int(p) for p in row] for row in top.pids], dtype=np.int64)
    else:
        index = faiss.IndexFlatIP(queries.shape[1])
        for _, vectors in iter_vector_shards(files, rows):
            index.add(vectors)
        _, ids = index.search(queries, k)
    seconds = time.perf_counter() - t
    np.save(folder / f"ids_{system}.npy", ids)
    return {"system": system, "seconds": seconds, "baseline_mb": baseline, "peak_mb": _rss_mb(),
            "vmhwm_mb": _hwm_mb()}


def run_child(system: str, folder: Path, args, n: int = 0) -> dict:
    cmd = [sys.executable, __file__, "--child", system, "--data", str(folder), "--k", str(args.k),
           "--rows", str(args.rows), "--query-block", str(args.query_block), "--threads", str(args.threads),
           "--n", str(n), "--queries", str(args.queries), "--dim", str(args.dim)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{system} child failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def agreement(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(fraction of identical ranked rows, mean top-k set overlap)."""
    same = float(np.mean([np.array_equal(x, y) for x, y in zip(a, b)]))
    overlap = float(np.mean([len(set(x) & set(y)) / len(x) for x, y in zip(a, b)]))
    return same, overlap


# --------------------------------------------------------------------------- main
def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,1000000", help="corpus sizes, comma-separated")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--rows", type=int, default=16_384, help="passages per shard (ours) / per add (peer)")
    ap.add_argument("--query-block", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the temporary Parquet files go")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--child", choices=["write", "ours", "faiss"], help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child == "write":
        t = time.perf_counter()
        files = write_corpus(Path(args.data), args.n, args.queries, args.dim)
        print(json.dumps({"seconds": time.perf_counter() - t, "mb": sum(f.stat().st_size for f in files) / 2**20}))
        return {}
    if args.child:
        print(json.dumps(child(args.child, Path(args.data), args.k, args.rows, args.query_block, args.threads)))
        return {}

    # This process only starts the others and compares ids: it stays small (see _hwm_mb).
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    results = []
    for n in sizes:
        folder = Path(tempfile.mkdtemp(prefix=f"mining-memory-{n}-", dir=args.dir))
        try:
            written = run_child("write", folder, args, n)
            write_s, size_mb = written["seconds"], written["mb"]
            runs = {s: run_child(s, folder, args) for s in ("ours", "faiss")}
            same, overlap = agreement(np.load(folder / "ids_ours.npy"), np.load(folder / "ids_faiss.npy"))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        results.append({"passages": n, "write_s": write_s, "parquet_mb": size_mb, "runs": runs,
                        "identical_ranked": same, "set_overlap": overlap})
        print(f"[{n:,} passages: parquet {size_mb:,.0f} MB written in {write_s:.1f} s; "
              f"ours {runs['ours']['seconds']:.1f} s, faiss {runs['faiss']['seconds']:.1f} s]", file=sys.stderr)

    import faiss
    import pyarrow
    import torch

    print(reporting.header("Mining memory: blocked top-k over streamed shards (ours) vs faiss.IndexFlatIP (peer)",
                           __file__, argv))
    print(f"{args.queries:,} questions x N passages, random unit vectors, dim {args.dim}, exact inner-product "
          f"top-{args.k}; ours: shards of {args.rows:,} rows from the Parquet, query block {args.query_block}; "
          f"peer: IndexFlatIP filled {args.rows:,} rows at a time from the same Parquet, then one search. "
          f"Threads {args.threads} (torch, faiss); os.cpu_count() {os.cpu_count()}; "
          f"torch {torch.__version__}, faiss {faiss.__version__}, pyarrow {pyarrow.__version__}, numpy {np.__version__}")
    print("One fresh subprocess per system and size; peak = ru_maxrss; 'after imports' = that process's "
          "peak before the work (same imports in both); seconds = read + search, one run each.\n")
    rows = []
    for r in results:
        o, f = r["runs"]["ours"], r["runs"]["faiss"]
        rows.append([f"{r['passages']:,}", f"{r['parquet_mb']:,.0f}", f"{o['peak_mb']:,.0f}", f"{f['peak_mb']:,.0f}",
                     f"{o['peak_mb'] - o['baseline_mb']:,.0f}", f"{f['peak_mb'] - f['baseline_mb']:,.0f}",
                     f"{o['seconds']:.2f}", f"{f['seconds']:.2f}",
                     f"{r['identical_ranked']:.3f} / {r['set_overlap']:.4f}"])
    print(reporting.markdown_table(
        ["passages", "parquet MB", "ours peak MB", "peer peak MB", "ours over imports MB",
         "peer over imports MB", "ours s", "peer s", "id agreement (identical ranked / set overlap)"], rows))
    base = ", ".join(f"{r['runs']['ours']['baseline_mb']:,.0f}/{r['runs']['faiss']['baseline_mb']:,.0f}" for r in results)
    hwm = ", ".join(f"{r['runs']['ours']['vmhwm_mb']:,.0f}/{r['runs']['faiss']['vmhwm_mb']:,.0f}" for r in results)
    writes = ", ".join(f"{r['write_s']:.1f}" for r in results)
    print(f"\nafter-imports RSS MB (ours/peer) per size: {base}; cross-check, VmHWM MB (ours/peer): {hwm}; "
          f"Parquet write seconds per size (a separate process): {writes}")
    if args.out:
        reporting.write_json(Path(args.out), {"args": vars(args), "results": results})
    return {"results": results}


if __name__ == "__main__":
    main()
