"""FAISS index memory and search speed, exact flat vs IVF-PQ (the scale plan's index choice), built
by the pipeline's own `tasks.compute.faiss_index.build_index`, same vectors, same queries, same run.

    .venv/bin/python benchmarks/index_memory.py [--sizes 50000,200000] [--dim 768] [--queries 500] \
        [--k 100] [--nprobe 16] [--threads 2] [--repeat 5] [--out r.json]

Data: a seeded Gaussian mixture (`--clusters` centres, unit vectors; real embeddings cluster, and
uniform random vectors would make any inverted file look worse than it is), the queries drawn
from the same mixture. Memory: the serialized index size (what the index artifact stores and
what search holds in RAM), with bytes per vector. Search: queries/s, the two kinds alternated
(benchmarks/timing.py protocol). Recall@k: the share of the flat index's top-k that IVF-PQ finds.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import reporting  # noqa: E402
import timing  # noqa: E402


def mixture(n: int, dim: int, clusters: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim)).astype(np.float32)
    x = centres[rng.integers(0, clusters, n)] + 0.6 * rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="50000,200000")
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--clusters", type=int, default=1000)
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--nprobe", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    timing.add_repeat_argument(ap, what="searches of all the queries per index")
    ap.add_argument("--out")
    args = ap.parse_args(argv)

    import faiss

    from tasks.compute.faiss_index import build_index, default_nlist, default_pq_m

    faiss.omp_set_num_threads(args.threads)
    rows = []
    queries = mixture(args.queries, args.dim, args.clusters, seed=1)
    print(reporting.header("FAISS index memory and speed: flat vs IVF-PQ", __file__, argv))
    print(f"dim {args.dim}, {args.clusters}-centre Gaussian mixture, "
          f"{args.queries} queries, k {args.k}, nprobe {args.nprobe}, faiss {faiss.__version__}, threads {args.threads}, "
          f"os.cpu_count() {os.cpu_count()}")
    print(timing.protocol_line(args.repeat, ["flat", "ivfpq"]) + "\n")
    for n in (int(s) for s in args.sizes.split(",")):
        x = mixture(n, args.dim, args.clusters, seed=0)
        built, build_s = {}, {}
        for kind in ("flat", "ivfpq"):
            t = time.perf_counter()
            built[kind] = build_index(x, kind=kind, nprobe=args.nprobe)
            build_s[kind] = time.perf_counter() - t
        del x
        found = {kind: index.search(queries, args.k)[1] for kind, index in built.items()}  # warm-up too
        seconds, _ = timing.alternate({k: (lambda r, i=i: i.search(queries, args.k)) for k, i in built.items()},
                                      args.repeat)
        summaries = {k: timing.summarize(timing.rates(len(queries), s)) for k, s in seconds.items()}
        recall = float(np.mean([len(set(a) & set(b)) / args.k for a, b in zip(found["flat"], found["ivfpq"])]))
        speed = timing.ratio(summaries["ivfpq"], summaries["flat"])
        sizes = {k: len(faiss.serialize_index(i)) for k, i in built.items()}
        row = {"n": n, "dim": args.dim, "nlist": default_nlist(n), "pq_m": default_pq_m(args.dim),
               "bytes": sizes, "bytes_per_vector": {k: v / n for k, v in sizes.items()}, "build_s": build_s,
               "qps": {k: s.values for k, s in summaries.items()}, "recall_at_k": recall,
               "ivfpq_vs_flat_speed": {"median": speed.median, "lo": speed.lo, "hi": speed.hi, "parity": speed.parity}}
        rows.append(row)
        print(reporting.markdown_table(
            ["passages", "index", "MB", "bytes/vector", "build s", "queries/s median (range)", "recall@k vs flat"],
            [[f"{n:,}", kind, f"{sizes[kind] / 1e6:,.1f}", f"{sizes[kind] / n:,.1f}", f"{build_s[kind]:.1f}",
              f"{summaries[kind].median:,.0f} ({summaries[kind].lo:,.0f}-{summaries[kind].hi:,.0f})",
              "1.000" if kind == "flat" else f"{recall:.3f}"] for kind in ("flat", "ivfpq")], numeric_from=2))
        print(f"\nIVF-PQ (nlist {row['nlist']}, pq_m {row['pq_m']}, 8 bits) / flat search speed: {speed.median:.2f}x "
              f"({speed.lo:.2f}-{speed.hi:.2f}x){', parity' if speed.parity else ''}\n")
        del built
    if args.out:
        reporting.write_json(Path(args.out), rows, indent=1)
    return rows


if __name__ == "__main__":
    main()
