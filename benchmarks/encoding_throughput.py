"""Passage encoding throughput: our path (tasks.dense.encode.encode_texts + BiEncoder) vs
sentence-transformers' ``SentenceTransformer.encode``, same model, same texts, same run.

    HF_HUB_OFFLINE=1 python benchmarks/encoding_throughput.py [--passages P.parquet --questions Q.parquet] \
        [--limit 1000] [--batch-size 64] [--max-length 256] [--threads 2] [--device cpu|cuda] [--out r.json]

Model: the all-MiniLM-L6-v2 weights (models.checkpoints alias 'minilm') as
``BiEncoder(pooling='mean', normalize=True)``, which is exactly what the sentence-transformers
folder does (Transformer -> mean Pooling -> Normalize); the script checks that the two give the
same fp32 vectors.

Inputs: --passages (pid, title, text) and --questions (qid, question, answers) parquet files;
without them the SQuAD dev paragraphs (--squad, default ../shared/data/squad/dev-v1.1-partial.json)
are the passages (title = article) and their questions are the questions. The first --limit
passages are encoded; questions are those about these passages when built from SQuAD, else the
first --num-questions.

Fairness: both systems get the SAME plain strings f"{title}. {text}" (not our usual
(title, text) pair input, which sentence-transformers does not take the same way), the same
batch size, the same max_seq_length, the same torch thread count, on the same device. Both sort
by length before batching (sentence-transformers sorts by character length, we sort by token
count) and pad per batch. Times are end to end: strings in, a float32 numpy matrix out
(tokenisation included), after one warm-up batch; each configuration runs --repeat times and the
best is reported.

Rows: ST fp32, ours fp32 (length-sorted), ours bf16 autocast, ours fp32 at --short-length (128)
tokens, and on CPU ours with dynamic int8 quantisation of the Linear layers (models.quantization).
On CPU the bf16 row encodes only the first --bf16-limit passages (default 64: CPUs without
AMX / avx512_bf16 emulate bf16 matmuls, ~10x slower than fp32), compared with our fp32 vectors of
the same passages. Agreement of bf16 (and 128 tokens) with our fp32: mean / min cosine of the passage
vectors, the mean overlap of the top-20 passage sets for the questions (queries encoded the same
way as the passages of that row), the fraction of questions whose top-20 set is identical, and
the top-20 answer accuracy (DPR has_answer) of each row.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from _bootstrap import DEFAULT_SQUAD  # noqa: E402  (puts the project on sys.path)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

TOP_K = 20


# --------------------------------------------------------------------------- inputs
def squad_paragraphs(path: Path) -> tuple[pa.Table, pa.Table, list[str]]:
    """Passages = SQuAD paragraphs (title = article), questions with answers, and each question's pid."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))["data"]
    pids, titles, texts, qids, questions, answers, q_pids = [], [], [], [], [], [], []
    for a_i, article in enumerate(data):
        title = article["title"].replace("_", " ")
        for p_i, para in enumerate(article["paragraphs"]):
            pid = f"squad-{a_i}-{p_i}"
            pids.append(pid)
            titles.append(title)
            texts.append(para["context"])
            for qa in para["qas"]:
                qids.append(qa["id"])
                questions.append(qa["question"])
                answers.append(sorted({x["text"] for x in qa["answers"]}))
                q_pids.append(pid)
    return (pa.table({"pid": pids, "title": titles, "text": texts}),
            pa.table({"qid": qids, "question": questions, "answers": answers}), q_pids)


