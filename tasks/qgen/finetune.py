"""Fine-tune a question generator (models/generator.py's QueryGenerator) on (passage -> question)
pairs of the train split, through the bi-encoder trainer's machinery (tasks/training/trainer.py):
AdamW groups, linear warm-up then decay, clipping, bf16 autocast (CUDA, CPUs with bf16 units), resumable
checkpoints under out_dir/checkpoints/step-XXXXXXX and the best model by dev loss in out_dir/best.

The dev loss is the generator's mean token loss over the dev articles' pairs (pairs-weighted mean
of the batch losses), in eval mode and without touching the training's random stream. The
generator object keeps the last step's weights; out_dir/best holds the best ones (step 0, the
untrained model, can win).
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import shutil
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch
from pydantic import Field

from storage.atomic import TMP_DIR_PREFIX, atomic_dir
from tasks.compute.device import resolve_device
from tasks.training.data import epoch_order
from tasks.training.trainer import (
    CHECKPOINTS,
    STATE_NAME,
    ScheduleArgs,
    bf16_autocast,
    latest_checkpoint,
    list_checkpoints,
    optimizer_and_schedule,
    rng_states,
    seed_everything,
    set_rng_states,
    use_bf16,
)

log = logging.getLogger(__name__)

Pair = tuple[tuple[Optional[str], str], str]  # ((title, text), question)


class GeneratorTrainArgs(ScheduleArgs):
    """Settings of a generator fine-tuning run (the device is an argument of the call)."""

    lr: float = Field(1e-4, gt=0, description="peak learning rate (AdamW)")
    batch_size: int = Field(8, ge=1, description="pairs per optimizer step")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay (none on biases and LayerNorm)")
    max_grad_norm: Optional[float] = Field(1.0, ge=0, description="gradient clipping norm; empty or 0: no clipping")
    max_source_len: int = Field(256, ge=1, description="passage tokens (title and text, with the prompt)")
    max_target_len: int = Field(32, ge=1, description="question tokens")
    eval_every: Optional[int] = Field(None, ge=1, description="steps between dev losses; always one at step 0 and at the end")


def _batch(generator, pairs: Sequence[Pair], args: GeneratorTrainArgs, device: torch.device) -> dict:
    batch = generator.training_batch([p for p, _ in pairs], [q for _, q in pairs],
                                     max_source_len=args.max_source_len, max_target_len=args.max_target_len)
    return {k: v.to(device) for k, v in batch.items()}


def finetune_generator(
    generator,
    train_pairs: Sequence[Pair],
    dev_pairs: Sequence[Pair],
    args: GeneratorTrainArgs,
    out_dir: str | Path,
    device: str = "auto",
    progress: bool = False,
) -> dict:
    """Fine-tune `generator` on `train_pairs` ((title, text), question); pick the best step by
    the loss on `dev_pairs`. A run started on an out_dir holding checkpoints resumes exactly from
    the latest one.

    Returns {history: [{step, loss, lr[, dev_loss]}], dev_curve: [(step, dev_loss)], best_step,
    best_dev_loss, seconds, pairs_per_second, total_steps, resumed_from}, also written to
    out_dir/history.json. `lr` is the rate used for that step's update; history and dev_curve
    span the whole run, resumed parts included.
    """
    from tqdm.auto import tqdm

    if not train_pairs:
        raise ValueError("no train pairs to fine-tune the generator on")
    if not dev_pairs:
        raise ValueError("no dev pairs: the best checkpoint is picked by the dev loss")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = generator.model

    seed_everything(args.seed)
    device = torch.device(resolve_device(device))
    bf16 = use_bf16(args.bf16, device)
    model.to(device)

    steps_per_epoch = math.ceil(len(train_pairs) / args.batch_size)  # the last batch may be short
    total_steps, optimizer, scheduler = optimizer_and_schedule(args, model, None, steps_per_epoch)

    step = 0
    history: list[dict] = []
    dev_curve: list[tuple[int, float]] = []
    best_step: int | None = None
    best_dev_loss: float | None = None
    resumed_from = None

    ckpt = latest_checkpoint(out_dir)
    if ckpt is not None:
        state = torch.load(ckpt / STATE_NAME, map_location="cpu", weights_only=False)
        if state["total_steps"] != total_steps or state["n_train"] != len(train_pairs):
            raise ValueError(f"{ckpt} is from a run of {state['total_steps']} steps over {state['n_train']} pairs, "
                             f"not {total_steps} over {len(train_pairs)}: use another out_dir to start afresh")
        model.load_state_dict(torch.load(ckpt / "model.pt", map_location=device, weights_only=False))
        optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", map_location=device, weights_only=False))
        scheduler.load_state_dict(torch.load(ckpt / "scheduler.pt", weights_only=False))
        set_rng_states(state["rng"])
        step = int(state["step"])
        history, dev_curve = list(state["history"]), [tuple(e) for e in state["dev_curve"]]
        best_step, best_dev_loss = state["best_step"], state["best_dev_loss"]
        resumed_from = str(ckpt)
        log.info("resuming generator fine-tuning from %s (step %d)", ckpt, step)
    for stale in (out_dir / CHECKPOINTS).glob(f"{TMP_DIR_PREFIX}*") if (out_dir / CHECKPOINTS).is_dir() else []:
        shutil.rmtree(stale, ignore_errors=True)  # an interrupted save

    autocast = bf16_autocast(device) if bf16 else contextlib.nullcontext

    def save_checkpoint() -> None:
        def write(tmp: Path) -> None:
            # the state dict, not save_pretrained: it loads back into this very model exactly
            torch.save(model.state_dict(), tmp / "model.pt")
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
            epoch, position = divmod(step, steps_per_epoch)  # where the next batch comes from
            torch.save({
                "step": step, "epoch": epoch, "position": position, "rng": rng_states(),
                "history": history, "dev_curve": dev_curve, "best_step": best_step,
                "best_dev_loss": best_dev_loss, "total_steps": total_steps, "n_train": len(train_pairs),
                "args": args.model_dump(),
            }, tmp / STATE_NAME)

        atomic_dir(out_dir / CHECKPOINTS / f"step-{step:07d}", write)
        for _, old in list_checkpoints(out_dir)[: -args.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)

    def evaluate() -> None:
        nonlocal best_step, best_dev_loss
        saved_rng = rng_states()  # batch building or a forward must not shift training's stream
        was_training = model.training
        model.eval()
        total = 0.0
        try:
            with torch.no_grad(), autocast():
                for start in range(0, len(dev_pairs), args.batch_size):
                    chunk = dev_pairs[start:start + args.batch_size]
                    total += float(generator.loss(_batch(generator, chunk, args, device)).float()) * len(chunk)
        finally:
            model.train(was_training)
            set_rng_states(saved_rng)
        dev_loss = total / len(dev_pairs)
        log.info("generator step %d dev loss %.5f", step, dev_loss)
        dev_curve.append((step, dev_loss))
        if history and history[-1]["step"] == step:
            history[-1]["dev_loss"] = dev_loss
        if best_dev_loss is None or dev_loss < best_dev_loss:
            best_step, best_dev_loss = step, dev_loss
            atomic_dir(out_dir / "best", generator.save_pretrained)

    if step == 0:
        evaluate()  # the untrained model is a candidate too
    model.train()
    start_step = step
    started = time.perf_counter()
    bar = tqdm(total=total_steps, initial=step, disable=not progress, desc="qgen", dynamic_ncols=True)
    log_every = max(total_steps // 10, 1)
    order_epoch, order = None, []
    while step < total_steps:
        epoch, position = divmod(step, steps_per_epoch)
        if epoch != order_epoch:
            order_epoch, order = epoch, epoch_order(len(train_pairs), args.seed, epoch)
        chunk = [train_pairs[i] for i in order[position * args.batch_size:(position + 1) * args.batch_size]]
        with autocast():
            loss = generator.loss(_batch(generator, chunk, args, device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if args.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        lr = float(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
        step += 1
        value = float(loss.detach().float().cpu())
        if not np.isfinite(value):
            raise FloatingPointError(f"generator loss is {value} at step {step}")
        history.append({"step": step, "loss": value, "lr": lr})
        bar.update(1)
        bar.set_postfix(loss=f"{value:.4f}", lr=f"{lr:.2e}")
        if not progress and (step % log_every == 0 or step == total_steps):
            log.info("generator step %d/%d loss %.4f lr %.2e", step, total_steps, value, lr)
        # evaluate first, so the checkpoint records the best-so-far it has seen
        if args.eval_every and step % args.eval_every == 0:
            evaluate()
        if args.checkpoint_every and step % args.checkpoint_every == 0:
            save_checkpoint()
    bar.close()
    seconds = time.perf_counter() - started
    if not dev_curve or dev_curve[-1][0] != step:
        evaluate()
    model.eval()

    steps_run = step - start_step
    pairs_run = sum(min(args.batch_size, len(train_pairs) - (s % steps_per_epoch) * args.batch_size)
                    for s in range(start_step, step))
    result: dict[str, Any] = {
        "history": history,
        "dev_curve": dev_curve,
        "best_step": best_step,
        "best_dev_loss": best_dev_loss,
        "seconds": seconds,
        "pairs_per_second": pairs_run / seconds if seconds > 0 and steps_run else 0.0,
        "total_steps": total_steps,
        "resumed_from": resumed_from,
    }
    (out_dir / "history.json").write_text(json.dumps(result, indent=2))
    return result
