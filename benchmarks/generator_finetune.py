"""Generator fine-tuning on the CPU (tasks/qgen/finetune.py): the time of an optimizer step and the
dev loss it reaches, ours against the model's own loss, same run, steps interleaved.

    HF_HUB_OFFLINE=1 python benchmarks/generator_finetune.py [--generator smollm2] [--batch-size 8] \
        [--steps-per-repeat 2] [--repeat 5] [--lr 1e-4] [--top-layers 15] [--threads 2] \
        [--systems model-loss,ours,ours-bf16] [--out r.json]

Pairs: SQuAD dev (the embedded default's data), ((title, paragraph), its first question); train
pairs from the first 40 articles, dev pairs (48) from the last 8, as the demo's article split does
(160 train pairs, 48 dev pairs, batches of 8). Systems, each its own copy of the model and AdamW
(constant --lr, clipping at 1.0), all fed the same batches in the same order:
  model-loss  the peer: `model(**batch, labels=labels).loss`, transformers' causal-LM loss (the
              vocabulary projection at every position)
  ours        `QueryGenerator.loss` (models/generator.py): the projection at the question's
              tokens only, the same loss and gradients
  ours-top-N  ours with the embeddings (tied to the output layer) and all but the top N
              transformer layers frozen: the backward pass stops below layer L-N
  ours-lora   ours through a LoRA adapter (peft, r 16, alpha 32, every linear layer of the
              blocks), when peft imports; peft is not a project dependency
  ours-bf16   ours under torch's CPU bf16 autocast, as the trainer runs `bf16: on` (fast where the
              CPU has bf16 units: AMX or avx512_bf16; emulated elsewhere)
--systems picks some of them (model-loss, the peer, always runs).
Timing (benchmarks/timing.py): one untimed warm-up step each, then --repeat rounds of
--steps-per-repeat steps per system, alternated; reported as seconds per step, median (min-max),
and the ratio of medians against model-loss. Quality: each system's dev loss (ours, eval mode)
before training and after its last step; the systems differ in what they train, not in how the
dev loss is computed.
"""
from __future__ import annotations

import argparse
import copy
import os
from pathlib import Path

from _bootstrap import DEFAULT_SQUAD  # noqa: E402  (puts the project on sys.path)
import reporting  # noqa: E402
import timing  # noqa: E402
from _shared import squad_articles  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


def squad_pairs(path: Path, train_articles: int = 40, dev_articles: int = 8, dev_pairs: int = 48):
    """(train pairs, dev pairs): ((title, paragraph), first question) per paragraph."""
    data = squad_articles(path)

    def pairs(articles):
        return [((a.title, p.context), p.questions[0]["question"])
                for a in articles for p in a.paragraphs if p.questions]
    return pairs(data[:train_articles]), pairs(data[-dev_articles:])[:dev_pairs]


def freeze_below(model, top_layers: int) -> None:
    """Only the top `top_layers` decoder layers and the final norm train."""
    for p in model.parameters():
        p.requires_grad_(False)
    layers = model.model.layers
    for module in [*layers[len(layers) - top_layers:], model.model.norm]:
        for p in module.parameters():
            p.requires_grad_(True)


