"""Bi-encoder trainer (Tevatron-like: the loss module computes the loss, the trainer only steps,
checkpoints, evaluates and saves).

AdamW without decay on biases and LayerNorm weights, linear warm-up then linear decay, gradient
clipping, bf16 autocast on CUDA, optional gradient checkpointing, fixed seeds.
Checkpoints (out_dir/checkpoints/step-XXXXXXX/) hold everything needed to continue exactly: the
model, optimizer, scheduler, sampler position, collator RNG, python/numpy/torch RNG states and the
history; a run started on an out_dir that holds checkpoints resumes from the latest one.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import shutil
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from .data import Collator, TrainExample, UniqueBatchSampler

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
_STEP_DIR = re.compile(r"^step-(\d{7,})$")
STATE_NAME = "trainer_state.pt"


@dataclass
class TrainerArgs:
    lr: float = 2e-5
    batch_size: int = 32
    epochs: int = 1
    max_steps: int | None = None  # overrides epochs when given
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float | None = 2.0
    hard_negatives: int = 1
    query_max_len: int = 32
    passage_max_len: int = 128
    seed: int = 42
    bf16: str | bool = "auto"  # 'auto': on for CUDA only
    gradient_checkpointing: bool = False
    checkpoint_every: int | None = None  # steps
    eval_every: int | None = None  # steps; needs dev_metric
    eval_at_start: bool = False  # score the untrained model too: step 0 can win if training hurts
    keep_checkpoints: int = 2
    device: str = "auto"


# -- helpers ------------------------------------------------------------------------------------

def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_states() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_states(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def use_bf16(flag: str | bool, device: torch.device) -> bool:
    if flag == "auto":
        return device.type == "cuda" and torch.cuda.is_bf16_supported()
    if flag and device.type != "cuda":
        warnings.warn("bf16=True only applies on CUDA; training in fp32 on " + device.type)
        return False
    return bool(flag)


def parameter_groups(model: nn.Module, extra: nn.Module | None, weight_decay: float) -> list[dict]:
    """AdamW groups: no decay on biases and LayerNorm (any 1-D tensor)."""
    seen: set[int] = set()
    decay, no_decay = [], []
    modules = [model] + ([extra] if extra is not None else [])
    for module in modules:
        for name, p in module.named_parameters():
            if id(p) in seen or not p.requires_grad:
                continue
            seen.add(id(p))
            if p.ndim < 2 or name.endswith("bias") or "layernorm" in name.lower() or "layer_norm" in name.lower():
                no_decay.append(p)
            else:
                decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def list_checkpoints(out_dir: Path) -> list[tuple[int, Path]]:
    root = Path(out_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        m = _STEP_DIR.match(d.name)
        if m and d.is_dir() and (d / STATE_NAME).is_file():
            found.append((int(m.group(1)), d))
    return sorted(found)


def latest_checkpoint(out_dir: Path) -> Path | None:
    found = list_checkpoints(out_dir)
    return found[-1][1] if found else None


def _atomic_dir(target: Path, write: Callable[[Path], None]) -> None:
    """Write a folder under a temporary name, then rename it into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".tmp-{target.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    write(tmp)
    old = target.parent / f".old-{target.name}-{os.getpid()}"
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    if old.exists():
        shutil.rmtree(old)


def _wants_weights(loss_fn: nn.Module) -> bool:
    from models.losses import WeightedInBatchSoftmaxLoss

    return isinstance(loss_fn, WeightedInBatchSoftmaxLoss)


def _to(batch: dict[str, torch.Tensor] | None, device: torch.device):
    if batch is None:
        return None
    return {k: v.to(device) for k, v in batch.items()}


def _load_model_weights(model: nn.Module, directory: Path) -> None:
    loaded = type(model).from_pretrained(directory, load_tokenizer=False)
    model.load_state_dict(loaded.state_dict())


def _enable_gradient_checkpointing(model: nn.Module) -> None:
    towers = [getattr(model, "query_encoder", None), getattr(model, "passage_encoder", None)]
    enabled = False
    for tower in towers:
        if tower is None:
            continue
        # transformers 5 renamed it; the old name still works with a FutureWarning
        enable = getattr(tower, "activation_checkpointing_enable", None) or getattr(
            tower, "gradient_checkpointing_enable", None)
        if enable is not None:
            enable()
            enabled = True
    if not enabled:
        warnings.warn("gradient_checkpointing=True but no tower supports gradient_checkpointing_enable()")


