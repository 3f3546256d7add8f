"""Training-step throughput: our BiEncoder + InBatchSoftmaxLoss step vs a sentence-transformers
MultipleNegativesRankingLoss step, same model, same pairs, same run.

    HF_HUB_OFFLINE=1 python benchmarks/training_throughput.py [--batch-size 16] [--repeat 5] \
        [--steps-per-repeat 1] [--warmup 1] [--query-length 32] [--passage-length 128] [--threads 2] \
        [--device cpu|cuda] [--bf16]

Both start from the same all-MiniLM-L6-v2 weights (alias 'minilm'; each system gets its own copy),
use mean pooling + l2 normalisation with logit scale 20 (MNRL's defaults: cosine similarity x 20;
ours: normalize=True, similarity_scale=20), the in-batch softmax over the B positives, AdamW
(lr 2e-5), and the same (question, (title, paragraph)) pairs from SQuAD (--squad). A step is:
tokenise the questions (truncated to --query-length) and the passages as the trainer does
(tasks/training/data.py: ``tokenizer(titles, texts)`` pairs, truncated to --passage-length,
padded per batch), forward, loss, backward, optimizer step, zero_grad. The sentence-transformers
step calls the loss module directly (no Trainer), so both rows time the same work.

Timing (benchmarks/timing.py): --warmup untimed steps per system, then --repeat repeats; in each
repeat every system runs --steps-per-repeat steps on that repeat's batches (the same batches for
both), the systems alternated with the order swapped each repeat, so that a load change on the
machine hits both alike. pairs/s per repeat = batch_size * steps_per_repeat / seconds; reported as
median (min-max) and the ratio of medians with its range, "parity" where the ranges overlap.
--bf16 runs the forward and loss under torch.autocast(bfloat16) for both (meant for CUDA; on CPUs
without AMX it is emulated and slow).
"""
from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path

from _bootstrap import DEFAULT_SQUAD  # noqa: E402  (puts the project on sys.path)
import reporting  # noqa: E402
import timing  # noqa: E402
from _step_args import add_step_arguments, alternate_steps, optimizer_step  # noqa: E402
from _shared import squad_articles, st_peer  # noqa: E402
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

SCALE = 20.0


def squad_pairs(path: Path, n: int) -> list[tuple[str, tuple[str, str]]]:
    """(question, (title, paragraph)) pairs, one question per paragraph (no duplicate positives)."""
    pairs = []
    for article in squad_articles(path):
        for para in article.paragraphs:
            if para.questions:
                pairs.append((para.questions[0]["question"], (article.title, para.context)))
            if len(pairs) >= n:
                return pairs
    raise SystemExit(f"{path} has only {len(pairs)} paragraphs with questions, need {n}")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--squad", default=str(DEFAULT_SQUAD))
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--batch-size", type=int, default=16)
    add_step_arguments(ap)
    ap.add_argument("--out")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from models import BiEncoder, InBatchSoftmaxLoss

    device, bs = args.device, args.batch_size
    spr = args.steps_per_repeat
    n_steps = args.warmup + args.repeat * spr
    pairs = squad_pairs(Path(args.squad), bs * n_steps)
    batches = [pairs[i * bs:(i + 1) * bs] for i in range(n_steps)]
    autocast = ((lambda: torch.autocast(device_type=device, dtype=torch.bfloat16)) if args.bf16
                else contextlib.nullcontext)

    def tokenize(tok, texts, max_length):
        """Questions (strings) or passages ((title, text) pairs, as the trainer tokenises them)."""
        args_ = (list(texts),) if isinstance(texts[0], str) else tuple(map(list, zip(*texts)))
        enc = tok(*args_, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
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
        return optimizer_step(our_loss, (q, p), our_opt, autocast)

    # -- sentence-transformers --------------------------------------------------------------
    torch.manual_seed(0)
    st = st_peer(args.model, device=device)
    st.train()
    st_loss = MultipleNegativesRankingLoss(st, scale=SCALE)
    st_opt = torch.optim.AdamW(st.parameters(), lr=args.lr)
    st_tok = st.tokenizer

    def st_step(batch):
        q = tokenize(st_tok, [x for x, _ in batch], args.query_length)
        p = tokenize(st_tok, [y for _, y in batch], args.passage_length)
        labels = torch.arange(len(batch), device=device)
        return optimizer_step(st_loss, ([q, p], labels), st_opt, autocast)

    steps = {"st": st_step, "ours": our_step}
    sync = torch.cuda.synchronize if device == "cuda" else None
    seconds, losses = alternate_steps(steps, batches, args.warmup, spr, args.repeat, sync)
    names = {"st": "sentence-transformers `MultipleNegativesRankingLoss` (peer)",
             "ours": "ours `BiEncoder` + `InBatchSoftmaxLoss`"}
    summaries = {names[k]: timing.summarize(timing.rates(bs * spr, seconds[k])) for k in steps}
    r = timing.ratio(summaries[names["ours"]], summaries[names["st"]])

    hw = reporting.device_name(device)
    print(reporting.header(f"Training throughput (SQuAD {args.squad})", __file__, argv))
    print(f"model {args.model}, mean pooling + l2 normalize, scale {SCALE:g}; batch {bs}; passages as "
          f"(title, text) pairs; query/passage tokens {args.query_length}/{args.passage_length}; "
          f"{args.warmup} warm-up step(s), then {spr} step(s) per system per repeat; torch threads "
          f"{torch.get_num_threads()}; device {device} ({hw}); {'bf16 autocast' if args.bf16 else 'fp32'}; "
          f"torch {torch.__version__}; os.cpu_count() {os.cpu_count()}")
    print(timing.protocol_line(args.repeat, list(steps)) + "\n")
    print(reporting.markdown_table(["system", "pairs/s median (range)", "ratio vs ST (range)"],
                                timing.comparison_rows(summaries, reference=names["st"])))
    print("\nper-repeat seconds: " + "; ".join(f"{k} " + ", ".join(f"{x:.2f}" for x in v) for k, v in seconds.items()))
    print("losses (warm-up, timed...): " + "; ".join(f"{k} " + ", ".join(f"{x:.4f}" for x in v)
                                                     for k, v in losses.items()))
    print(f"\nours / ST: {timing.fmt_ratio(r)} (same weights, batches and loss; losses differ a little "
          "because dropout is on in training mode)")
    result = {"args": vars(args), "seconds": seconds, "losses": losses, "ratio": vars(r),
              "pairs_per_s": {k: s.values for k, s in summaries.items()}}
    if args.out:
        reporting.write_json(Path(args.out), result)
    return result


if __name__ == "__main__":
    main()