def with_lora(model):
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        return None
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    # the adapted model itself (LoRA layers injected, only they train): ours' loss reads its
    # base_model and output embeddings as it does the plain model's
    return get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=targets)).get_base_model()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--generator", default="smollm2")
    ap.add_argument("--squad", default=str(DEFAULT_SQUAD))
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps-per-repeat", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-4, help="the demo's qgen.finetune.lr")
    ap.add_argument("--top-layers", type=int, default=15, help="ours-top-N: how many top layers train")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-source-len", type=int, default=256)
    ap.add_argument("--systems", default="all", help="comma-separated systems besides model-loss (default all: "
                                                      "ours, ours-top-N, ours-lora, ours-bf16)")
    timing.add_repeat_argument(ap)
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from models.generator import load_generator

    base = load_generator(args.generator)
    if base.kind != "causal":
        raise SystemExit(f"{args.generator}: a causal generator is what this compares")
    train, dev = squad_pairs(Path(args.squad))
    needed = args.batch_size * args.steps_per_repeat * (args.repeat + 1)
    if len(train) < needed:
        raise SystemExit(f"{len(train)} train pairs, {needed} needed")

    def batch_of(pairs):
        return base.training_batch([p for p, _ in pairs], [q for _, q in pairs], args.max_source_len)

    systems: dict[str, dict] = {}
    wanted = None if args.systems == "all" else {"model-loss", *args.systems.split(",")}

    def add(name, model, loss_fn, bf16=False):
        if wanted is not None and name not in wanted:
            return
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        systems[name] = {"model": model, "loss": loss_fn, "params": params, "bf16": bf16,
                         "optimizer": torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0),
                         "trainable": sum(p.numel() for p in params)}

    def ours_loss(model):
        generator = copy.copy(base)
        generator.model = model
        return generator.loss

    def model_loss(model):
        return lambda batch: model(**batch).loss

    torch.manual_seed(0)
    peer = copy.deepcopy(base.model)
    add("model-loss", peer, model_loss(peer))
    mine = copy.deepcopy(base.model)
    add("ours", mine, ours_loss(mine))
    top = copy.deepcopy(base.model)
    freeze_below(top, args.top_layers)
    add(f"ours-top-{args.top_layers}", top, ours_loss(top))
    lora = with_lora(copy.deepcopy(base.model))
    lora_note = "ran" if lora is not None else "peft is not installed: skipped"
    if lora is not None:
        add("ours-lora", lora, ours_loss(lora))
    half = copy.deepcopy(base.model)
    add("ours-bf16", half, ours_loss(half), bf16=True)

    cursor = {name: 0 for name in systems}
    losses: dict[str, list[float]] = {name: [] for name in systems}  # each step's training loss

    def step(name):
        s = systems[name]
        at = cursor[name]
        chunk = train[at * args.batch_size:(at + 1) * args.batch_size]
        cursor[name] += 1
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=s["bf16"]):
            loss = s["loss"](batch_of(chunk))
        s["optimizer"].zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(s["params"], 1.0)
        s["optimizer"].step()
        losses[name].append(float(loss.detach()))
        return losses[name][-1]

    def dev_loss(name):
        s = systems[name]
        s["model"].eval()
        total = 0.0
        with torch.no_grad():
            for start in range(0, len(dev), args.batch_size):
                chunk = dev[start:start + args.batch_size]
                total += float(ours_loss(s["model"])(batch_of(chunk))) * len(chunk)
        s["model"].train()
        return total / len(dev)

    before = dev_loss("model-loss")
    for name in systems:  # warm-up: one step each, untimed (the same first batch for all)
        step(name)
    seconds, _ = timing.alternate(
        {name: (lambda r, n=name: [step(n) for _ in range(args.steps_per_repeat)]) for name in systems}, args.repeat)
    per_step = {n: [x / args.steps_per_repeat for x in s] for n, s in seconds.items()}
    # seconds per step: the peer's rate over ours is the speed-up, so rank by steps per second
    summaries = {n: timing.summarize(timing.rates(1.0, s)) for n, s in per_step.items()}
    after = {name: dev_loss(name) for name in systems}
    steps = args.steps_per_repeat * args.repeat + 1
    rows = []
    for row in timing.comparison_rows(summaries, "model-loss", spec=".3f"):
        name = row[0]
        sec = timing.summarize(per_step[name])
        rows.append([name, f"{systems[name]['trainable'] / 1e6:.1f}M", timing.fmt_summary(sec, ".2f"), row[2],
                     f"{after[name]:.4f}"])
    table = reporting.markdown_table(["system", "trainable", "s / step", "speed vs model-loss", f"dev loss after {steps} steps"], rows)
    lengths = [len(x) for x in base.prompt_ids([p for p, _ in train[:needed]], args.max_source_len)]
    header = (reporting.header(f"Generator fine-tuning step ({args.generator})", __file__, argv) + "\n"
              f"torch {torch.__version__}, {args.threads} threads. Batches of {args.batch_size} "
              f"SQuAD dev pairs (prompt tokens mean {sum(lengths) / len(lengths):.0f}), lr {args.lr} constant, "
              f"{args.repeat} repeats of {args.steps_per_repeat} steps after one warm-up step; dev loss on "
              f"{len(dev)} pairs of held-out articles, {before:.4f} before training. LoRA: {lora_note}.\n\n"
              + timing.protocol_line(args.repeat, list(systems)) + "\n\n")
    report = header + table + "\n"
    print(report)
    result = {"report": report, "dev_loss_before": before, "dev_loss_after": after, "train_losses": losses,
              "seconds_per_step": per_step, "cpu": reporting.cpu_name()}
    if args.out:
        reporting.write_json(Path(args.out), result)
    return result


if __name__ == "__main__":
    main()
