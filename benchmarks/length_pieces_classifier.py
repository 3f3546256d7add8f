"""Length pieces for the classifier: the cross-encoder trainer's step with its padded batch of
(question, passage) pairs encoded whole against the same step in length-sorted pieces of N rows
(models/length_pieces.py; the classifier's `train.length_pieces`, tasks/silver/classifier.py), one run.

    HF_HUB_OFFLINE=1 python benchmarks/length_pieces_classifier.py [--pieces 8] [--batch-size 16] \
        [--repeat 5] [--steps-per-repeat 2] [--warmup 1] [--passage-length 256] [--threads 2] \
        [--device cpu|cuda] [--bf16 auto|on|off] [--model minilm] [--out FILE]

The step is the study's classifier step (configs/study.yaml, cross_encoder): all-MiniLM-L6-v2 with
a fresh one-logit head (`CrossEncoderModel.from_base`), binary cross-entropy, --batch-size pairs
tokenised as the trainer's PairCollator does (`model.collate`: question and passage text as one
pair, truncated longest-first at --passage-length tokens, padded to the batch's longest), half of
them a question with the passage holding its answer (label 1), half with a random passage of
another article (label 0); forward and loss under bf16 autocast where tasks/training/precision.py
turns it on, backward, AdamW step, zero_grad. Passages and questions as benchmarks/length_pieces.py
draws them (DPR 100-word passages of the SQuAD articles). Systems, each on its own copy of the same
weights: `whole batches` (the peer: sentence-transformers' CrossEncoder pads a batch once) and
`pieces of N` for each N in --pieces. Timing, ratios and the padding share as in
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


def labelled_pairs(passages, questions, batch_size: int, rng: random.Random) -> tuple[list[tuple[str, str]], list[int]]:
    """`batch_size` (question, passage text) pairs: the first half positives, the rest negatives."""
    examples = draw_examples(passages, questions, batch_size, 1, rng)
    half = batch_size // 2
    pairs = [(e.query, e.positive[1]) for e in examples[:half]] + [(e.query, e.negatives[0][1]) for e in examples[half:]]
    return pairs, [1] * half + [0] * (batch_size - half)


def main(argv=None) -> dict:
    ap = pieces_parser(__doc__, pieces="8")
    add_step_arguments(ap, steps_per_repeat=2, passage_length=256, lr=1e-4,
                       passage_help="tokens of question and passage together", bf16_choice=True)
    args = ap.parse_args(argv)
    pieces = rows_of(args)

    torch.set_num_threads(args.threads)
    from models.cross_encoder import BinaryCrossEntropyLoss, CrossEncoderModel
    from models.length_pieces import encoding_in_pieces

    device, bf16, autocast = device_and_autocast(args)
    bs, spr = args.batch_size, args.steps_per_repeat

    torch.manual_seed(0)
    base = CrossEncoderModel.from_base(args.model, max_length=args.passage_length)
    passages, questions = passages_and_questions(Path(args.squad))
    rng = random.Random(args.seed)
    batches = []
    for _ in range(args.warmup + args.repeat * spr):
        pairs, labels = labelled_pairs(passages, questions, bs, rng)
        features = {k: v.to(device) for k, v in base.collate(pairs).items()}
        batches.append((features, torch.tensor(labels, dtype=torch.float32, device=device)))
    timed_batches = batches[args.warmup:]
    rows = {WHOLE: None, **{pieces_name(n): n for n in pieces}}

    check = copy.deepcopy(base).to(device).eval()   # the same logits: eval mode, no autocast
    with torch.no_grad():
        whole = check(batches[0][0])
        max_abs_diff = {}
        for name, n in rows.items():
            if n is not None:
                with encoding_in_pieces(check, n):
                    max_abs_diff[name] = float((check(batches[0][0]) - whole).abs().max())
    del check

    seconds, losses = time_systems(base, rows, BinaryCrossEntropyLoss, batches, args, autocast, device)
    del base

    masks = [features["attention_mask"].cpu() for features, _ in timed_batches]
    real = sum(int(m.sum()) for m in masks)
    padding = {name: 1 - real / sum(encoded_tokens(m, n) for m in masks) for name, n in rows.items()}
    table, _, speedup = timing_rows(rows, seconds, spr, lambda name: [f"{100 * padding[name]:.1f}%"])
    hw = reporting.device_name(args.device)
    lines = [
        reporting.header("Length pieces: a classifier training step, whole batches against length-sorted pieces",
                         __file__, argv, env="HF_HUB_OFFLINE=1"),
        f"model {args.model} with a fresh one-logit head; binary cross-entropy; batch {bs} (question, passage) "
        f"pairs, half positive; DPR 100-word passages; at most {args.passage_length} tokens a pair, padded to each "
        f"batch's longest; AdamW lr {args.lr:g}; {args.warmup} warm-up step(s), then {spr} step(s) per system per "
        f"repeat, new batches every step (seed {args.seed}); " + run_description(args, hw, bf16),
        timing.protocol_line(args.repeat, list(rows)),
        "",
        reporting.markdown_table([*TABLE_HEAD, "padding share"], table),
        "",
        "- padding share: padded tokens / all tokens encoded over the timed steps' batches",
        "- the same logits: one batch in eval mode without autocast, largest absolute difference from the whole "
        "batch's: " + ", ".join(f"{name} {d:.1e}" for name, d in max_abs_diff.items()),
        "",
        *step_lines(seconds, losses, spr),
    ]
    return publish(args, lines, hw, bf16, seconds, speedup, padding=padding, max_abs_diff=max_abs_diff, losses=losses)


if __name__ == "__main__":
    main()
