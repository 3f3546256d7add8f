"""Dense retrieval quality on the embedded default: BM25, zero-shot MiniLM, the DPR recipe, paper
003's bidirectional shared tower, and the BM25+dense hybrid, on the same questions, one run.

Inputs are the pipeline's own artifacts (after `make demo`), exported to plain Parquet files:
passages, questions, gold, bm25_runs. Training uses the train split (BM25 negatives filtered by
answer), the hybrid weight is chosen on dev, the table reports the test split.

    python benchmarks/quality/dense_quality.py --data DIR --model PATH_OR_minilm --device cuda --out DIR
    python benchmarks/quality/dense_quality.py --export-data DIR     # write DIR from the latest artifacts

Search is exact inner product (torch matmul + topk: the same ranking as FAISS IndexFlatIP), so the
script also runs where faiss is not installed (the GPU machines).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

import _quality_bootstrap  # noqa: E402,F401  (puts the project on sys.path)
import reporting  # noqa: E402
from models import BiEncoder, BidirectionalSoftmaxLoss, InBatchSoftmaxLoss  # noqa: E402
from models.checkpoints import resolve_checkpoint  # noqa: E402
from tasks.compute.batch_encode import encode_texts  # noqa: E402
from tasks.dense.hybrid import choose_weight, linear_fusion  # noqa: E402
from tasks.evaluation.qa_metrics import first_hit_ranks, qa_accuracy_metrics  # noqa: E402
from tasks.schemas import RUNS  # noqa: E402
from tasks.training.examples import training_examples  # noqa: E402
from tasks.training.arguments import TrainerArgs  # noqa: E402
from tasks.training.trainer import train_bi_encoder  # noqa: E402

TABLES = ("passages", "questions", "gold", "bm25_runs")
SYSTEMS = {
    # name: (from_pretrained kwargs, loss or None for zero-shot)
    "zero-shot": (dict(shared=True, pooling="mean", normalize=True, scale=1.0), None),
    # DPR: separate towers, [CLS], in-batch + 1 BM25 negative (Karpukhin et al.; paper 000, Experiment).
    "dpr": (dict(shared=False, pooling="cls", normalize=False, scale=1.0), InBatchSoftmaxLoss),
    # Paper 003 section 3: shared tower, FC on [CLS], l2 norm; bidirectional softmax (eq. 1-3).
    "bidirectional": (dict(shared=True, pooling="cls", projection_dim=384, normalize=True, scale=20.0),
                      BidirectionalSoftmaxLoss),
}


def export_data(out: Path) -> None:
    from storage import ArtifactStore, resolve_root

    store = ArtifactStore(resolve_root(None))
    out.mkdir(parents=True, exist_ok=True)
    sources = {"passages": ("passages", None), "questions": ("questions", "questions"), "gold": ("gold", None),
               "bm25_runs": ("bm25_runs", None)}
    for name, (stage, table) in sources.items():
        artifact = store.latest(stage)
        pq.write_table(artifact.read_table(table), out / f"{name}.parquet")
        print(f"{name}: {artifact.version}")


def exact_search(queries: np.ndarray, passages: torch.Tensor, k: int, pids: list[str], qids: list[str], system: str) -> pa.Table:
    rows = {"qid": [], "pid": [], "rank": [], "score": [], "system": []}
    q = torch.from_numpy(queries).to(passages.device, passages.dtype)
    for start in range(0, len(qids), 1024):
        scores, idx = (q[start:start + 1024] @ passages.T).topk(k, dim=1)
        for row, (s, i) in enumerate(zip(scores.float().cpu().numpy(), idx.cpu().numpy())):
            qid = qids[start + row]
            rows["qid"] += [qid] * k
            rows["pid"] += [pids[j] for j in i]
            rows["rank"] += list(range(1, k + 1))
            rows["score"] += s.tolist()
            rows["system"] += [system] * k
    return pa.table(rows, schema=RUNS)


def encode(model, texts, side, args):
    model.to(args.device).eval()
    fn = model.encode_passage if side == "passage" else model.encode_query
    with torch.inference_mode():
        return encode_texts(texts, model.tokenizer, fn, batch_size=args.encode_batch, device=args.device,
                            max_length=256 if side == "passage" else 64, autocast_bf16=args.bf16)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path)
    parser.add_argument("--export-data", type=Path)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--systems", default="zero-shot,dpr,bidirectional")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast for encoding (training: on for CUDA)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--max-steps", type=int)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--encode-batch", type=int, default=256)
    parser.add_argument("--limit-passages", type=int, help="smoke tests: keep gold passages plus the first N")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, default=Path("dense_quality_out"))
    args = parser.parse_args(argv)
    if args.export_data:
        return export_data(args.export_data)
    t = {name: pq.read_table(args.data / f"{name}.parquet") for name in TABLES}
    passages, questions = t["passages"], t["questions"]
    if args.limit_passages:
        keep = set(passages.column("pid").to_pylist()[: args.limit_passages]) | set(t["gold"].column("pid").to_pylist())
        passages = passages.filter(pc.is_in(passages.column("pid"), value_set=pa.array(sorted(keep))))
    args.out.mkdir(parents=True, exist_ok=True)
    pids, qids = passages.column("pid").to_pylist(), questions.column("qid").to_pylist()
    pairs = list(zip(passages.column("title").to_pylist(), passages.column("text").to_pylist()))
    text_of = dict(zip(pids, passages.column("text").to_pylist()))
    device_name = reporting.device_name(args.device)
    base = resolve_checkpoint(args.model)
    runs, info = {"bm25": t["bm25_runs"]}, {}
    for name in args.systems.split(","):
        kwargs, loss_cls = SYSTEMS[name]
        torch.manual_seed(args.seed)
        model = BiEncoder.from_pretrained(base, **kwargs).float()  # fp32 master weights whatever the checkpoint holds
        start = time.perf_counter()
        if loss_cls is not None:
            train = SimpleNamespace(negative_pool=10, hard_negatives=1, max_questions=None, batch_size=args.batch_size, seed=args.seed)
            examples = training_examples(train, questions, passages, t["gold"], t["bm25_runs"])
            result = train_bi_encoder(model, loss_cls(model), examples,
                                      TrainerArgs(lr=args.lr, batch_size=args.batch_size, epochs=args.epochs,
                                                  max_steps=args.max_steps, hard_negatives=1, seed=args.seed,
                                                  query_max_len=32, passage_max_len=160),
                                      args.out / f"train-{name}", progress=False, device=args.device)
            info[name] = {"train_examples": len(examples), "train_seconds": round(result["seconds"], 1),
                          "pairs_per_second": round(result["pairs_per_second"], 1), "steps": result["total_steps"]}
        p = torch.from_numpy(encode(model, pairs, "passage", args)).to(args.device)
        q = encode(model, questions.column("question").to_pylist(), "query", args)
        runs[name] = exact_search(q, p, 100, pids, qids, name)
        info.setdefault(name, {})["encode_seconds"] = round(time.perf_counter() - start - info.get(name, {}).get("train_seconds", 0), 1)
        print(name, info[name], flush=True)
    dev = questions.filter(pc.equal(questions.column("split"), "dev"))
    dev_ids = dev.column("qid")

    def dev_top20(run):
        ranks = first_hit_ranks(run, text_of, dev, "string", 20).column("first_hit_rank").to_pylist()
        return sum(1 for r in ranks if r is not None) / len(ranks)

    dense_names = [n for n in runs if n != "bm25"]
    best = max(dense_names, key=lambda n: dev_top20(runs[n]))
    on_dev = lambda r: r.filter(pc.is_in(r.column("qid"), value_set=dev_ids))  # noqa: E731
    weight, _ = choose_weight(on_dev(runs["bm25"]), on_dev(runs[best]), dev_top20)
    runs[f"hybrid({best})"] = linear_fusion(runs["bm25"], runs[best], weight, system=f"hybrid({best})")
    info["hybrid"] = {"dense": best, "bm25_weight": weight}
    metrics = []
    for name, run in runs.items():
        run = run.filter(pc.is_in(run.column("pid"), value_set=pa.array(pids)))
        m = qa_accuracy_metrics(first_hit_ranks(run.cast(RUNS), text_of, questions, "string", 100), (1, 5, 20, 100))
        metrics += [r | {"system": name} for r in m.to_pylist()]
    rows = []
    for name in runs:
        for split in ("test", "dev", "all"):
            v = {(r["metric"], r["k"]): r["value"] for r in metrics if r["system"] == name and r["split"] == split}
            rows.append([name, split, *(f"{100 * v[('top_k_accuracy', k)]:.1f}" for k in (1, 5, 20, 100)),
                         f"{v[('mrr', 10)]:.3f}"])
    report = "\n".join([
        reporting.header("Dense retrieval quality: BM25, zero-shot, DPR, bidirectional, hybrid", __file__, argv),
        f"device: {device_name}; passages {len(pids):,}; questions {len(qids):,}; seed {args.seed}", "",
        reporting.markdown_table(["system", "split", "top-1", "top-5", "top-20", "top-100", "MRR@10"], rows, numeric_from=2)])
    print(report)
    reporting.write_report(args.out / "dense_quality.md", report + "\n\n```json\n" + json.dumps(info, indent=2) + "\n```",
                           {"info": info, "metrics": metrics, "device": device_name})


if __name__ == "__main__":
    main()