def load_inputs(args) -> tuple[list[str], list[str], list[str], list[list[str]], str]:
    """(pids, passage strings, question strings, answers, source description)."""
    if bool(args.passages) != bool(args.questions):
        raise SystemExit("give both --passages and --questions, or neither (SQuAD fallback)")
    if args.passages:
        passages = pq.read_table(args.passages, columns=["pid", "title", "text"])
        questions = pq.read_table(args.questions, columns=["qid", "question", "answers"])
        passages = passages.slice(0, args.limit or passages.num_rows)
        questions = questions.slice(0, args.num_questions or questions.num_rows)
        source = f"{args.passages} + {args.questions}"
    else:
        passages, questions, q_pids = squad_paragraphs(Path(args.squad))
        passages = passages.slice(0, args.limit or passages.num_rows)
        kept = set(passages.column("pid").to_pylist())
        rows = [i for i, pid in enumerate(q_pids) if pid in kept]
        step = max(1, len(rows) // max(1, args.num_questions))  # spread over the passages
        rows = rows[::step][: args.num_questions]
        questions = questions.take(pa.array(rows, pa.int64()))
        source = f"SQuAD {args.squad} (whole paragraphs, title = article)"
    titles = passages.column("title").to_pylist()
    texts = passages.column("text").to_pylist()
    strings = [f"{t}. {x}" if t else (x or "") for t, x in zip(titles, texts)]
    return (passages.column("pid").to_pylist(), strings, questions.column("question").to_pylist(),
            [list(a or []) for a in questions.column("answers").to_pylist()], source)


def load_has_answer():
    try:
        from tasks.evaluation.has_answer import has_answer

        return has_answer
    except ImportError:  # pragma: no cover - fallback: normalized substring
        def has_answer(answers, text):
            t = " ".join(text.lower().split())
            return any(a and " ".join(a.lower().split()) in t for a in answers)

        return has_answer


# --------------------------------------------------------------------------- timing
def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, texts, repeat: int, device: str) -> tuple[np.ndarray, float]:
    fn(texts[: min(len(texts), 8)])  # warm-up batch (allocator, kernels, lazy init)
    best, out = float("inf"), None
    for _ in range(repeat):
        sync(device)
        t = time.perf_counter()
        out = fn(texts)
        sync(device)
        best = min(best, time.perf_counter() - t)
    return np.asarray(out, dtype=np.float32), best


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


def accuracy(top, answers, strings, has_answer) -> float:
    if not answers or not any(answers):
        return float("nan")
    hits = [any(has_answer(ans, strings[j]) for j in row) for row, ans in zip(top, answers)]
    return float(np.mean(hits))


