"""Hard-negative mining throughput and peak memory: ours (the pipeline's encoder route, then
tasks.negatives.blocked_topk) vs sentence-transformers' ``util.mine_hard_negatives`` (peer), same
encoder, corpus, questions and settings, same run.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/mining_throughput.py \
        [--passages /tmp/bench-artifacts/passages/e30b546259170629/data] [--limit 500] \
        [--num-questions 100] [--negatives 100] [--batch-size 64] [--max-length 256] \
        [--query-max-length 256] [--threads 2] [--repeat 5] [--out r.json]

Input: --passages, a passages Parquet file or folder (pid, title, text); the corpus is its first
--limit passages with distinct texts. Questions are synthetic (query, positive) pairs: query = the
first sentence (at most 40 words) of passage i, positive = passage i, for the first
--num-questions passages (a query equal to an earlier one is skipped). A passage is its `text`
for both systems: the peer's API takes strings, so the pipeline's (title, text) pairing is left
out rather than given to one side only.

Encoder: all-MiniLM-L6-v2 (`resolve_checkpoint("minilm")`). Ours: `load_bi_encoder` with the
dense model config's defaults (shared tower, mean pooling, l2-normalised: what the
sentence-transformers folder does) -> `for_inference(model, "cpu")` -> `EncodeSettings.encode`
(tokenise once, length-sorted batches, dynamic padding), passages encoded --shard-rows at a time
and each shard handed to `blocked_top_k(questions, shards, k=M+1)` in sub-shards of --search-rows;
then each question's positive is dropped and the first M kept. Peer: `SentenceTransformer(path,
device="cpu")` with `max_seq_length = --max-length`, and

    mine_hard_negatives(Dataset(query, positive), model, corpus=passages, range_min=0,
        range_max=M, num_negatives=M, sampling_strategy="top", output_format="labeled-list",
        batch_size=--batch-size, use_faiss=False, verbose=False)

i.e. the top M+1 by cosine (normalised embeddings: the inner product), positives masked, top M
kept; no margin, no max/min score, no cross-encoder; "labeled-list" is its cheapest output (one
row per question). Its encoder has one max_seq_length for both sides, so ours uses
--query-max-length = --max-length by default (the pipeline's 64 is available as a flag; the
report counts the queries over 64 tokens). The peer's `encode_document` call inside
`mine_hard_negatives` hard-codes `show_progress_bar=True`: its bars go to stderr (a redraw per
batch, left as the peer ships it).

Timing (benchmarks/timing.py): each system mines 8 questions over 64 passages once untimed
(warm-up), then every repeat mines all the questions with both systems, alternated and the order
swapped each repeat; end to end, strings in and negatives out (encoding of passages and questions,
search, filtering). Reported: questions/s median (min-max), the ratio of medians vs the peer with
its range, "parity" where the ranges overlap. Peak memory: one extra fresh subprocess per system
(model loaded, warm-up, one mining run), started before this process loads anything (Linux
carries ru_maxrss across fork + exec): `ru_maxrss` (VmHWM printed as a cross-check), whole and
over that process's peak once the model is loaded (taken before the warm-up: activations count
as mining memory).
Agreement (last repeat): ranked negative lists identical, and mean set overlap. Breakdown: one
more run of ours, split into its parts, and the peer's passage encoding alone (outside the
protocol, once each), to say where the time goes.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

import _bootstrap  # noqa: E402,F401  (puts the project on sys.path)
import reporting  # noqa: E402
import timing  # noqa: E402
from _shared import st_peer  # noqa: E402

DEFAULT_PASSAGES = "/tmp/bench-artifacts/passages/e30b546259170629/data"
QUERY_WORDS = 40


# --------------------------------------------------------------------------- inputs
def first_sentence(text: str) -> str:
    sentence = re.split(r"(?<=[.!?])\s+", text.strip(), maxsplit=1)[0]
    return " ".join(sentence.split()[:QUERY_WORDS])


def load_inputs(path: str, limit: int, num_questions: int):
    """(pids, texts, queries, positive pids): distinct passage texts, distinct queries."""
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["pid", "text"])
    pids, texts, seen = [], [], set()
    for pid, text in zip(table.column("pid").to_pylist(), table.column("text").to_pylist()):
        if text and text not in seen:  # the peer de-duplicates its corpus by text: keep both corpora equal
            seen.add(text)
            pids.append(pid)
            texts.append(text)
        if len(pids) == limit:
            break
    queries, positives, asked = [], [], set()
    for pid, text in zip(pids[:num_questions], texts[:num_questions]):
        query = first_sentence(text)
        if query not in asked:
            asked.add(query)
            queries.append(query)
            positives.append(pid)
    return pids, texts, queries, positives


# --------------------------------------------------------------------------- systems
def make_ours(args, pids, texts, queries, positives):
    """The miner: strings in, per question the M best non-positive pids out."""
    from tasks.compute.batch_encode import iter_shards
    from tasks.compute.bi_encoder import for_inference, load_bi_encoder
    from tasks.compute.encode import EncodeSettings
    from tasks.dense.stages import DenseModelConfig
    from tasks.negatives.blocked_topk import blocked_top_k

    model = for_inference(load_bi_encoder(DenseModelConfig(base="minilm").model_dump()), "cpu")
    settings = EncodeSettings(batch_size=args.batch_size, passage_max_len=args.max_length,
                              query_max_len=args.query_max_length, dtype="float32", bf16=False)
    m = args.negatives

    def shards(p_ids, p_texts, times):
        for a, b in iter_shards(len(p_texts), args.shard_rows):
            t = time.perf_counter()
            vectors = settings.encode(model, p_texts[a:b], "passage", "cpu")
            times["encode passages"] += time.perf_counter() - t
            for c, d in iter_shards(b - a, args.search_rows):
                yield p_ids[a + c:a + d], vectors[c:d]

    def mine(q_texts=queries, q_pos=positives, p_ids=pids, p_texts=texts, times=None):
        times = times if times is not None else {"encode passages": 0.0}
        t = time.perf_counter()
        q = settings.encode(model, q_texts, "query", "cpu")
        times["encode questions"] = time.perf_counter() - t
        t = time.perf_counter()
        top = blocked_top_k(q, shards(p_ids, p_texts, times), k=m + 1)
        negatives = [[p for p in row if p != pos][:m] for row, pos in zip(top.pids, q_pos)]
        times["search + filter"] = time.perf_counter() - t - times["encode passages"]
        return negatives

    return mine, model


def make_peer(args, pids, texts, queries, positives):
    from datasets import Dataset
    from sentence_transformers.util import mine_hard_negatives

    st = st_peer("minilm", max_length=args.max_length)
    text_of = dict(zip(pids, texts))
    pid_of = {t: p for p, t in text_of.items()}

    def mine(q_texts=queries, q_pos=positives, p_texts=texts):
        data = Dataset.from_dict({"query": q_texts, "positive": [text_of[p] for p in q_pos]})
        out = mine_hard_negatives(data, st, anchor_column_name="query", positive_column_name="positive",
                                  corpus=list(p_texts), range_min=0, range_max=args.negatives,
                                  num_negatives=args.negatives, sampling_strategy="top",
                                  output_format="labeled-list", batch_size=args.batch_size,
                                  use_faiss=False, verbose=False)
        by_query = {q: [pid_of[t] for t in docs[1:]] for q, docs in zip(out["query"], out["positive"])}
        return [by_query.get(q, []) for q in q_texts]

    return mine, st


# --------------------------------------------------------------------------- children (peak memory)
def _rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _hwm_mb() -> float:
    """VmHWM: the peak RSS of this address space, a cross-check of ru_maxrss."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(system: str, args) -> dict:
    import datasets  # noqa: F401  (both children import the same libraries before measuring)
    import sentence_transformers  # noqa: F401
    import torch

    torch.set_num_threads(args.threads)
    inputs = load_inputs(args.passages, args.limit, args.num_questions)
    mine, _ = (make_ours if system == "ours" else make_peer)(args, *inputs)
    loaded = _rss_mb()
    _small_run(system, mine, *inputs)
    t = time.perf_counter()
    mine()
    return {"system": system, "seconds": time.perf_counter() - t, "loaded_mb": loaded, "peak_mb": _rss_mb(),
            "vmhwm_mb": _hwm_mb()}


