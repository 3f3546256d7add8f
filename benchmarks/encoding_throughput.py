"""Passage encoding throughput: our path (tasks.compute.batch_encode.encode_texts + BiEncoder) vs
sentence-transformers' ``SentenceTransformer.encode``, same model, same passages, same run.

    HF_HUB_OFFLINE=1 python benchmarks/encoding_throughput.py [--passages P.parquet --questions Q.parquet] \
        [--limit 300] [--batch-size 64] [--max-length 256] [--threads 2] [--repeat 5] \
        [--systems st,ours,short,int8] [--device cpu|cuda] [--out r.json]

Model: the all-MiniLM-L6-v2 weights (models.checkpoints alias 'minilm') as
``BiEncoder(pooling='mean', normalize=True)``, which is exactly what the sentence-transformers
folder does (Transformer -> mean Pooling -> Normalize); the script reports the largest difference
between the two systems' fp32 vectors.

Input: what the pipeline encodes. Passages are (title, text) pairs, tokenised as
``tokenizer(title, text)`` = "[CLS] title [SEP] text [SEP]" (models.bi_encoder.format_passage,
tasks/dense_stages.py build_encode). sentence-transformers gets the same (title, text) tuples:
its ``encode`` hands a tuple to the same tokenizer as a text pair, so the token ids and token
types are identical; it truncates 'longest_first' where we truncate 'only_second', which differs
only for passages longer than --max-length (the count is printed). Questions are plain strings.

Inputs: --passages (pid, title, text[, doc_id]) and --questions (qid, question, answers[, doc_id])
parquet files; without them the SQuAD dev paragraphs (--squad) are the passages (title =
article). The first --limit passages are encoded; the questions are those whose whole document
(all its passages) is among them, spread over them, at most --num-questions.

Systems (--systems): st = sentence-transformers fp32; ours = ours fp32; short = ours fp32 at
--short-length tokens; int8 = ours with dynamic int8 Linear layers (CPU only); bf16 = ours under
bf16 autocast (meant for CUDA: CPUs without AMX / avx512_bf16 emulate it, ~10x slower).

Timing (benchmarks/timing.py): each system encodes 8 passages once untimed (warm-up), then every
repeat encodes all the passages with every system, alternated and the order swapped each repeat;
end to end, strings in and a float32 numpy matrix out, tokenisation included. Reported:
passages/s median (min-max) and the ratio of medians vs sentence-transformers with its range,
"parity" where the ranges overlap. Same batch size, max length, thread count and device for all.
Agreement with our fp32 (vectors of the last repeat; questions encoded the same way as the
passages of that row): mean / min cosine, mean top-20 overlap for the questions, the fraction of
questions with an identical top-20 set, and top-20 answer accuracy (DPR has_answer on the text).
"""
from __future__ import annotations

import argparse
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from _bootstrap import DEFAULT_SQUAD  # noqa: E402  (puts the project on sys.path)
import reporting  # noqa: E402
import timing  # noqa: E402
from _shared import load_has_answer, squad_articles, st_peer  # noqa: E402
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

TOP_K = 20
SYSTEM_NAMES = {
    "st": "sentence-transformers `encode`, fp32 (peer)",
    "ours": "ours fp32",
    "short": "ours fp32, {short} tokens",
    "int8": "ours, dynamic int8 Linear layers",
    "bf16": "ours bf16 autocast",
}


# --------------------------------------------------------------------------- inputs
def squad_paragraphs(path: Path) -> tuple[pa.Table, pa.Table]:
    """Passages = SQuAD paragraphs (title = article, doc_id = paragraph), questions with answers."""
    pids, titles, texts, qids, questions, answers, q_docs = [], [], [], [], [], [], []
    for a_i, article in enumerate(squad_articles(path)):
        for p_i, para in enumerate(article.paragraphs):
            pid = f"squad-{a_i}-{p_i}"
            pids.append(pid)
            titles.append(article.title)
            texts.append(para.context)
            for q in para.questions:
                qids.append(q["qid"])
                questions.append(q["question"])
                answers.append(sorted(q["answers"]))
                q_docs.append(pid)
    return (pa.table({"pid": pids, "doc_id": pids, "title": titles, "text": texts}),
            pa.table({"qid": qids, "question": questions, "answers": answers, "doc_id": q_docs}))


