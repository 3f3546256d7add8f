"""Training-step throughput: our BiEncoder + InBatchSoftmaxLoss step vs a sentence-transformers
MultipleNegativesRankingLoss step, same model, same pairs, same run.

    HF_HUB_OFFLINE=1 python benchmarks/training_throughput.py [--batch-size 16] [--steps 3] \
        [--warmup 1] [--query-length 32] [--passage-length 128] [--threads 2] [--device cpu|cuda] [--bf16]

Both start from the same all-MiniLM-L6-v2 weights (alias 'minilm'; each system gets its own copy),
use mean pooling + l2 normalisation with logit scale 20 (MNRL's defaults: cosine similarity x 20;
ours: normalize=True, similarity_scale=20), the in-batch softmax over the B positives, AdamW
(lr 2e-5), and the same (question, paragraph) pairs from SQuAD (--squad). A step is: tokenise the
questions (truncated to --query-length) and passages ("title. text", truncated to
--passage-length, padded per batch), forward, loss, backward, optimizer step, zero_grad. Each
system runs --warmup untimed steps then --steps timed steps (different batches), the two systems
alternating step by step so that a load change on the machine hits both alike;
pairs/s = batch_size * steps / time. --bf16 runs the forward and loss under
torch.autocast(bfloat16) for both (meant for CUDA; on CPUs without AMX it is emulated and slow).
The sentence-transformers step calls the loss module directly (no Trainer), so both rows time
the same work.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import time
from pathlib import Path

from _bootstrap import DEFAULT_SQUAD  # noqa: E402  (puts the project on sys.path)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

SCALE = 20.0


def squad_pairs(path: Path, n: int) -> list[tuple[str, str]]:
    """(question, "title. paragraph") pairs, one question per paragraph (no duplicate positives)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))["data"]
    pairs = []
    for article in data:
        title = article["title"].replace("_", " ")
        for para in article["paragraphs"]:
            if para["qas"]:
                pairs.append((para["qas"][0]["question"], f"{title}. {para['context']}"))
            if len(pairs) >= n:
                return pairs
    if len(pairs) < n:
        raise SystemExit(f"{path} has only {len(pairs)} paragraphs with questions, need {n}")
    return pairs


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_interleaved(steps, batches, warmup: int, device: str) -> tuple[list[float], list[list[float]]]:
    """Run every system's step on each batch in turn (A, B, A, B, ...), timing each step, so that
    load changes on a shared machine hit all systems alike. Returns (seconds, losses) per system."""
    seconds, losses = [0.0] * len(steps), [[] for _ in steps]
    for i, b in enumerate(batches):
        for j, step in enumerate(steps):
            sync(device)
            t = time.perf_counter()
            losses[j].append(step(b))
            sync(device)
            if i >= warmup:
                seconds[j] += time.perf_counter() - t
    return seconds, losses


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--squad", default=str(DEFAULT_SQUAD))
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3, help="timed steps")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--query-length", type=int, default=32)
    ap.add_argument("--passage-length", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--bf16", action="store_true", help="torch.autocast(bfloat16) forward + loss")
    ap.add_argument("--out")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from models import BiEncoder, InBatchSoftmaxLoss, resolve_checkpoint

    device, bs = args.device, args.batch_size
    n_steps = args.warmup + args.steps
    pairs = squad_pairs(Path(args.squad), bs * n_steps)
    batches = [pairs[i * bs:(i + 1) * bs] for i in range(n_steps)]
    autocast = ((lambda: torch.autocast(device_type=device, dtype=torch.bfloat16)) if args.bf16
                else contextlib.nullcontext)
    ref = resolve_checkpoint(args.model)

    def tokenize(tok, texts, max_length):
        enc = tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        return {k: v.to(device) for k, v in enc.items()}

    # -- ours ------------------------------------------------------------------------------
    torch.manual_seed(0)
    ours = BiEncoder.from_pretrained(args.model, pooling="mean", normalize=True, scale=SCALE).to(device).train()
    our_loss = InBatchSoftmaxLoss(ours)
    our_opt = torch.optim.AdamW(ours.parameters(), lr=args.lr)
    our_tok = ours.tokenizer

    def our_step(batch):
        q = tokenize(our_tok, [x for x, _ in batch], args.query_length)
        p = tokenize(our_tok, [y for _, y in batch], args.passage_length)
        with autocast():
            loss = our_loss(q, p)
        loss.backward()
        our_opt.step()
        our_opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    # -- sentence-transformers --------------------------------------------------------------
    torch.manual_seed(0)
    st = SentenceTransformer(ref, device=device)
    st.train()
    st_loss = MultipleNegativesRankingLoss(st, scale=SCALE)
    st_opt = torch.optim.AdamW(st.parameters(), lr=args.lr)
    st_tok = st.tokenizer

    def st_step(batch):
        q = tokenize(st_tok, [x for x, _ in batch], args.query_length)
        p = tokenize(st_tok, [y for _, y in batch], args.passage_length)
        labels = torch.arange(len(batch), device=device)
        with autocast():
            loss = st_loss([q, p], labels)
        loss.backward()
        st_opt.step()
        st_opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    (st_s, our_s), (st_losses, our_losses) = run_interleaved([st_step, our_step], batches, args.warmup, device)
    pairs_timed = bs * args.steps
    st_rate, our_rate = pairs_timed / st_s, pairs_timed / our_s

    hw = torch.cuda.get_device_name() if device == "cuda" else (platform.processor() or platform.machine())
    print(f"# Training throughput (SQuAD {args.squad})\n")
    print(f"model {args.model}, mean pooling + l2 normalize, scale {SCALE:g}; batch {bs}; "
          f"query/passage tokens {args.query_length}/{args.passage_length}; {args.warmup} warm-up + "
          f"{args.steps} timed steps; torch threads {torch.get_num_threads()}; device {device} ({hw}); "
          f"{'bf16 autocast' if args.bf16 else 'fp32'}; torch {torch.__version__}\n")
    print("| system | seconds | pairs/s | ratio vs ST | losses (warm-up, timed...) |")
    print("|---|---:|---:|---:|---|")
    print(f"| sentence-transformers MNRL | {st_s:.2f} | {st_rate:.2f} | 1.00 | "
          f"{', '.join(f'{x:.4f}' for x in st_losses)} |")
    print(f"| ours BiEncoder + InBatchSoftmaxLoss | {our_s:.2f} | {our_rate:.2f} | {our_rate / st_rate:.2f} | "
          f"{', '.join(f'{x:.4f}' for x in our_losses)} |")
    print(f"\nours / ST pairs/s ratio: {our_rate / st_rate:.3f} (same weights, batches and loss; "
          "losses differ a little because dropout is on in training mode)")
    result = {"args": vars(args), "st_seconds": st_s, "ours_seconds": our_s, "st_pairs_per_s": st_rate,
              "ours_pairs_per_s": our_rate, "ratio": our_rate / st_rate,
              "st_losses": st_losses, "ours_losses": our_losses}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
