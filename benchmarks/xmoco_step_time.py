"""xMoCo training-step time: a 16,384-vector queue against the same model's in-batch-only steps
(xMoCo with the smallest queue, 2 x batch, and DPR's in-batch softmax), in one run.

    HF_HUB_OFFLINE=1 python benchmarks/xmoco_step_time.py [--batch-size 16] [--queue-size 16384] \
        [--hard-negatives 1] [--repeat 5] [--steps-per-repeat 2] [--warmup 1] [--threads 2] \
        [--device cpu|cuda] [--bf16] [--model minilm | --random-bert-base] [--tokenizer PATH]

Paper 000 section 5.3: "the size of the queue has little impact on both training speed and memory
cost, because both are dominated by the computation of the encoders". Systems, each on its own copy
of the same weights (MiniLM, two towers, [CLS], dot product: configs/xmoco.yaml's model):
- `dpr`: InBatchSoftmaxLoss, the in-batch softmax plus the hard negatives (the reference);
- `xmoco-in-batch`: XMoCoLoss with queues of 2 x batch (with one hard negative each, Q_p holds
  exactly one step's positives and negatives: in-batch negatives, section 5.3);
- `xmoco-q16384`: XMoCoLoss with --queue-size (the paper's 16,384), queues pre-filled with random
  vectors and ids (a full queue; an empty one costs the same: every slot is scored and masked).
A step: forward and loss, backward, AdamW step, zero_grad, and for xMoCo the momentum update of the
slow encoders (on_step_end). Batches are SQuAD questions with their paragraph as the positive and
the next paragraph of the same article as the hard negative, collated beforehand by the trainer's
Collator (tokenised, padded per batch), the same batches for every system.

Timing (benchmarks/timing.py): --warmup untimed steps per system, then --repeat repeats, each
running --steps-per-repeat steps per system, alternated with the order swapped every repeat;
seconds per step as median (min-max) and ratios of medians with their ranges. The queue's cost is
`xmoco-q16384` over `xmoco-in-batch` (aim: within 10%); the whole of xMoCo's cost (its two slow
encoders' forward passes) is `xmoco-q16384` over `dpr`.
--random-bert-base builds a randomly initialised BERT-base-sized encoder (110M, no weights needed:
timings do not depend on the values), e.g. for the paper's size on a GPU with --batch-size 128 --bf16.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import os
from pathlib import Path

from _bootstrap import DEFAULT_SQUAD  # noqa: E402  (puts the project on sys.path)
import reporting  # noqa: E402
import timing  # noqa: E402
from _step_args import add_step_arguments, optimizer_step  # noqa: E402
from _shared import squad_articles  # noqa: E402
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


def squad_examples(path: Path, n: int):
    """TrainExamples: a question, its paragraph, and the article's next paragraph as hard negative."""
    from tasks.training import TrainExample

    out = []
    for article in squad_articles(path):
        title, paragraphs = article.title, article.paragraphs
        for i, para in enumerate(paragraphs):
            if not para.questions or len(paragraphs) < 2:
                continue
            negative = paragraphs[(i + 1) % len(paragraphs)].context
            first = para.questions[0]
            out.append(TrainExample(qid=first["qid"], query=first["question"],
                                    positive=(title, para.context), positive_id=f"{title}:{i}",
                                    negatives=[(title, negative)]))
            if len(out) >= n:
                return out
    return out


def two_towers(args):
    """The bi-encoder every system starts from (two towers, [CLS], dot product, scale 1)."""
    from models import BiEncoder, BiEncoderConfig

    if args.random_bert_base:
        from transformers import BertConfig, BertModel

        torch.manual_seed(0)
        config = BiEncoderConfig(shared=False, pooling="cls", normalize=False, similarity_scale=1.0)
        return BiEncoder(BertModel(BertConfig()), BertModel(BertConfig()), config)
    return BiEncoder.from_pretrained(args.model, shared=False, pooling="cls", normalize=False, scale=1.0,
                                     load_tokenizer=False)