def load_inputs(args):
    """(pids, (title, text) pairs, question strings, answers, source description)."""
    if bool(args.passages) != bool(args.questions):
        raise SystemExit("give both --passages and --questions, or neither (SQuAD fallback)")
    if args.passages:
        passages = pq.read_table(args.passages)
        questions = pq.read_table(args.questions)
        source = f"{args.passages} + {args.questions}"
    else:
        passages, questions = squad_paragraphs(Path(args.squad))
        source = f"SQuAD {args.squad} (whole paragraphs, title = article)"
    subset = passages.slice(0, args.limit or passages.num_rows)
    if "doc_id" in passages.column_names and "doc_id" in questions.column_names:
        in_all = Counter(passages.column("doc_id").to_pylist())
        whole = {d for d, n in Counter(subset.column("doc_id").to_pylist()).items() if n == in_all[d]}
        rows = [i for i, d in enumerate(questions.column("doc_id").to_pylist()) if d in whole]
    else:
        rows = list(range(questions.num_rows))
    if args.num_questions and len(rows) > args.num_questions:
        step = len(rows) / args.num_questions  # spread over the passages
        rows = [rows[int(i * step)] for i in range(args.num_questions)]
    questions = questions.take(pa.array(rows, pa.int64()))
    titles = [t or "" for t in subset.column("title").to_pylist()]
    texts = [x or "" for x in subset.column("text").to_pylist()]
    return (subset.column("pid").to_pylist(), list(zip(titles, texts)),
            questions.column("question").to_pylist(),
            [list(a or []) for a in questions.column("answers").to_pylist()], source)


# --------------------------------------------------------------------------- agreement
def topk(q: np.ndarray, p: np.ndarray, k: int) -> np.ndarray:
    scores = q @ p.T
    k = min(k, p.shape[0])
    idx = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, idx, axis=1), axis=1)
    return np.take_along_axis(idx, order, axis=1)


def agreement(ref_p, p, ref_top, top) -> dict:
    cos = (ref_p * p).sum(1) / (np.linalg.norm(ref_p, axis=1) * np.linalg.norm(p, axis=1) + 1e-12)
    overlap = [len(set(a) & set(b)) / len(a) for a, b in zip(ref_top, top)]
    same = [set(a) == set(b) for a, b in zip(ref_top, top)]
    return {"mean_cos": float(cos.mean()), "min_cos": float(cos.min()),
            "top20_overlap": float(np.mean(overlap)) if overlap else float("nan"),
            "top20_identical": float(np.mean(same)) if same else float("nan")}


def accuracy(top, answers, texts, has_answer) -> float:
    if not answers or not any(answers):
        return float("nan")
    hits = [any(has_answer(ans, texts[j]) for j in row) for row, ans in zip(top, answers)]
    return float(np.mean(hits))


