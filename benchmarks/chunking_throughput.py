"""Chunking throughput (MB/s of document text) against a naive peer on the same documents.

Peer: the plain DPR-style split (`text.split()` then slicing into 100-word lists and joining),
which keeps no character offsets. Ours also records offsets for gold linking.

    .venv/bin/python benchmarks/chunking_throughput.py [--documents PARQUET] [--repeat 5] [--passes 1]

Timing (benchmarks/timing.py): each chunker chunks all the documents once untimed (warm-up), then
--repeat times, the two alternated with the order swapped each repeat; a repeat chunks all the
documents --passes times (a chunking of the embedded default takes about 0.1 s, so on a shared
machine one preemption can halve a single pass: several passes per repeat even that out). MB/s
per repeat, reported as median (min-max) and the ratio of medians with its range, "parity" where
the ranges overlap.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import pyarrow.parquet as pq

import _bootstrap  # noqa: E402,F401  (puts the project on sys.path)
import reporting  # noqa: E402
import timing  # noqa: E402
from tasks.chunking import chunk_documents  # noqa: E402


def naive_chunks(docs, words=100):
    for doc in docs:
        tokens = doc["text"].split()
        for i in range(0, len(tokens), words):
            yield {"pid": f"{doc['doc_id']}#{i // words}", "title": doc["title"], "text": " ".join(tokens[i:i + words])}


def _default_documents() -> Path:
    from storage import ArtifactStore, resolve_root

    artifact = ArtifactStore(resolve_root(None)).latest("documents")
    if artifact is None:
        raise SystemExit("no documents artifact: run `make demo` first or pass --documents")
    return artifact.path / "data"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--documents", type=Path, help="documents parquet file or folder (default: latest artifact)")
    timing.add_repeat_argument(parser, what="timed repeats per chunker")
    parser.add_argument("--passes", type=int, default=1, help="chunkings of all the documents per repeat")
    args = parser.parse_args(argv)
    docs = pq.read_table(args.documents or _default_documents(), columns=["doc_id", "title", "text"]).to_pylist()
    megabytes = sum(len(d["text"].encode("utf-8")) for d in docs) / 1e6
    chunkers = {"passage-forge (with offsets)": lambda: chunk_documents(docs, 100),
                "naive split/join (peer)": lambda: naive_chunks(docs)}
    counts = {name: sum(1 for _ in fn()) for name, fn in chunkers.items()}  # warm-up, untimed
    def passes(fn):
        return lambda r: [sum(1 for _ in fn()) for _ in range(args.passes)]

    seconds, _ = timing.alternate({name: passes(fn) for name, fn in chunkers.items()}, args.repeat)
    summaries = {name: timing.summarize(timing.rates(megabytes * args.passes, s)) for name, s in seconds.items()}
    print(reporting.header("Chunking throughput: ours vs a naive split/join", __file__, argv))
    print(f"{len(docs):,} documents, {megabytes:.1f} MB of text, {args.passes} pass(es) per repeat; "
          + timing.protocol_line(args.repeat, ["ours", "peer"]))
    rows = [[name, f"{counts[name]:,}", f"{statistics.median(seconds[name]):.3f}", rate, ratio]
            for name, rate, ratio in timing.comparison_rows(summaries, reference="naive split/join (peer)")]
    print(reporting.markdown_table(["chunker", "passages", "median s", "MB/s median (range)", "ratio vs peer (range)"], rows))
    print("per-repeat seconds: " + "; ".join(f"{k} " + ", ".join(f"{x:.3f}" for x in v) for k, v in seconds.items()))
    return {"megabytes": megabytes, "seconds": seconds, "passages": counts}


if __name__ == "__main__":
    main()
