"""Length pieces: the dense trainer's step with its padded batches encoded whole against the same
step encoding them in length-sorted pieces of N rows, each cut to its own longest row
(models/length_pieces.py; a dense system's `length_pieces`, tasks/training/stages.py), one run.

    HF_HUB_OFFLINE=1 python benchmarks/length_pieces.py [--pieces 4,8,16] [--batch-size 16] \
        [--hard-negatives 2] [--repeat 5] [--steps-per-repeat 2] [--warmup 1] [--query-length 64] \
        [--passage-length 256] [--threads 2] [--device cpu|cuda] [--bf16 auto|on|off] [--model minilm] \
        [--out benchmarks/results/length_pieces_cpu.md]

The step is the pipeline's dense trainer as the study runs it: all-MiniLM-L6-v2 (alias 'minilm'),
one shared tower, mean pooling, l2 normalisation, logit scale 20; `WeightedInBatchSoftmaxLoss`
(loss 'weighted', every weight 1) over --batch-size questions, their positives and
--hard-negatives negatives each; AdamW (lr --lr); bf16 autocast where tasks/training/precision.py
turns it on (--bf16 auto: CUDA, and CPUs with bf16 units, models/cpu_features.py). A step: forward
and loss under the autocast, backward, optimizer step, zero_grad (the trainer also clips the
gradients and steps its schedule: the same for every system, left out).

Passages have the pipeline's lengths: each SQuAD article (--squad, read by tasks.readers.squad)
cut into DPR's 100-word passages by the project's chunker (tasks.chunking.chunk_document), each
with its article's title. A question's positive is the passage holding its answer (else a passage
of its article); its negatives are random passages of other articles. The batches are collated
beforehand by the trainer's Collator (tasks/training/data.py: `tokenizer(titles, texts)`,
truncated to --passage-length / --query-length, padded to each batch's longest), drawn afresh for
every step (seeded), the same batches for every system.

Systems, each on its own copy of the same weights with its own optimizer:
- `whole batches` (the reference; the named peer: sentence-transformers and Tevatron pad a batch
  once and encode it whole): rows_per_piece None;
- `pieces of N` for each N in --pieces: the trainer's `encoding_in_pieces(loss, N)` for the whole
  run (the report marks the pipeline's CPU default, `length_pieces: auto`).
The padding share of each system is padded tokens / all tokens encoded over the timed steps'
passage batches (positives and negatives), from the attention masks and the pieces
models.length_pieces.length_pieces cuts: what the pieces save. Before timing, one batch is encoded
in eval mode without autocast whole and in pieces: the largest absolute difference between the
vectors (the pieces' vectors are the whole batch's, to float rounding).

Timing (benchmarks/timing.py): --warmup untimed steps per system, then --repeat repeats, each
running --steps-per-repeat steps per system on that repeat's batches, the systems alternated with
the order swapped every repeat; seconds per step as median (min-max), and the speed-up over
`whole batches` as the ratio of the median steps/s with its range ("parity" where the ranges overlap).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import os
import random
from pathlib import Path

from _bootstrap import DEFAULT_SQUAD  # noqa: E402  (puts the project on sys.path)
import reporting  # noqa: E402
import timing  # noqa: E402
from _step_args import add_step_arguments, alternate_steps, optimizer_step  # noqa: E402
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

SCALE = 20.0
WHOLE = "whole batches"


def pieces_name(n: int) -> str:
    return f"pieces of {n}"


def passages_and_questions(path: Path) -> tuple[list[dict], list[tuple[str, int]]]:
    """The file's 100-word passages (the chunker's records, articles in file order) and its
    questions as (question, index of its positive passage): the passage holding the first
    answer's start, else the article's first passage."""
    from tasks.chunking import chunk_document
    from tasks.readers.squad import iter_squad_documents, iter_squad_questions

    passages: list[dict] = []
    by_doc: dict[str, list[int]] = {}
    for doc in iter_squad_documents(path):
        for chunk in chunk_document(doc):
            by_doc.setdefault(doc["doc_id"], []).append(len(passages))
            passages.append(chunk)
    questions = []
    for q in iter_squad_questions(path):
        mine = by_doc.get(q["doc_id"])
        if not mine:
            continue
        start = q["answer_spans"][0]["start"] if q["answer_spans"] else -1
        holding = [i for i in mine if passages[i]["char_start"] <= start < passages[i]["char_end"]]
        questions.append((q["question"], holding[0] if holding else mine[0]))
    if len(by_doc) < 2:
        raise SystemExit(f"{path}: negatives come from other articles, and it holds {len(by_doc)}")
    return passages, questions


def draw_examples(passages: list[dict], questions: list[tuple[str, int]], batch_size: int,
                  hard_negatives: int, rng: random.Random):
    """One step's TrainExamples: `batch_size` questions with distinct positives (the trainer's
    sampler keeps a positive once per batch), each with `hard_negatives` random passages of other
    articles that are no positive of the batch."""
    from tasks.training import TrainExample

    order = rng.sample(range(len(questions)), len(questions))
    chosen, positives = [], set()
    for i in order:
        if questions[i][1] not in positives:
            chosen.append(i)
            positives.add(questions[i][1])
        if len(chosen) == batch_size:
            break
    if len(chosen) < batch_size:
        raise SystemExit(f"only {len(chosen)} distinct positive passages, batch {batch_size}")
    examples = []
    for i in chosen:
        query, pos = questions[i]
        doc = passages[pos]["doc_id"]
        negatives = []
        while len(negatives) < hard_negatives:
            j = rng.randrange(len(passages))
            if passages[j]["doc_id"] != doc and j not in positives and j not in negatives:
                negatives.append(j)
        as_pair = lambda k: (passages[k]["title"], passages[k]["text"])  # noqa: E731
        examples.append(TrainExample(qid=f"q{i}", query=query, positive=as_pair(pos), positive_id=str(pos),
                                     negatives=[as_pair(k) for k in negatives]))
    return examples


def encoded_tokens(mask: torch.Tensor, rows_per_piece: int | None) -> int:
    """Tokens the encoder reads for one padded batch: rows x columns whole, or the sum over the
    pieces of their rows x their longest row."""
    from models.length_pieces import length_pieces

    pieces = length_pieces(mask, rows_per_piece)
    if pieces is None:
        return mask.numel()
    return sum(len(rows) * length for rows, length in pieces)


def pieces_parser(doc: str, pieces: str) -> argparse.ArgumentParser:
    """The options the length-pieces scripts share (their steps' own come after)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--squad", default=str(DEFAULT_SQUAD))
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--pieces", default=pieces, help="rows per piece of each pieces system, comma-separated")
    ap.add_argument("--seed", type=int, default=0, help="seeds the batches")
    ap.add_argument("--out", help="write the Markdown report here, and its JSON beside it")
    return ap


def rows_of(args) -> list[int]:
    pieces = sorted({int(x) for x in args.pieces.split(",") if x.strip()})
    if not pieces or min(pieces) < 1:
        raise SystemExit(f"--pieces: rows per piece from 1, got {args.pieces!r}")
    return pieces


def step_times(seconds: dict[str, list[float]], steps_per_repeat: int) -> tuple[dict, dict]:
    """(seconds per step by system, steps/s of each system over the whole batches' as a ratio)."""
    per_step = {name: timing.summarize([s / steps_per_repeat for s in v]) for name, v in seconds.items()}
    per_s = {name: timing.summarize(timing.rates(steps_per_repeat, v)) for name, v in seconds.items()}
    return per_step, {name: timing.ratio(per_s[name], per_s[WHOLE]) for name in seconds}


def time_systems(base, rows: dict[str, int | None], make_loss, batches: list, args, autocast, device):
    """(seconds per repeat, losses) by system: each system trains its own copy of `base` with its
    own AdamW, its models cutting their batches into its pieces for the whole run (as the trainers
    do), the systems alternated over the same batches (_step_args.alternate_steps)."""
    from models.length_pieces import encoding_in_pieces

    steps, stack = {}, contextlib.ExitStack()
    for name, n in rows.items():
        model = copy.deepcopy(base).to(device).train()
        loss_fn = make_loss(model).to(device).train()
        # the loss's own parameters too (the pre-training heads), each once
        optimizer = torch.optim.AdamW(list(dict.fromkeys([*model.parameters(), *loss_fn.parameters()])), lr=args.lr)
        stack.enter_context(encoding_in_pieces(loss_fn, n))

        def step(batch, loss_fn=loss_fn, optimizer=optimizer):
            return optimizer_step(loss_fn, batch, optimizer, autocast)
        steps[name] = step
    with stack:
        sync = torch.cuda.synchronize if device.type == "cuda" else None
        return alternate_steps(steps, batches, args.warmup, args.steps_per_repeat, args.repeat, sync)


def device_and_autocast(args) -> tuple[torch.device, bool, object]:
    """(device, whether bf16 autocast is on, the autocast context factory) for --device and --bf16,
    the trainers' choice (tasks/training/precision.py)."""
    from tasks.training.precision import bf16_autocast, use_bf16

    device = torch.device(args.device)
    bf16 = use_bf16(args.bf16, device)
    return device, bf16, bf16_autocast(device) if bf16 else contextlib.nullcontext


TABLE_HEAD = ["system", "seconds per step, median (range)", "steps/s vs whole batches (range)"]


def timing_rows(rows: dict[str, int | None], seconds: dict[str, list[float]], steps_per_repeat: int,
                extra) -> tuple[list[list[str]], dict, dict]:
    """(the report's table rows: each system's seconds per step and speed-up over whole batches,
    the pipeline's CPU default marked, then `extra(name)`'s cells; seconds per step; speed-ups)."""
    from tasks.training.arguments import rows_per_piece

    default = rows_per_piece("auto", "cpu")
    per_step, speedup = step_times(seconds, steps_per_repeat)
    table = [[name + (" (CPU default)" if n == default else ""), timing.fmt_summary(per_step[name], ".2f"),
              "1.00x (reference)" if name == WHOLE else timing.fmt_ratio(speedup[name]), *extra(name)]
             for name, n in rows.items()]
    return table, per_step, speedup


def run_description(args, hw: str, bf16: bool) -> str:
    """Where and how a report's steps ran: device, precision, torch, threads."""
    from models.cpu_features import has_bf16_units

    return (f"device {args.device} ({hw}); {'bf16 autocast' if bf16 else 'fp32'} (--bf16 {args.bf16}; CPU bf16 "
            f"units: {'yes' if has_bf16_units() else 'no'}); torch {torch.__version__}, {torch.get_num_threads()} "
            f"threads, os.cpu_count() {os.cpu_count()}.")


def step_lines(seconds: dict[str, list[float]], losses: dict[str, list[float]], steps_per_repeat: int) -> list[str]:
    """The report's raw figures: every repeat's seconds per step, every step's loss."""
    return ["per-step seconds by repeat: " + "; ".join(
                f"{k} " + ", ".join(f"{x / steps_per_repeat:.2f}" for x in v) for k, v in seconds.items()),
            "losses (warm-up, timed...): " + "; ".join(
                f"{k} " + ", ".join(f"{x:.4f}" for x in v) for k, v in losses.items())]


def publish(args, lines: list[str], hw: str, bf16: bool, seconds: dict, speedup: dict, **fields) -> dict:
    """Prints the report, writes it (and its JSON) to --out when given, returns the result: what
    every length-pieces script measures (the arguments, device, precision, seconds per repeat, the
    speed-ups over whole batches), then the script's own `fields`."""
    result = {"args": vars(args), "device": hw, "bf16": bf16, "seconds": seconds,
              "speedup_vs_whole": {k: vars(r) for k, r in speedup.items()}, **fields}
    report = "\n".join(lines)
    print(report)
    if args.out:
        reporting.write_report(Path(args.out), report, result)
    return result


def main(argv=None) -> dict:
    ap = pieces_parser(__doc__, pieces="4,8,16")
    ap.add_argument("--hard-negatives", type=int, default=2)
    add_step_arguments(ap, steps_per_repeat=2, passage_length=256, bf16_choice=True)
    ap.set_defaults(query_length=64)
    args = ap.parse_args(argv)
    pieces = rows_of(args)

    torch.set_num_threads(args.threads)
    from models import BiEncoder, resolve_checkpoint
    from models.length_pieces import encoding_in_pieces
    from models.losses import WeightedInBatchSoftmaxLoss
    from tasks.training import Collator
    from transformers import AutoTokenizer

    device, bf16, autocast = device_and_autocast(args)
    bs, n_neg, spr = args.batch_size, args.hard_negatives, args.steps_per_repeat
    n_steps = args.warmup + args.repeat * spr

    # -- batches: drawn per step, collated once, the same for every system -----------------
    passages, questions = passages_and_questions(Path(args.squad))
    tokenizer = AutoTokenizer.from_pretrained(resolve_checkpoint(args.model))
    collator = Collator(tokenizer, args.query_length, args.passage_length, n_neg, seed=args.seed)
    rng = random.Random(args.seed)
    batches = []
    for _ in range(n_steps):
        b = collator(draw_examples(passages, questions, bs, n_neg, rng))
        batches.append(tuple(None if x is None else
                             {k: v.to(device) for k, v in x.items()} if isinstance(x, dict) else x.to(device)
                             for x in (b.queries, b.positives, b.negatives, b.weights)))
    timed_batches = batches[args.warmup:]

    # -- systems ------------------------------------------------------------------------------
    torch.manual_seed(0)
    base = BiEncoder.from_pretrained(args.model, pooling="mean", normalize=True, scale=SCALE)
    rows = {WHOLE: None, **{pieces_name(n): n for n in pieces}}

    # the equality check: one batch, eval mode, no autocast, whole against pieces
    check = copy.deepcopy(base).to(device).eval()
    q0, p0, n0, _ = batches[0]
    max_abs_diff = {}
    with torch.no_grad():
        whole = [check.encode_query(q0), check.encode_passage(p0)] + ([check.encode_passage(n0)] if n0 is not None else [])
        for name, n in rows.items():
            if n is None:
                continue
            with encoding_in_pieces(check, n):
                cut = [check.encode_query(q0), check.encode_passage(p0)] + ([check.encode_passage(n0)] if n0 is not None else [])
            max_abs_diff[name] = max(float((a - b).abs().max()) for a, b in zip(whole, cut))
    del check, whole, cut

    seconds, losses = time_systems(base, rows, WeightedInBatchSoftmaxLoss, batches, args, autocast, device)
    del base

    # -- padding: what each system encodes of the timed steps' batches ------------------------
    def masks(kind: str) -> list[torch.Tensor]:
        """The timed batches' attention masks of the questions, or of the passages (positives, negatives)."""
        picked = (0,) if kind == "questions" else (1, 2)
        return [b[i]["attention_mask"].cpu() for b in timed_batches for i in picked if b[i] is not None]

    def tokens(kind: str, n: int | None) -> tuple[int, int]:
        """(tokens encoded, real tokens) of the timed batches' questions or passages."""
        found = masks(kind)
        return sum(encoded_tokens(m, n) for m in found), sum(int(m.sum()) for m in found)

    padding = {}
    for name, n in rows.items():
        p_enc, p_real = tokens("passages", n)
        q_enc, q_real = tokens("questions", n)
        padding[name] = {"passage_tokens_encoded": p_enc, "passage_tokens_real": p_real,
                         "passage_padding_share": (p_enc - p_real) / p_enc,
                         "question_tokens_encoded": q_enc, "question_tokens_real": q_real,
                         "question_padding_share": (q_enc - q_real) / q_enc}
    lengths = torch.cat([m.sum(dim=1) for m in masks("passages")])
    n_timed = len(timed_batches)

    table, per_step, speedup = timing_rows(rows, seconds, spr, lambda name: [
        f"{100 * padding[name]['passage_padding_share']:.1f}%",
        f"{padding[name]['passage_tokens_encoded'] / n_timed:,.0f}",
        f"{100 * padding[name]['question_padding_share']:.1f}%"])

    hw = reporting.device_name(args.device)
    lines = [
        reporting.header("Length pieces: a dense training step, whole batches against length-sorted pieces",
                         __file__, argv, env="HF_HUB_OFFLINE=1"),
        f"model {args.model}, shared tower, mean pooling + l2 normalize, scale {SCALE:g}; loss weighted "
        f"(`WeightedInBatchSoftmaxLoss`, weights 1); batch {bs} questions + {bs} positives + {bs * n_neg} "
        f"negatives ({n_neg} each); DPR 100-word passages with their title; query/passage tokens at most "
        f"{args.query_length}/{args.passage_length}, padded to each batch's longest; AdamW lr {args.lr:g}; "
        f"{args.warmup} warm-up step(s), then {spr} step(s) per system per repeat, new batches every step "
        f"(seed {args.seed}); " + run_description(args, hw, bf16),
        timing.protocol_line(args.repeat, list(rows)),
        "",
        reporting.markdown_table(
            [*TABLE_HEAD, "passage padding share", "passage tokens encoded per step", "question padding share"], table),
        "",
        f"- passage lengths in the timed batches (tokens, title included): min {int(lengths.min())}, median "
        f"{int(lengths.median())}, max {int(lengths.max())}; {int(padding[WHOLE]['passage_tokens_real']) / n_timed:,.0f} "
        "real passage tokens per step",
        "- padding share: padded tokens / all tokens encoded, over the timed steps' passage batches "
        "(positives and negatives; the questions' in the last column), whole batches padded to their "
        "longest row, pieces to theirs",
        "- the same vectors: one batch encoded in eval mode without autocast, largest absolute difference "
        "from the whole batch's vectors (questions, positives, negatives): "
        + ", ".join(f"{name} {d:.1e}" for name, d in max_abs_diff.items()),
        "",
        *step_lines(seconds, losses, spr),
    ]
    return publish(args, lines, hw, bf16, seconds, speedup,
                   seconds_per_step={k: s.values for k, s in per_step.items()},
                   padding=padding, max_abs_diff=max_abs_diff, losses=losses)


if __name__ == "__main__":
    main()