def _small_run(system, mine, pids, texts, queries, positives):
    """The warm-up: the first 8 questions (those whose positive is there) over the first 64 passages."""
    n = min(64, len(pids))
    qs = [i for i in range(min(8, len(queries))) if positives[i] in set(pids[:n])]
    q_texts, q_pos = [queries[i] for i in qs], [positives[i] for i in qs]
    if system == "ours":
        return mine(q_texts=q_texts, q_pos=q_pos, p_ids=pids[:n], p_texts=texts[:n])
    return mine(q_texts=q_texts, q_pos=q_pos, p_texts=texts[:n])


def run_child(system: str, argv: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, *argv, "--child", system], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{system} child failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- main
def agreement(a: list[list[str]], b: list[list[str]]) -> tuple[float, float]:
    same = float(np.mean([x == y for x, y in zip(a, b)]))
    overlap = float(np.mean([len(set(x) & set(y)) / max(len(x), 1) for x, y in zip(a, b)]))
    return same, overlap


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passages", default=DEFAULT_PASSAGES, help="passages Parquet file or folder (pid, text)")
    ap.add_argument("--limit", type=int, default=500, help="passages in the corpus")
    ap.add_argument("--num-questions", type=int, default=100)
    ap.add_argument("--negatives", type=int, default=100, help="M: negatives kept per question")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-length", type=int, default=256, help="passage tokens (and the peer's queries)")
    ap.add_argument("--query-max-length", type=int, help="our question tokens (default: --max-length)")
    ap.add_argument("--shard-rows", type=int, default=100_000, help="ours: passages encoded at a time")
    ap.add_argument("--search-rows", type=int, default=16_384, help="ours: passages per blocked_top_k shard")
    ap.add_argument("--threads", type=int, default=2)
    timing.add_repeat_argument(ap, what="minings of all the questions per system")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--child", choices=["ours", "peer"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.query_max_length = args.query_max_length or args.max_length
    if args.child:
        print(json.dumps(child(args.child, args)))
        return {}

    # Peak memory first, while this process is small: Linux carries ru_maxrss across fork + exec,
    # so a child started later would report this process's peak as its own.
    memory = {s: run_child(s, list(argv if argv is not None else sys.argv[1:])) for s in ("ours", "peer")}

    import torch

    torch.set_num_threads(args.threads)
    pids, texts, queries, positives = inputs = load_inputs(args.passages, args.limit, args.num_questions)
    if args.negatives + 1 > len(pids):
        raise SystemExit(f"--negatives {args.negatives} needs more than {len(pids)} passages")
    ours, model = make_ours(args, *inputs)
    peer, st = make_peer(args, *inputs)
    systems = {"peer": peer, "ours": ours}
    for name, fn in systems.items():
        _small_run(name, fn, *inputs)
    seconds, last = timing.alternate({k: (lambda r, f=fn: f()) for k, fn in systems.items()}, args.repeat)
    summaries = {k: timing.summarize(timing.rates(len(queries), seconds[k])) for k in systems}
    same, overlap = agreement(last["ours"], last["peer"])

    # Where the time goes (one run each, after the timed ones).
    parts = {"encode passages": 0.0}
    t = time.perf_counter()
    ours(times=parts)
    parts["total"] = time.perf_counter() - t
    t = time.perf_counter()
    st.encode_document(texts, batch_size=args.batch_size, normalize_embeddings=True, convert_to_numpy=True)
    peer_encode = time.perf_counter() - t

    tok = model.tokenizer
    p_tokens = np.array([len(x) for x in tok(texts, truncation=False)["input_ids"]])
    q_tokens = np.array([len(x) for x in tok(queries, truncation=False)["input_ids"]])
    import sentence_transformers

    names = {"peer": "sentence-transformers `mine_hard_negatives` (peer)", "ours": "ours: encode + blocked_top_k"}
    print(reporting.header(f"Mining throughput ({args.passages})", __file__, argv))
    print(f"{len(pids):,} passages (text only; tokens mean {p_tokens.mean():.0f}, max {p_tokens.max()}, "
          f"{int((p_tokens > args.max_length).sum())} over {args.max_length}), {len(queries):,} synthetic questions "
          f"(first sentence of passage i, positive = passage i; tokens mean {q_tokens.mean():.0f}, max {q_tokens.max()}, "
          f"{int((q_tokens > 64).sum())} over 64), M = {args.negatives} negatives each; model minilm "
          f"(all-MiniLM-L6-v2, mean pooling + l2 normalize); batch {args.batch_size}; max tokens: passages "
          f"{args.max_length}, questions {args.query_max_length} (ours) / {args.max_length} (peer: one max_seq_length); "
          f"torch threads {torch.get_num_threads()}; os.cpu_count() {os.cpu_count()}; "
          f"torch {torch.__version__}, sentence-transformers {sentence_transformers.__version__}")
    print(f"peer settings: range_min=0, range_max={args.negatives}, num_negatives={args.negatives}, "
          f"sampling_strategy='top', output_format='labeled-list', batch_size={args.batch_size}, use_faiss=False, "
          f"no margins/scores/cross-encoder, verbose=False; ours: k={args.negatives + 1}, positive dropped, "
          f"first {args.negatives} kept, encode shards {args.shard_rows:,}, search shards {args.search_rows:,}")
    print(timing.protocol_line(args.repeat, list(systems)) + "\n")
    table = []
    for key, (name, rate, ratio) in zip(systems, timing.comparison_rows(
            {names[k]: summaries[k] for k in systems}, reference=names["peer"])):
        mem = memory[key]
        table.append([name, rate, ratio, f"{mem['peak_mb']:,.0f}", f"{mem['peak_mb'] - mem['loaded_mb']:,.0f}"])
    print(reporting.markdown_table(["system", "questions/s median (range)", "ratio vs peer (range)",
                                 "peak RSS MB", "peak over loaded model MB"], table))
    print("\nper-repeat seconds: " + "; ".join(f"{k} " + ", ".join(f"{s:.2f}" for s in seconds[k]) for k in systems))
    print(f"agreement (last repeat): identical ranked negative lists {same:.3f}, mean set overlap {overlap:.4f}")
    print("where ours spends one run: " + ", ".join(f"{k} {v:.2f} s" for k, v in parts.items())
          + f"; the peer's passage encoding alone (encode_document): {peer_encode:.2f} s")
    print("peak memory: one fresh subprocess per system (load, warm-up, one mining run; 'loaded' = peak "
          "once the model is loaded); "
          + "; ".join(f"{k}: loaded {v['loaded_mb']:,.0f} MB, peak {v['peak_mb']:,.0f} MB (VmHWM "
                        f"{v['vmhwm_mb']:,.0f}), run {v['seconds']:.2f} s" for k, v in memory.items()))
    result = {"args": vars(args), "n_passages": len(pids), "n_questions": len(queries), "seconds": seconds,
              "agreement": {"identical": same, "overlap": overlap}, "parts": parts, "peer_encode_s": peer_encode,
              "memory": memory}
    if args.out:
        reporting.write_json(Path(args.out), result)
    return result


if __name__ == "__main__":
    main()
