"""Pre-training throughput: passages/s of a step of each query-as-context form (paper 002) and of
the passage-passage baseline against the plain contrastive step, same model, same batch, one run.

    HF_HUB_OFFLINE=1 python benchmarks/pretraining_throughput.py [--model minilm] [--batch-size 16] \
        [--repeat 5] [--steps-per-repeat 1] [--warmup 1] [--query-length 32] [--passage-length 144] \
        [--threads 2] [--device cpu|cuda] [--bf16] [--random-init] [--out result.json]

Systems (each its own copy of the same weights, AdamW lr 1e-4):
- `contrastive` (the reference): `InBatchSoftmaxLoss` over (query, passage) pairs, no hard
  negatives: the fine-tuning step with in-batch negatives only.
- `cocondenser`: `CoCondenserLoss` over the same pairs (encoder MLM and Condenser-head MLM on
  both spans, contrastive loss between them; section 2.1 with the query as context).
- `cotmae`: `CotMaeLoss` over the same pairs (encoder MLM on the passage, the decoder
  reconstructing the query from the passage's [CLS]; section 2.2).
- `passage-passage`: `CoCondenserLoss` with another paragraph of the same article as the context
  (the baseline; the context is passage-long, --passage-length tokens).
The pairs are SQuAD's: the passage a paragraph as (title, text), the query one of its questions
(the stand-in for a generated query: the same kind of text). A step is the trainer's: collate
(tokenise, pad per batch), forward, loss, backward, optimizer step, zero_grad.

Timing (benchmarks/timing.py): --warmup untimed steps per system, then --repeat repeats, the
systems alternated with the order swapped each repeat, each running --steps-per-repeat steps on
that repeat's batches (the same for every system). passages/s per repeat = batch_size *
steps_per_repeat / seconds; median (min-max), and the ratio of medians against `contrastive` with
its range ("parity" where the ranges overlap). --random-init builds the model from the
checkpoint's config with random weights (throughput only; for machines without the weights).
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
from _shared import squad_articles  # noqa: E402
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


def squad_pairs(path: Path, n: int) -> list[tuple[str, tuple[str, str], str]]:
    """(question, (title, paragraph), another paragraph of the article), one per paragraph, `n`
    of them (cycling through the file when it has fewer)."""
    out = []
    for article in squad_articles(path):
        paras = [p for p in article.paragraphs if p.questions]
        for i, para in enumerate(paras):
            if len(paras) > 1:
                out.append((para.questions[0]["question"], (article.title, para.context), paras[(i + 1) % len(paras)].context))
            if len(out) >= n:
                return out
    if not out:
        raise SystemExit(f"{path} has no article with two paragraphs")
    return [out[i % len(out)] for i in range(n)]  # fewer paragraphs than needed: later batches repeat them


def build_model(name: str, random_init: bool):
    from models import BiEncoder, resolve_checkpoint
    from models.bi_encoder import BiEncoderConfig

    if not random_init:
        return BiEncoder.from_pretrained(name, pooling="cls")
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    ref = resolve_checkpoint(name)
    encoder = AutoModel.from_config(AutoConfig.from_pretrained(ref))
    return BiEncoder(encoder, None, BiEncoderConfig(shared=True, pooling="cls"), tokenizer=AutoTokenizer.from_pretrained(ref))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--squad", default=str(DEFAULT_SQUAD))
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--batch-size", type=int, default=16)
    add_step_arguments(ap, passage_length=144, lr=1e-4, passage_help="passage tokens (paper 002 section 4.1: 144)")
    ap.add_argument("--random-init", action="store_true", help="the checkpoint's architecture with random weights")
    ap.add_argument("--systems", default="contrastive,cocondenser,cotmae,passage-passage")
    ap.add_argument("--out")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    from models import InBatchSoftmaxLoss
    from models.pretraining import CoCondenserLoss, CotMaeLoss
    from tasks.training.data import Collator

    device, bs, spr = args.device, args.batch_size, args.steps_per_repeat
    n_steps = args.warmup + args.repeat * spr
    pairs = squad_pairs(Path(args.squad), bs * n_steps)
    batches = [pairs[i * bs:(i + 1) * bs] for i in range(n_steps)]
    autocast = ((lambda: torch.autocast(device_type=device, dtype=torch.bfloat16)) if args.bf16
                else contextlib.nullcontext)
    builders = {"contrastive": InBatchSoftmaxLoss, "cocondenser": CoCondenserLoss, "cotmae": CotMaeLoss,
                "passage-passage": CoCondenserLoss}
    names = [s for s in args.systems.split(",") if s]
    if "contrastive" not in names or set(names) - set(builders):
        raise SystemExit(f"--systems: a subset of {list(builders)} holding contrastive (the reference)")

    steps = {}
    for name in names:
        torch.manual_seed(0)  # the same weights for every system (the heads aside)
        model = build_model(args.model, args.random_init).to(device).train()
        loss_fn = builders[name](model).to(device).train()
        params = list(dict.fromkeys(list(model.parameters()) + list(loss_fn.parameters())))
        optimizer = torch.optim.AdamW(params, lr=args.lr)
        context_len = args.passage_length if name == "passage-passage" else args.query_length
        collator = Collator(model.tokenizer, context_len, args.passage_length)

        def step(batch, name=name, loss_fn=loss_fn, optimizer=optimizer, collator=collator):
            contexts = [c for _, _, c in batch] if name == "passage-passage" else [q for q, _, _ in batch]
            q = {k: v.to(device) for k, v in collator.encode_queries(contexts).items()}
            p = {k: v.to(device) for k, v in collator.encode_passages([p for _, p, _ in batch]).items()}
            return optimizer_step(loss_fn, (q, p), optimizer, autocast)

        steps[name] = step

    sync = torch.cuda.synchronize if device == "cuda" else None
    seconds, losses = alternate_steps(steps, batches, args.warmup, spr, args.repeat, sync)
    summaries = {name: timing.summarize(timing.rates(bs * spr, seconds[name])) for name in steps}
    hw = reporting.device_name(device)
    print(reporting.header(f"Pre-training throughput (SQuAD {args.squad})", __file__, argv))
    print(f"model {args.model}{' (random init)' if args.random_init else ''}; batch {bs} passages; query/passage "
          f"tokens {args.query_length}/{args.passage_length} (passage-passage contexts {args.passage_length}); "
          f"{args.warmup} warm-up step(s), then {spr} step(s) per system per repeat; torch threads "
          f"{torch.get_num_threads()}; device {device} ({hw}); {'bf16 autocast' if args.bf16 else 'fp32'}; "
          f"torch {torch.__version__}; os.cpu_count() {os.cpu_count()}")
    print(timing.protocol_line(args.repeat, list(steps)) + "\n")
    print(reporting.markdown_table(["system", "passages/s median (range)", "ratio vs contrastive (range)"],
                                timing.comparison_rows(summaries, reference="contrastive")))
    print("\nper-repeat seconds: " + "; ".join(f"{k} " + ", ".join(f"{x:.2f}" for x in v) for k, v in seconds.items()))
    print("losses (warm-up, timed...): " + "; ".join(f"{k} " + ", ".join(f"{x:.3f}" for x in v)
                                                     for k, v in losses.items()))
    result = {"args": vars(args), "seconds": seconds, "losses": losses, "device": hw,
              "passages_per_s": {k: s.values for k, s in summaries.items()},
              "ratios": {k: vars(timing.ratio(s, summaries["contrastive"])) for k, s in summaries.items()}}
    if args.out:
        reporting.write_json(Path(args.out), result)
    return result


if __name__ == "__main__":
    main()