# --------------------------------------------------------------------------- main
def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--passages")
    ap.add_argument("--questions")
    ap.add_argument("--squad", default=str(DEFAULT_SQUAD))
    ap.add_argument("--limit", type=int, default=1000, help="passages to encode (0: all)")
    ap.add_argument("--num-questions", type=int, default=200, help="questions (0: all)")
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--short-length", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--bf16-limit", type=int, default=None,
                    help="passages for the bf16 row (default: all on cuda, 64 on cpu, where bf16 "
                         "autocast is emulated and ~10x slower without AMX/avx512_bf16)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    from sentence_transformers import SentenceTransformer

    from models import BiEncoder, resolve_checkpoint
    from tasks.dense.encode import encode_texts

    pids, strings, questions, answers, source = load_inputs(args)
    has_answer = load_has_answer()
    device = args.device

    ref = resolve_checkpoint(args.model)
    ours = BiEncoder.from_pretrained(args.model, pooling="mean", normalize=True).to(device).eval()
    tok = ours.tokenizer
    st = SentenceTransformer(ref, device=device)
    st.max_seq_length = args.max_length

    def run_st(texts):
        return st.encode(texts, batch_size=args.batch_size, convert_to_numpy=True, show_progress_bar=False)

    def run_ours(max_length, bf16, model=ours):
        def fn(texts):
            return encode_texts(texts, tok, model.encode_passage, batch_size=args.batch_size,
                                max_length=max_length, device=device, autocast_bf16=bf16)
        return fn

    n = len(strings)
    bf16_n = min(n, args.bf16_limit if args.bf16_limit is not None else (n if device == "cuda" else 64))
    configs = [
        ("sentence-transformers fp32", run_st, args.max_length, n),
        ("ours fp32 (length-sorted)", run_ours(args.max_length, False), args.max_length, n),
        ("ours bf16 autocast", run_ours(args.max_length, True), args.max_length, bf16_n),
        (f"ours fp32, {args.short_length} tokens", run_ours(args.short_length, False), args.short_length, n),
    ]
    if device == "cpu":
        from models.quantization import quantize_dynamic_int8

        configs.append(("ours int8 dynamic (Linear layers)", run_ours(args.max_length, False, quantize_dynamic_int8(ours)),
                        args.max_length, n))
    n_tokens = np.array([len(x) for x in tok(strings, truncation=True, max_length=args.max_length)["input_ids"]])
    rows = []
    for name, fn, max_len, m in configs:
        p_emb, seconds = timed(fn, strings[:m], args.repeat, device)
        q_emb = fn(questions) if questions else np.zeros((0, p_emb.shape[1]), np.float32)
        rows.append({"name": name, "max_length": max_len, "n": m, "seconds": seconds,
                     "passages_per_s": m / seconds, "p": p_emb, "q": np.asarray(q_emb, np.float32)})

    base = rows[0]["passages_per_s"]
    ref_row = rows[1]
    for r in rows:  # a row on fewer passages is compared with our fp32 on the same passages
        m = r["n"]
        ref_top = topk(ref_row["q"], ref_row["p"][:m], TOP_K) if questions else np.zeros((0, TOP_K), int)
        top = topk(r["q"], r["p"], TOP_K) if questions else np.zeros((0, TOP_K), int)
        r["ratio_vs_st"] = r["passages_per_s"] / base
        r["top20_accuracy"] = accuracy(top, answers, strings[:m], has_answer)
        r["ours_fp32_top20_accuracy_same_passages"] = accuracy(ref_top, answers, strings[:m], has_answer)
        r.update({f"vs_ours_fp32_{k}": v for k, v in agreement(ref_row["p"][:m], r["p"], ref_top, top).items()})
    st_vs_ours_max_abs = float(np.abs(rows[0]["p"] - rows[1]["p"]).max())

    print(f"# Encoding throughput ({source})\n")
    print(f"model {args.model} ({ref}), mean pooling + l2 normalize; {len(strings)} passages "
          f"(tokens at {args.max_length}: mean {n_tokens.mean():.0f}, max {n_tokens.max()}, "
          f"{(n_tokens >= args.max_length).mean():.0%} truncated), {len(questions)} questions; "
          f"batch {args.batch_size}; torch threads {torch.get_num_threads()}; device {device}"
          f" ({torch.cuda.get_device_name() if device == 'cuda' else platform.processor() or platform.machine()});"
          f" torch {torch.__version__}\n")
    print("| system | passages | max tokens | seconds | passages/s | ratio vs ST | mean cos vs ours fp32 | "
          "min cos | top-20 overlap | identical top-20 | top-20 acc (ours fp32, same passages) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['name']} | {r['n']} | {r['max_length']} | {r['seconds']:.2f} | {r['passages_per_s']:.1f} | "
              f"{r['ratio_vs_st']:.2f} | {r['vs_ours_fp32_mean_cos']:.6f} | {r['vs_ours_fp32_min_cos']:.6f} | "
              f"{r['vs_ours_fp32_top20_overlap']:.3f} | {r['vs_ours_fp32_top20_identical']:.3f} | "
              f"{r['top20_accuracy']:.3f} (fp32: {r['ours_fp32_top20_accuracy_same_passages']:.3f}) |")
    print(f"\nST fp32 vs ours fp32: max |diff| of the passage vectors {st_vs_ours_max_abs:.2e} "
          "(same model and inputs: should be ~1e-6).")
    result = {"source": source, "args": vars(args), "n_passages": len(strings), "n_questions": len(questions),
              "st_vs_ours_fp32_max_abs": st_vs_ours_max_abs,
              "rows": [{k: v for k, v in r.items() if k not in ("p", "q")} for r in rows]}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