def prefill(loss, generator: torch.Generator) -> None:
    """Fill both queues with random unit vectors and random ids: a queue in its steady state."""
    for queue in (loss.passage_queue, loss.question_queue):
        vectors = torch.randn(queue.vectors.shape, generator=generator)
        queue.vectors.copy_(torch.nn.functional.normalize(vectors, dim=-1))
        queue.ids.copy_(torch.randint(0, 2**62, queue.ids.shape, generator=generator))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--squad", default=str(DEFAULT_SQUAD))
    ap.add_argument("--model", default="minilm", help="checkpoint alias or path (ignored with --random-bert-base)")
    ap.add_argument("--random-bert-base", action="store_true", help="random BERT-base-sized towers instead of --model")
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder (default: --model's)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--hard-negatives", type=int, default=1)
    ap.add_argument("--queue-size", type=int, default=16_384, help="paper 000 section 5.3: 16,384")
    add_step_arguments(ap, steps_per_repeat=2)
    ap.add_argument("--json", help="also write the raw figures here")
    ap.add_argument("--out", help="write the markdown report here")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    from transformers import AutoTokenizer

    from models import resolve_checkpoint
    from models.losses import InBatchSoftmaxLoss, XMoCoLoss
    from tasks.training import Collator

    device, bs, n_neg = torch.device(args.device), args.batch_size, args.hard_negatives
    spr, n_steps = args.steps_per_repeat, args.warmup + args.repeat * args.steps_per_repeat
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or resolve_checkpoint(args.model))
    collator = Collator(tokenizer, args.query_length, args.passage_length, n_neg, seed=0)
    examples = squad_examples(Path(args.squad), bs * n_steps)
    distinct = []
    for i in range(min(n_steps, len(examples) // bs)):  # fewer paragraphs than steps: batches repeat
        q, p, n, _ = collator(examples[i * bs:(i + 1) * bs])
        distinct.append(tuple(None if b is None else {k: v.to(device) for k, v in b.items()} for b in (q, p, n)))
    if not distinct:
        raise SystemExit(f"{args.squad} has {len(examples)} usable paragraphs: not one batch of {bs}")
    batches = [distinct[i % len(distinct)] for i in range(n_steps)]
    autocast = ((lambda: torch.autocast(device_type=args.device, dtype=torch.bfloat16)) if args.bf16
                else contextlib.nullcontext)

    base = two_towers(args)
    in_batch_queue = max(2 * bs, bs * (1 + n_neg))  # section 5.3's smallest queue, 2 x batch
    builders = {
        "dpr": lambda m: InBatchSoftmaxLoss(m),
        "xmoco-in-batch": lambda m: XMoCoLoss(m, queue_size=in_batch_queue),
        f"xmoco-q{args.queue_size}": lambda m: XMoCoLoss(m, queue_size=args.queue_size),
    }
    generator = torch.Generator().manual_seed(0)
    steps, losses = {}, {name: [] for name in builders}
    for name, build in builders.items():
        model = copy.deepcopy(base).to(device).train()
        loss_fn = build(model)
        if isinstance(loss_fn, XMoCoLoss):
            prefill(loss_fn, generator)
        loss_fn.to(device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

        def step(batch, model=model, loss_fn=loss_fn, optimizer=optimizer):
            q, p, n = batch
            loss = optimizer_step(loss_fn, (q, p, n), optimizer, autocast)
            if isinstance(loss_fn, XMoCoLoss):
                loss_fn.on_step_end(0, model, optimizer)
            return loss
        steps[name] = step

    for b in batches[:args.warmup]:
        for name, step in steps.items():
            losses[name].append(step(b))

    peak_gib = {name: 0.0 for name in steps}  # CUDA: the most memory allocated during a system's steps

    def timed(name):
        def run(r):
            first = args.warmup + r * spr
            if args.device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            losses[name].extend(steps[name](b) for b in batches[first:first + spr])
            if args.device == "cuda":
                peak_gib[name] = max(peak_gib[name], torch.cuda.max_memory_allocated() / 2**30)
        return run

    sync = torch.cuda.synchronize if args.device == "cuda" else None
    seconds, _ = timing.alternate({name: timed(name) for name in steps}, args.repeat, sync)
    per_step = {name: timing.summarize([s / spr for s in values]) for name, values in seconds.items()}
    big = f"xmoco-q{args.queue_size}"
    queue_cost = timing.ratio(per_step[big], per_step["xmoco-in-batch"])
    xmoco_cost = timing.ratio(per_step[big], per_step["dpr"])

    hw = reporting.device_name(args.device)
    model_name = "random BERT-base-sized towers (110M each)" if args.random_bert_base else args.model
    lines = [
        reporting.header(f"xMoCo step time: queue of {args.queue_size:,} against in-batch-only steps", __file__, argv,
                         env="HF_HUB_OFFLINE=1"),
        f"model {model_name}, two towers, [CLS], dot product; batch {bs} questions + {n_neg} hard negative(s) "
        f"each; query/passage tokens {args.query_length}/{args.passage_length}; AdamW lr {args.lr:g}; "
        f"{args.warmup} warm-up step(s), then {spr} step(s) per system per repeat; device {args.device} ({hw}); "
        f"{'bf16 autocast' if args.bf16 else 'fp32'}; torch {torch.__version__}, {torch.get_num_threads()} "
        f"threads, os.cpu_count() {os.cpu_count()}. In-batch xMoCo queue: {in_batch_queue}.",
        timing.protocol_line(args.repeat, list(steps)),
        "",
        reporting.markdown_table(["system", "seconds per step, median (range)", "ratio vs dpr (range)"],
                                 timing.comparison_rows(per_step, reference="dpr", spec=".3f")),
        "",
        f"- the queue's cost, `{big}` / `xmoco-in-batch`: {timing.fmt_ratio(queue_cost)} (aim: within 10%)",
        f"- xMoCo's whole cost, `{big}` / `dpr`: {timing.fmt_ratio(xmoco_cost)} (the slow encoders' forward "
        "passes, no backward)",
        "",
        *([f"- peak GPU memory allocated during a system's steps (all three systems' weights and optimizer "
           "states resident): " + ", ".join(f"{k} {v:.2f} GiB" for k, v in peak_gib.items()), ""]
          if args.device == "cuda" else []),
        "per-step seconds by repeat: " + "; ".join(
            f"{k} " + ", ".join(f"{x / spr:.3f}" for x in v) for k, v in seconds.items()),
    ]
    report = "\n".join(lines)
    print(report)
    if args.out:
        reporting.write_report(Path(args.out), report)
    result = {"args": vars(args), "seconds": seconds, "peak_gib": peak_gib, "losses": losses, "queue_cost": vars(queue_cost),
              "xmoco_cost": vars(xmoco_cost)}
    if args.json:
        reporting.write_json(Path(args.json), result)
    return result


if __name__ == "__main__":
    main()
