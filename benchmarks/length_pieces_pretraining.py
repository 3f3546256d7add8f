"""Length pieces for pre-training: the coCondenser step (paper 002, the query as context) with its
padded spans encoded whole against the same step encoding them in length-sorted pieces of N rows
(models/length_pieces.py; a `pretrain:` entry's `length_pieces`, tasks/pretrain/stages.py), one run.

    HF_HUB_OFFLINE=1 python benchmarks/length_pieces_pretraining.py [--pieces 8] [--batch-size 16] \
        [--repeat 5] [--steps-per-repeat 2] [--warmup 1] [--query-length 32] [--passage-length 144] \
        [--threads 2] [--device cpu|cuda] [--bf16 auto|on|off] [--model minilm] [--out FILE]

The step is the study's pre-training step (configs/study-query-as-context.yaml, pretrain
cocondenser): all-MiniLM-L6-v2, one shared tower, `CoCondenserLoss` with the paper's defaults
(encoder MLM and Condenser-head MLM on both spans at a 15% mask rate, in-batch contrastive loss
between them, [CLS]), --batch-size passages with a question each as the context (the stand-in for
a generated query: the same kind of text), tokenised by the trainer's Collator at most
--query-length / --passage-length tokens (paper 002 section 4.1: passages of 144), padded to each
batch's longest; AdamW (lr --lr) over the encoder and the heads; bf16 autocast where
tasks/training/precision.py turns it on. Passages and questions as benchmarks/length_pieces.py
draws them (DPR 100-word passages of the SQuAD articles, with their title). Systems, each on its
own copy of the same weights and heads, masking the same tokens step by step: `whole batches` (the
peer: the coCondenser and Tevatron pre-training code pads a batch once) and `pieces of N` for each
N in --pieces. Before timing, one batch's loss terms in eval mode without autocast, whole and in
pieces: the largest absolute difference. Timing, ratios and the padding share as in
benchmarks/length_pieces.py (benchmarks/timing.py's alternated protocol).
"""
from __future__ import annotations

import copy
import os
import random
from pathlib import Path

import _bootstrap  # noqa: E402,F401  (puts the project on sys.path)
import reporting  # noqa: E402
import timing  # noqa: E402
from _step_args import add_step_arguments  # noqa: E402
from length_pieces import (TABLE_HEAD, WHOLE, device_and_autocast, draw_examples, encoded_tokens,  # noqa: E402
                           passages_and_questions, pieces_name, pieces_parser, publish, rows_of, run_description,
                           step_lines, time_systems, timing_rows)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

HEADS_SEED = 0


def main(argv=None) -> dict:
    ap = pieces_parser(__doc__, pieces="8")
    add_step_arguments(ap, steps_per_repeat=2, passage_length=144, lr=1e-4, bf16_choice=True,
                       passage_help="passage tokens (paper 002 section 4.1: 144)")
    args = ap.parse_args(argv)
    pieces = rows_of(args)

    torch.set_num_threads(args.threads)
    from models import BiEncoder, resolve_checkpoint
    from models.length_pieces import encoding_in_pieces
    from models.pretraining import CoCondenserLoss
    from tasks.training import Collator
    from transformers import AutoTokenizer

    device, bf16, autocast = device_and_autocast(args)
    bs, spr = args.batch_size, args.steps_per_repeat

    def make_loss(model):
        torch.manual_seed(HEADS_SEED)   # the same heads for every system
        return CoCondenserLoss(model)

    passages, questions = passages_and_questions(Path(args.squad))
    tokenizer = AutoTokenizer.from_pretrained(resolve_checkpoint(args.model))
    collator = Collator(tokenizer, args.query_length, args.passage_length, 0, seed=args.seed)
    rng = random.Random(args.seed)
    batches = []
    for _ in range(args.warmup + args.repeat * spr):
        b = collator(draw_examples(passages, questions, bs, 0, rng))
        batches.append(tuple({k: v.to(device) for k, v in x.items()} for x in (b.queries, b.positives)))
    timed_batches = batches[args.warmup:]
    base = BiEncoder.from_pretrained(args.model, pooling="cls")
    rows = {WHOLE: None, **{pieces_name(n): n for n in pieces}}

    check = copy.deepcopy(base).to(device).eval()   # the same terms: eval mode (no dropout), no autocast
    check_loss = make_loss(check).to(device).eval()
    max_abs_diff, whole = {}, None
    with torch.no_grad():
        for name, n in rows.items():
            check_loss.step = 0   # the same masks
            with encoding_in_pieces(check_loss, n):
                check_loss(*batches[0])
            terms = {k: float(v) for k, v in check_loss.last_terms.items()}
            whole = whole or terms
            if n is not None:
                max_abs_diff[name] = max(abs(terms[k] - whole[k]) for k in whole)
    del check, check_loss

    seconds, losses = time_systems(base, rows, make_loss, batches, args, autocast, device)
    del base

    def padding_share(kind: int, n: int | None) -> float:
        found = [batch[kind]["attention_mask"].cpu() for batch in timed_batches]
        encoded = sum(encoded_tokens(m, n) for m in found)
        return (encoded - sum(int(m.sum()) for m in found)) / encoded

    padding = {name: {"passage_padding_share": padding_share(1, n), "context_padding_share": padding_share(0, n)}
               for name, n in rows.items()}
    table, _, speedup = timing_rows(rows, seconds, spr, lambda name: [
        f"{100 * padding[name]['passage_padding_share']:.1f}%", f"{100 * padding[name]['context_padding_share']:.1f}%"])
    hw = reporting.device_name(args.device)
    lines = [
        reporting.header("Length pieces: a coCondenser pre-training step, whole batches against length-sorted pieces",
                         __file__, argv, env="HF_HUB_OFFLINE=1"),
        f"model {args.model}, shared tower, [CLS]; `CoCondenserLoss` (MLM and head MLM on both spans, mask rate "
        f"0.15, contrastive between them); batch {bs} passages, a question each as the context; DPR 100-word "
        f"passages with their title; context/passage tokens at most {args.query_length}/{args.passage_length}, "
        f"padded to each batch's longest; AdamW lr {args.lr:g} over the encoder and the heads; {args.warmup} "
        f"warm-up step(s), then {spr} step(s) per system per repeat, new batches every step (seed {args.seed}); "
        + run_description(args, hw, bf16),
        timing.protocol_line(args.repeat, list(rows)),
        "",
        reporting.markdown_table([*TABLE_HEAD, "passage padding share", "context padding share"], table),
        "",
        "- padding share: padded tokens / all tokens encoded over the timed steps' passage (or context) "
        "batches, whole batches padded to their longest row, pieces to theirs",
        "- the same loss: one batch's terms in eval mode without autocast, largest absolute difference from "
        "the whole batch's: " + ", ".join(f"{name} {d:.1e}" for name, d in max_abs_diff.items()),
        "",
        *step_lines(seconds, losses, spr),
    ]
    return publish(args, lines, hw, bf16, seconds, speedup, padding=padding, max_abs_diff=max_abs_diff, losses=losses)


if __name__ == "__main__":
    main()