# --------------------------------------------------------------------------- main
def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passages")
    ap.add_argument("--questions")
    ap.add_argument("--squad", default=str(DEFAULT_SQUAD))
    ap.add_argument("--limit", type=int, default=300, help="passages to encode per repeat (0: all)")
    ap.add_argument("--num-questions", type=int, default=500, help="questions at most (0: all)")
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--short-length", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    timing.add_repeat_argument(ap, what="encodings of all the passages per system")
    ap.add_argument("--systems", help="comma-separated, from st,ours,short,int8,bf16 "
                                      "(default: st,ours,short,int8 on cpu, st,ours,bf16 on cuda)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)

    device = args.device
    keys = (args.systems or ("st,ours,short,int8" if device == "cpu" else "st,ours,bf16")).split(",")
    keys = [k.strip() for k in keys if k.strip()]
    unknown = [k for k in keys if k not in SYSTEM_NAMES]
    if unknown or "st" not in keys or "ours" not in keys:
        raise SystemExit(f"--systems takes st,ours plus any of short,int8,bf16; got {args.systems!r}")
    if "int8" in keys and device != "cpu":
        raise SystemExit("int8 (dynamic quantisation) runs on cpu only")

    torch.set_num_threads(args.threads)
    from models import BiEncoder, resolve_checkpoint
    from tasks.compute.batch_encode import encode_texts

    pids, pairs, questions, answers, source = load_inputs(args)
    texts = [x for _, x in pairs]
    has_answer, has_answer_src = load_has_answer()

    ref = resolve_checkpoint(args.model)
    ours = BiEncoder.from_pretrained(args.model, pooling="mean", normalize=True).to(device).eval()
    tok = ours.tokenizer
    st = st_peer(ref, device=device, max_length=args.max_length)

    def run_st(items):
        return st.encode(items, batch_size=args.batch_size, convert_to_numpy=True, show_progress_bar=False)

    def run_ours(max_length, bf16=False, model=ours):
        def fn(items):
            return encode_texts(items, tok, model.encode_passage, batch_size=args.batch_size,
                                max_length=max_length, device=device, autocast_bf16=bf16)
        return fn

    fns = {"st": run_st, "ours": run_ours(args.max_length), "short": run_ours(args.short_length),
           "bf16": run_ours(args.max_length, bf16=True)}
    if "int8" in keys:
        from models.quantization import quantize_dynamic_int8

        fns["int8"] = run_ours(args.max_length, model=quantize_dynamic_int8(ours))
    max_lens = {k: (args.short_length if k == "short" else args.max_length) for k in keys}
    names = {k: SYSTEM_NAMES[k].format(short=args.short_length) for k in keys}

    n_tokens = np.array([len(x) for x in tok([t for t, _ in pairs], texts, truncation=False)["input_ids"]])
    for k in keys:  # warm-up (allocator, kernels, lazy init), untimed
        fns[k](pairs[:8])
    sync = torch.cuda.synchronize if device == "cuda" else None
    seconds, last = timing.alternate({k: (lambda r, f=fns[k]: f(pairs)) for k in keys}, args.repeat, sync)
    summaries = {k: timing.summarize(timing.rates(len(pairs), seconds[k])) for k in keys}

    vectors = {k: np.asarray(last[k], np.float32) for k in keys}
    q_vectors = {k: np.asarray(fns[k](questions), np.float32) if questions else
                 np.zeros((0, vectors[k].shape[1]), np.float32) for k in keys}
    ref_top = topk(q_vectors["ours"], vectors["ours"], TOP_K) if questions else np.zeros((0, TOP_K), int)
    rows = []
    for k in keys:
        top = topk(q_vectors[k], vectors[k], TOP_K) if questions else np.zeros((0, TOP_K), int)
        row = {"key": k, "name": names[k], "max_length": max_lens[k], "seconds": seconds[k],
               "passages_per_s": summaries[k].values, "median_passages_per_s": summaries[k].median,
               "top20_accuracy": accuracy(top, answers, texts, has_answer)}
        if k != "st":
            r = timing.ratio(summaries[k], summaries["st"])
            row["ratio_vs_st"] = {"median": r.median, "lo": r.lo, "hi": r.hi, "parity": r.parity}
        row.update({f"vs_ours_fp32_{a}": v for a, v in agreement(vectors["ours"], vectors[k], ref_top, top).items()})
        rows.append(row)
    st_vs_ours_max_abs = float(np.abs(vectors["st"] - vectors["ours"]).max())

    hw = reporting.device_name(device)
    print(reporting.header(f"Encoding throughput ({source})", __file__, argv))
    print(f"model {args.model} ({ref}), mean pooling + l2 normalize; {len(pairs)} passages as (title, text) "
          f"pairs per repeat (tokens: mean {n_tokens.mean():.0f}, max {n_tokens.max()}, "
          f"{int((n_tokens > args.max_length).sum())} over {args.max_length}), {len(questions)} questions; "
          f"batch {args.batch_size}; torch threads {torch.get_num_threads()}; device {device} ({hw}); "
          f"torch {torch.__version__}, os.cpu_count() {os.cpu_count()}")
    print(timing.protocol_line(args.repeat, keys) + "\n")
    table = []
    for row, (name, rate, ratio) in zip(rows, timing.comparison_rows(
            {names[k]: summaries[k] for k in keys}, reference=names["st"])):
        table.append([name, row["max_length"], rate, ratio, f"{row['vs_ours_fp32_mean_cos']:.6f}",
                      f"{row['vs_ours_fp32_min_cos']:.6f}", f"{row['vs_ours_fp32_top20_overlap']:.3f}",
                      f"{row['vs_ours_fp32_top20_identical']:.3f}", f"{row['top20_accuracy']:.3f}"])
    print(reporting.markdown_table(
        ["system", "max tokens", "passages/s median (range)", "ratio vs ST (range)", "mean cos vs ours fp32",
         "min cos", "top-20 overlap", "identical top-20", "top-20 acc"], table))
    print("\nper-repeat seconds: " + "; ".join(
        f"{k} " + ", ".join(f"{s:.2f}" for s in seconds[k]) for k in keys))
    print(f"ST fp32 vs ours fp32: max |diff| of the passage vectors {st_vs_ours_max_abs:.2e} "
          "(same model and tokens: should be ~1e-6).")
    print(f"answer check: {has_answer_src}")
    result = {"source": source, "args": vars(args), "n_passages": len(pairs), "n_questions": len(questions),
              "mean_tokens": float(n_tokens.mean()), "st_vs_ours_fp32_max_abs": st_vs_ours_max_abs,
              "has_answer": has_answer_src, "rows": rows}
    if args.out:
        reporting.write_json(Path(args.out), result)
    return result


if __name__ == "__main__":
    main()
