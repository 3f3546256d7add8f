"""Query-side fine-tuning against a frozen passage index, compared with the zero-shot encoder it
starts from, in the same run (a probe of how much the query tower alone can gain on SQuAD).

    HF_HUB_OFFLINE=1 python benchmarks/quality/query_side_tuning.py --root artifacts [--epochs 3] [--lr 2e-5]

Needs the embedded default's artifacts (`make demo`): the zero-shot passage embeddings, the
questions, passages and gold. The passage vectors stay fixed; a copy of MiniLM encodes the
questions (mean pooling, l2) and is trained with a softmax over every passage of the training
articles and the Wikipedia distractors at once (the passages of dev and test articles are masked
out), all gold passages of a question counting as positives. After each epoch the test split is
scored by gold-passage top-k over the whole corpus, next to the zero-shot query encoder.
"""
from __future__ import annotations

import argparse
import time

from _quality_bootstrap import ROOT  # noqa: E402  (puts the project on sys.path)
import reporting  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

KS = (1, 5, 20, 100)


def latest_embeddings(store, system: str):
    rows = store.sql("SELECT version FROM artifacts WHERE stage = 'embeddings' AND parameters->>'$.system' = $1 "
                     "ORDER BY created_at DESC LIMIT 1", [system]).column("version").to_pylist()
    if not rows:
        raise SystemExit(f"no embeddings for system {system!r} under {store.root}: run `make demo` first")
    return store.get("embeddings", rows[0])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=str(ROOT / "artifacts"))
    ap.add_argument("--system", default="zero-shot", help="the dense system whose passage vectors stay fixed")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--scale", type=float, default=20.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from models import BiEncoder
    from storage import ArtifactStore
    from tasks.compute.embeddings import vectors_from_table

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    store = ArtifactStore(args.root)
    pids, vectors = vectors_from_table(latest_embeddings(store, args.system).read_table())
    passages_fixed = F.normalize(torch.from_numpy(np.array(vectors, np.float32)), dim=-1)  # a writable copy
    index_of = {p: i for i, p in enumerate(pids)}
    questions = store.sql("SELECT qid, question, split, doc_id FROM questions").to_pylist()
    gold: dict[str, set[int]] = {}
    for row in store.sql("SELECT qid, pid FROM gold WHERE relevance > 0").to_pylist():
        gold.setdefault(row["qid"], set()).add(index_of[row["pid"]])
    held_out_docs = {q["doc_id"] for q in questions if q["split"] != "train"}
    trainable = torch.zeros(len(pids), dtype=torch.bool)
    for row in store.sql("SELECT pid, doc_id FROM passages").to_pylist():
        trainable[index_of[row["pid"]]] = row["doc_id"] not in held_out_docs
    train = [(q["qid"], q["question"]) for q in questions if q["split"] == "train" and q["qid"] in gold]
    test = [(q["qid"], q["question"]) for q in questions if q["split"] == "test" and q["qid"] in gold]

    model = BiEncoder.from_pretrained("minilm", pooling="mean", normalize=True)
    tok = model.tokenizer

    def encode(texts):
        batch = tok(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
        return model.encode_query(batch)

    def evaluate() -> dict[int, float]:
        model.eval()
        hits = {k: 0 for k in KS}
        with torch.inference_mode():
            for i in range(0, len(test), 256):
                chunk = test[i:i + 256]
                top = (encode([t for _, t in chunk]) @ passages_fixed.T).topk(max(KS), dim=1).indices.tolist()
                for (qid, _), row in zip(chunk, top):
                    for k in KS:
                        hits[k] += bool(gold[qid] & set(row[:k]))
        return {k: 100.0 * v / len(test) for k, v in hits.items()}

    rows = [("zero-shot query encoder", 0, evaluate(), 0.0)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for epoch in range(1, args.epochs + 1):
        model.train()
        order = torch.randperm(len(train)).tolist()
        started = time.perf_counter()
        for i in range(0, len(order), args.batch_size):
            chunk = [train[j] for j in order[i:i + args.batch_size]]
            logits = (args.scale * encode([t for _, t in chunk]) @ passages_fixed.T).masked_fill(~trainable, -1e4)
            positive = torch.zeros_like(logits, dtype=torch.bool)
            for r, (qid, _) in enumerate(chunk):
                positive[r, list(gold[qid])] = True
            # -log of the softmax mass on the gold passages
            loss = (torch.logsumexp(logits, 1) - torch.logsumexp(logits.masked_fill(~positive, -1e4), 1)).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        rows.append((f"query-side tuned, epoch {epoch}", epoch, evaluate(), time.perf_counter() - started))

    base = rows[0][2]
    print(reporting.header(f"Query-side tuning against frozen {args.system} passage vectors", __file__, argv,
                           env="HF_HUB_OFFLINE=1"))
    print(f"{len(train)} train questions, {int(trainable.sum())} of {len(pids)} passages in the softmax, "
          f"{len(test)} test questions scored over all passages by gold-passage top-k; lr {args.lr}, "
          f"batch {args.batch_size}, scale {args.scale}, seed {args.seed}, torch threads {args.threads}\n")
    print(reporting.markdown_table(
        ["query encoder", *(f"top-{k}" for k in KS), "top-1 vs zero-shot", "epoch s"],
        [[name, *(f"{scores[k]:.1f}" for k in KS), f"{scores[1] / base[1]:.3f}x", f"{seconds:.0f}"]
         for name, _, scores, seconds in rows]))
    return {"rows": [{"name": n, "epoch": e, "top_k": s, "seconds": t} for n, e, s, t in rows]}


if __name__ == "__main__":
    main()
