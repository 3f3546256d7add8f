"""Chunking throughput (MB/s of document text) against a naive peer on the same documents.

Peer: the plain DPR-style split (`text.split()` then slicing into 100-word lists and joining),
which keeps no character offsets. Ours also records offsets for gold linking.

    .venv/bin/python benchmarks/chunking_throughput.py [--documents PARQUET] [--repeat 3]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import pyarrow.parquet as pq

import _bootstrap  # noqa: E402,F401  (puts the project on sys.path)
from tasks.chunking import chunk_documents  # noqa: E402


def naive_chunks(docs, words=100):
    for doc in docs:
        tokens = doc["text"].split()
        for i in range(0, len(tokens), words):
            yield {"pid": f"{doc['doc_id']}#{i // words}", "title": doc["title"], "text": " ".join(tokens[i:i + words])}


def _time(fn, docs, repeat):
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        n = sum(1 for _ in fn(docs))
        best = min(best, time.perf_counter() - start)
    return best, n


def _default_documents() -> Path:
    from storage import ArtifactStore, resolve_root

    artifact = ArtifactStore(resolve_root(None)).latest("documents")
    if artifact is None:
        raise SystemExit("no documents artifact: run `make demo` first or pass --documents")
    return artifact.path / "data"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--documents", type=Path, help="documents parquet file or folder (default: latest artifact)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    docs = pq.read_table(args.documents or _default_documents(), columns=["doc_id", "title", "text"]).to_pylist()
    megabytes = sum(len(d["text"].encode("utf-8")) for d in docs) / 1e6
    ours, n_ours = _time(lambda d: chunk_documents(d, 100), docs, args.repeat)
    peer, n_peer = _time(naive_chunks, docs, args.repeat)
    print(f"{len(docs):,} documents, {megabytes:.1f} MB of text, best of {args.repeat}")
    print("| chunker | passages | seconds | MB/s |")
    print("|---|---:|---:|---:|")
    print(f"| passage-forge (with offsets) | {n_ours:,} | {ours:.2f} | {megabytes / ours:.1f} |")
    print(f"| naive split/join (peer) | {n_peer:,} | {peer:.2f} | {megabytes / peer:.1f} |")
    print(f"ratio ours/peer: {peer / ours:.2f}x")


if __name__ == "__main__":
    main()