def plot_loss_curve(history: Sequence[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    steps = [h["step"] for h in history]
    ax.plot(steps, [h["loss"] for h in history], label="loss", color="tab:blue")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax2 = ax.twinx()
    ax2.plot(steps, [h["lr"] for h in history], label="lr", color="tab:orange", alpha=0.6)
    ax2.set_ylabel("learning rate")
    ax.set_title("training loss")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# -- the trainer --------------------------------------------------------------------------------

def train_bi_encoder(
    model: nn.Module,
    loss_fn: nn.Module,
    examples: Sequence[TrainExample],
    args: TrainerArgs,
    out_dir: str | Path,
    dev_metric: Callable[[nn.Module], float] | None = None,
    progress: bool = True,
    tokenizer: Any = None,
) -> dict:
    """Train `model` with `loss_fn` (a module built around `model`) on `examples`.

    Returns {history: [{step, loss, lr}], best_step, best_metric, start_metric,
    dev_curve: [(step, metric)] of this run's evaluations, seconds, pairs_per_second,
    total_steps, resumed_from}. `lr` is the rate used for that step's update. Higher dev_metric is
    better. out_dir gets checkpoints/, best/ (best model; the final one without dev_metric),
    final/, history.json and loss_curve.png. Progress: a tqdm bar, or with progress=False a log
    line about every 10% of the steps.
    """
    from tqdm.auto import tqdm
    from transformers import get_linear_schedule_with_warmup

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise ValueError("no tokenizer: pass tokenizer= or give the model one")
    weighted = _wants_weights(loss_fn)
    if not weighted and any(float(e.weight) != 1.0 for e in examples):
        raise ValueError(f"examples carry weights but {type(loss_fn).__name__} ignores them; "
                         "use WeightedInBatchSoftmaxLoss")

    seed_everything(args.seed)
    device = resolve_device(args.device)
    bf16 = use_bf16(args.bf16, device)
    model.to(device)
    loss_fn.to(device)
    if args.gradient_checkpointing:
        _enable_gradient_checkpointing(model)

    sampler = UniqueBatchSampler(examples, args.batch_size, seed=args.seed, drop_last=True)
    steps_per_epoch = len(sampler)
    if steps_per_epoch == 0:
        raise ValueError(f"{len(examples)} examples make no full batch of {args.batch_size} "
                         "(after keeping duplicate qids/positives apart)")
    total_steps = int(args.max_steps) if args.max_steps else int(args.epochs) * steps_per_epoch
    warmup_steps = int(round(args.warmup_ratio * total_steps))
    collator = Collator(tokenizer, args.query_max_len, args.passage_max_len, args.hard_negatives, seed=args.seed)
    optimizer = torch.optim.AdamW(parameter_groups(model, loss_fn, args.weight_decay), lr=args.lr)
    scheduler = get_linear_schedule_with_warmup(optimizer, warmup_steps, total_steps)

    step = 0
    history: list[dict] = []
    best_step: int | None = None
    best_metric: float | None = None
    resumed_from = None

    ckpt = latest_checkpoint(out_dir)
    if ckpt is not None:
        state = torch.load(ckpt / STATE_NAME, map_location="cpu", weights_only=False)
        _load_model_weights(model, ckpt / "model")
        model.to(device)
        optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", map_location=device, weights_only=False))
        scheduler.load_state_dict(torch.load(ckpt / "scheduler.pt", weights_only=False))
        sampler.load_state_dict(state["sampler"])
        collator.load_state_dict(state["collator"])
        set_rng_states(state["rng"])
        step = int(state["step"])
        history = list(state["history"])
        best_step, best_metric = state.get("best_step"), state.get("best_metric")
        resumed_from = str(ckpt)
        log.info("resuming from %s (step %d)", ckpt, step)
    # stale temporary folders of an interrupted save
    for stale in (out_dir / CHECKPOINTS).glob(".tmp-*") if (out_dir / CHECKPOINTS).is_dir() else []:
        shutil.rmtree(stale, ignore_errors=True)

    def save_checkpoint() -> None:
        def write(tmp: Path) -> None:
            tmp.mkdir(parents=True)
            model.save_pretrained(tmp / "model")
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
            torch.save({
                "step": step, "sampler": sampler.state_dict(), "collator": collator.state_dict(),
                "rng": rng_states(), "history": history, "best_step": best_step,
                "best_metric": best_metric, "args": asdict(args),
            }, tmp / STATE_NAME)

        _atomic_dir(out_dir / CHECKPOINTS / f"step-{step:07d}", write)
        for _, old in list_checkpoints(out_dir)[: -max(1, args.keep_checkpoints)]:
            shutil.rmtree(old, ignore_errors=True)

    last_eval: list[int] = []
    dev_curve: list[tuple[int, float]] = []

    def evaluate() -> None:
        nonlocal best_step, best_metric
        last_eval.append(step)
        saved_rng = rng_states()  # a dev metric must not change the training's random stream
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                metric = float(dev_metric(model))
        finally:
            model.train(was_training)
            set_rng_states(saved_rng)
        log.info("step %d dev metric %.5f", step, metric)
        dev_curve.append((step, metric))
        if history and history[-1]["step"] == step:
            history[-1]["dev_metric"] = metric
        if best_metric is None or metric > best_metric:
            best_metric, best_step = metric, step
            _atomic_dir(out_dir / "best", lambda d: model.save_pretrained(d))

    start_metric = None
    if dev_metric is not None and args.eval_at_start and step == 0:
        evaluate()
        start_metric = best_metric

    autocast = (lambda: torch.autocast(device_type="cuda", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    model.train()
    loss_fn.train()
    start_step = step
    started = time.perf_counter()
    bar = tqdm(total=total_steps, initial=step, disable=not progress, desc="train", dynamic_ncols=True)
    log_every = max(total_steps // 10, 1)
    while step < total_steps:
        for indices in sampler:
            q, p, n, w = collator([examples[i] for i in indices])
            with autocast():
                loss = loss_fn(_to(q, device), _to(p, device), _to(n, device),
                               w.to(device) if weighted else None)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if args.max_grad_norm:
                torch.nn.utils.clip_grad_norm_([p_ for g in optimizer.param_groups for p_ in g["params"]],
                                               args.max_grad_norm)
            lr = float(scheduler.get_last_lr()[0])
            optimizer.step()
            scheduler.step()
            step += 1
            value = float(loss.detach().float().cpu())
            if not np.isfinite(value):
                raise FloatingPointError(f"loss is {value} at step {step}")
            history.append({"step": step, "loss": value, "lr": lr})
            bar.update(1)
            bar.set_postfix(loss=f"{value:.4f}", lr=f"{lr:.2e}")
            if not progress and (step % log_every == 0 or step == total_steps):  # the pipeline's progress
                log.info("train step %d/%d loss %.4f lr %.2e", step, total_steps, value, lr)
            # evaluate first, so the checkpoint records the best-so-far it has seen
            if dev_metric is not None and args.eval_every and step % args.eval_every == 0:
                evaluate()
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                save_checkpoint()
            if step >= total_steps:
                break
    bar.close()
    seconds = time.perf_counter() - started

    if dev_metric is not None and (not last_eval or last_eval[-1] != step):
        evaluate()
    model.eval()
    _atomic_dir(out_dir / "final", lambda d: model.save_pretrained(d))
    if dev_metric is None:
        best_step, best_metric = step, None
        _atomic_dir(out_dir / "best", lambda d: shutil.copytree(out_dir / "final", d))

    steps_run = step - start_step
    result = {
        "history": history,
        "best_step": best_step,
        "best_metric": best_metric,
        "start_metric": start_metric,
        "dev_curve": dev_curve,
        "seconds": seconds,
        "pairs_per_second": steps_run * args.batch_size / seconds if seconds > 0 and steps_run else 0.0,
        "total_steps": total_steps,
        "resumed_from": resumed_from,
    }
    (out_dir / "history.json").write_text(json.dumps(result, indent=2))
    if history:
        plot_loss_curve(history, out_dir / "loss_curve.png")
    return result
