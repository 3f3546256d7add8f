"""Bi-encoder trainer (Tevatron-like: the loss module computes the loss, the trainer only steps,
checkpoints, evaluates and saves).

AdamW without decay on biases and LayerNorm weights, linear warm-up then linear decay, gradient
clipping, bf16 autocast (CUDA, CPUs with bf16 units), optional gradient checkpointing, fixed seeds.
Checkpoints (out_dir/checkpoints/step-XXXXXXX/) hold everything needed to continue exactly: the
model, the loss module's own parameters and buffers, optimizer, scheduler, sampler position,
collator RNG, python/numpy/torch RNG states and the history; a run started on an out_dir that holds
checkpoints resumes from the latest one. Callbacks (tasks/training/callbacks.py) own any other
state they keep. Under torchrun the same loop trains data-parallel (tasks/training/distributed.py).
Beside it: the settings (arguments.py), the checkpoint folders (checkpoints.py), the RNG states
(rng.py), bf16 autocast (precision.py) and the loss curve (loss_curve.py).
"""
from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np
import torch
from torch import nn

from models.length_pieces import encoding_in_pieces
from storage.atomic import atomic_dir
from tasks.compute.device import resolve_device
from tasks.progress import report

from .arguments import ScheduleArgs, TrainerArgs
from .callbacks import TrainerCallback
from .checkpoints import (LOSS_STATE_NAME, STATE_NAME, latest_checkpoint, remove_interrupted_saves,
                          write_checkpoint)
from .data import Batch, Collator, TeacherBatch, TrainExample, UniqueBatchSampler
from .distributed import Ranks, process_group
from .loss_curve import plot_loss_curve
from .precision import bf16_autocast, use_bf16
from .rng import rng_states, seed_everything, set_rng_states

log = logging.getLogger(__name__)


class Evaluator(Protocol):
    """sentence-transformers' evaluator shape: `evaluator(model)` returns named metrics, one of
    which, `primary_metric`, picks the checkpoint (higher is better unless greater_is_better is
    False). tasks/training/dev_metric.py has the pipeline's."""

    primary_metric: str
    greater_is_better: bool

    def __call__(self, model: nn.Module) -> Mapping[str, float]: ...


def optimizer_and_schedule(args: ScheduleArgs, model: nn.Module, extra: nn.Module | None, steps_per_epoch: int):
    """(total steps, AdamW without decay on biases and LayerNorm, linear warm-up then decay to 0)
    for `args` over the parameters of `model` and `extra` (each shared parameter once)."""
    from transformers import get_linear_schedule_with_warmup

    total_steps = int(args.max_steps) if args.max_steps else int(args.epochs) * steps_per_epoch
    optimizer = torch.optim.AdamW(parameter_groups(model, extra, args.weight_decay), lr=args.lr)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(round(args.warmup_ratio * total_steps)), total_steps)
    return total_steps, optimizer, scheduler


# -- helpers ------------------------------------------------------------------------------------

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


def _wants_weights(loss_fn: nn.Module) -> bool:
    """A loss declares it consumes per-example weights with the class attribute `uses_weights`."""
    return bool(getattr(loss_fn, "uses_weights", False))


def _own_state_keys(loss_fn: nn.Module, model: nn.Module) -> list[str]:
    """The loss module's state_dict keys that are not the model's tensors (its own parameters and
    buffers: a learned temperature, momentum encoders, queues)."""
    model_tensors = {id(t) for t in model.state_dict(keep_vars=True).values()}
    return [k for k, t in loss_fn.state_dict(keep_vars=True).items() if id(t) not in model_tensors]


def _to(batch: dict[str, torch.Tensor] | torch.Tensor | None, device: torch.device):
    if batch is None:
        return None
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    return {k: v.to(device) for k, v in batch.items()}


def _batch_to(batch: tuple, device: torch.device) -> tuple:
    """Each part of a collated batch on `device`; a named batch keeps its names."""
    moved = [_to(part, device) for part in batch]
    return type(batch)(*moved) if hasattr(batch, "_fields") else tuple(moved)


def _load_model_weights(model: nn.Module, directory: Path) -> None:
    loaded = type(model).from_pretrained(directory, load_tokenizer=False)
    model.load_state_dict(loaded.state_dict())


def _enable_gradient_checkpointing(model: nn.Module) -> None:
    towers = [getattr(model, name, None) for name in ("query_encoder", "passage_encoder", "backbone")]
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


# -- the trainer --------------------------------------------------------------------------------

def train_bi_encoder(
    model: nn.Module,
    loss_fn: nn.Module,
    examples: Sequence[TrainExample],
    args: TrainerArgs,
    out_dir: str | Path,
    evaluator: Evaluator | None = None,
    progress: bool = True,
    tokenizer: Any = None,
    device: str = "auto",
    callbacks: Sequence[TrainerCallback] = (),
    teacher: Callable[[list[tuple[str, str]]], Sequence[float]] | None = None,
    rows_per_piece: int | None = None,
) -> dict:
    """Train `model` with `loss_fn` (a module built around `model`) on `examples`.

    `evaluator` (sentence-transformers' evaluator shape: `evaluator(model) -> {name: value}` with
    `primary_metric` and `greater_is_better`) picks the checkpoint: its primary metric is the dev
    metric. `device`: 'auto' picks CUDA when present. `callbacks` (and the loss module itself when
    it is a TrainerCallback, first) are called at the points documented in
    tasks/training/callbacks.py. The batches: UniqueBatchSampler (no question or positive twice in
    a batch) and the Collator (hard negatives drawn per question and epoch, weights, teacher
    scores); the loop is `run_training`'s. A distilling loss reads each example's own
    `teacher_scores`, or else has `teacher` (pairs -> logits) score the pairs each batch draws.
    `rows_per_piece`: the encoders read each padded batch in length-sorted pieces of that many rows
    (models/length_pieces.py: the same vectors, less padding); None: whole batches.

    Returns what `run_training` returns, and `teacher_rows`: the scores the teacher gave during
    the run, [positive, *drawn negatives] per question and epoch (this rank's slice under torchrun).
    """
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise ValueError("no tokenizer: pass tokenizer= or give the model one")
    weighted = _wants_weights(loss_fn)
    if not weighted and any(float(e.weight) != 1.0 for e in examples):
        raise ValueError(f"examples carry weights but {type(loss_fn).__name__} ignores them (uses_weights is "
                         "False); use WeightedInBatchSoftmaxLoss")
    distils = bool(getattr(loss_fn, "uses_teacher_scores", False))
    if distils and teacher is None and any(e.teacher_scores is None for e in examples):
        raise ValueError(f"{type(loss_fn).__name__} distils teacher scores, but some examples carry none "
                         "(pass teacher=, or score the pairs with a cross-encoder first)")
    if args.query_max_len is None or args.passage_max_len is None:
        raise ValueError("TrainerArgs: query_max_len and passage_max_len are needed to train (a pipeline takes "
                         "them from dense.encode at planning)")
    sampler = UniqueBatchSampler(examples, args.batch_size, seed=args.seed, drop_last=True)
    collator = Collator(tokenizer, args.query_max_len, args.passage_max_len, args.hard_negatives, seed=args.seed,
                        teacher_scores=distils, teacher=teacher)

    def loss_inputs(batch: Batch | TeacherBatch) -> tuple:
        teacher = (batch.teacher_scores,) if isinstance(batch, TeacherBatch) else ()
        return (batch.queries, batch.positives, batch.negatives, batch.weights if weighted else None, *teacher)

    with encoding_in_pieces(loss_fn, rows_per_piece):
        result = run_training(model, loss_fn, examples, sampler, collator, args, out_dir, evaluator=evaluator,
                              progress=progress, device=device, callbacks=callbacks, loss_inputs=loss_inputs,
                              gradient_checkpointing=args.gradient_checkpointing, eval_at_start=args.eval_at_start)
    return {**result, "teacher_rows": list(collator.teacher_rows.values())}


def run_training(
    model: nn.Module,
    loss_fn: nn.Module,
    examples: Sequence[Any],
    sampler: Any,
    collate: Any,
    args: ScheduleArgs,
    out_dir: str | Path,
    evaluator: Evaluator | None = None,
    progress: bool = True,
    device: str = "auto",
    callbacks: Sequence[TrainerCallback] = (),
    loss_inputs: Callable[[tuple], tuple] | None = None,
    gradient_checkpointing: bool = False,
    *,
    eval_at_start: bool,  # no default: each trainer's settings decide it, so no second default can differ
    desc: str = "train",
) -> dict:
    """The training loop every model of the project shares (the bi-encoder's, the cross-encoder's,
    the question generator's).

    `sampler` yields lists of example indices (the rest of its current epoch per iteration) and
    has `epoch`, `batch_size`, `__len__` (batches per epoch) and `state_dict`/`load_state_dict`;
    `collate(items, epoch=...)` turns examples into a tuple of tensors or dicts of tensors (None
    allowed) and has `state_dict`/`load_state_dict`; the loss is `loss_fn(*loss_inputs(batch))`.
    `model` has `save_pretrained(folder)` and `type(model).from_pretrained(folder,
    load_tokenizer=False)`. The evaluator's `greater_is_better` (default True) says which way its
    primary metric improves; `eval_at_start` evaluates the untrained model too, a candidate for best/.

    Returns {history: [{step, loss, lr[, dev_metric, dev_metrics]}], best_step, best_metric,
    start_metric (the step-0 evaluation's), dev_curve: [(step, metric)], seconds,
    seconds_all_attempts, pairs_per_second, total_steps, resumed_from}; history and dev_curve span
    the whole run, the parts before a resume included, while seconds and pairs_per_second measure
    this call and seconds_all_attempts adds the training time of the attempts it resumed. `lr` is
    the rate used for that step's update. out_dir gets checkpoints/, best/ (best model; the final
    one without an evaluator), final/, history.json and loss_curve.png. A run resumes only the run
    that wrote the checkpoint (the same number of steps; the sampler checks its examples). Progress:
    a tqdm bar, or with progress=False a log line ("DESC step i/n") about every 10% of the steps.

    Under torchrun (2+ ranks; tasks/training/distributed.py) the sampler's batch is the global
    batch: every rank draws the same seeded global batches and collates its own contiguous slice,
    `loss_fn` runs inside DistributedDataParallel (contrastive losses gather the global batch's
    vectors, models/losses/distributed.py), every rank evaluates, and only rank 0 logs and writes
    to `out_dir` (read by all ranks on a resume, so a folder all of them see); the others wait for
    it at the end. `device` 'cuda' is cuda:LOCAL_RANK. Every rank returns the same history.
    """
    with process_group(torch.device(resolve_device(device))) as ranks:
        return _training_loop(model, loss_fn, examples, sampler, collate, args, out_dir, evaluator, progress,
                              callbacks, loss_inputs, gradient_checkpointing, eval_at_start, desc, ranks)


def _training_loop(model, loss_fn, examples, sampler, collate, args: ScheduleArgs, out_dir, evaluator, progress,
                   callbacks, loss_inputs, gradient_checkpointing, eval_at_start, desc, ranks: Ranks) -> dict:
    from tqdm.auto import tqdm

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    loss_inputs = loss_inputs or (lambda batch: batch)
    hooks: list[TrainerCallback] = [loss_fn] if isinstance(loss_fn, TrainerCallback) else []
    hooks += [c for c in callbacks if c is not loss_fn]
    primary = evaluator.primary_metric if evaluator is not None else None
    greater_is_better = bool(getattr(evaluator, "greater_is_better", True))

    seed_everything(args.seed)  # the same on every rank: same global order and draws
    device = ranks.device
    bf16 = use_bf16(args.bf16, device)
    model.to(device)
    loss_fn.to(device)
    loss_own_keys = _own_state_keys(loss_fn, model)
    if gradient_checkpointing:
        _enable_gradient_checkpointing(model)

    steps_per_epoch = len(sampler)
    if steps_per_epoch == 0:
        raise ValueError(f"{len(examples)} examples make no full batch of {sampler.batch_size} "
                         "(a sampler may keep some apart, as UniqueBatchSampler does duplicate qids/positives)")
    total_steps, optimizer, scheduler = optimizer_and_schedule(args, model, loss_fn, steps_per_epoch)
    step = 0
    history: list[dict] = []
    dev_curve: list[tuple[int, float]] = []
    best_step: int | None = None
    best_metric: float | None = None
    resumed_from = None
    seconds_before = 0.0   # the training time of the attempts a resumed run continues

    ckpt = ranks.broadcast(latest_checkpoint(out_dir))  # rank 0's choice: every rank resumes from it
    if ckpt is not None:
        state = torch.load(ckpt / STATE_NAME, map_location="cpu", weights_only=False)
        if state.get("total_steps", total_steps) != total_steps:  # older checkpoints do not say
            raise ValueError(f"{ckpt} is from a run of {state['total_steps']} steps, not {total_steps}: "
                             "use another out_dir to start afresh")
        _load_model_weights(model, ckpt / "model")
        model.to(device)
        if (ckpt / LOSS_STATE_NAME).is_file():
            own = torch.load(ckpt / LOSS_STATE_NAME, map_location=device, weights_only=False)
            missing, unexpected = loss_fn.load_state_dict(own, strict=False)
            if unexpected or set(missing) & set(loss_own_keys):
                raise ValueError(f"{ckpt / LOSS_STATE_NAME} does not fit {type(loss_fn).__name__}: missing "
                                 f"{sorted(set(missing) & set(loss_own_keys))}, unexpected {sorted(unexpected)}")
        optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", map_location=device, weights_only=False))
        scheduler.load_state_dict(torch.load(ckpt / "scheduler.pt", weights_only=False))
        sampler.load_state_dict(state["sampler"])
        collate.load_state_dict(state["collator"])
        set_rng_states(state["rng"])
        step = int(state["step"])
        history = list(state["history"])
        dev_curve = [(int(s), float(m)) for s, m in state.get("dev_curve", [])]
        best_step, best_metric = state.get("best_step"), state.get("best_metric")
        resumed_from = str(ckpt)
        seconds_before = float(state.get("seconds_so_far", 0.0))   # older checkpoints do not say: 0
        if ranks.main:
            log.info("resuming from %s (step %d)", ckpt, step)
    if ranks.main:
        remove_interrupted_saves(out_dir)

    # DDP under torchrun (every rank starts from rank 0's weights), else loss_fn itself
    forward = ranks.wrap(loss_fn)

    def save_checkpoint() -> None:
        def write(tmp: Path) -> None:
            model.save_pretrained(tmp / "model")
            own = loss_fn.state_dict()
            torch.save({k: own[k] for k in loss_own_keys}, tmp / LOSS_STATE_NAME)
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
            torch.save({
                "step": step, "sampler": sampler.state_dict(), "collator": collate.state_dict(),
                "rng": rng_states(), "history": history, "dev_curve": dev_curve, "best_step": best_step,
                "best_metric": best_metric, "total_steps": total_steps, "args": args.model_dump(),
                "seconds_so_far": seconds_before + time.perf_counter() - started,
            }, tmp / STATE_NAME)

        write_checkpoint(out_dir, step, write, args.keep_checkpoints)

    def evaluate() -> None:
        nonlocal best_step, best_metric
        saved_rng = rng_states()  # a dev metric must not change the training's random stream
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                metrics = dict(evaluator(model))
        finally:
            model.train(was_training)
            set_rng_states(saved_rng)
        if primary not in metrics:
            raise KeyError(f"the evaluator returned {sorted(metrics)}, not its primary metric {primary!r}")
        metric = float(metrics[primary])
        if ranks.main:
            log.info("step %d dev metric %.5f", step, metric)
        dev_curve.append((step, metric))
        if history and history[-1]["step"] == step:
            history[-1]["dev_metric"] = metric
            # every metric the evaluator reports, not only the one that picks: history is checkpointed
            history[-1]["dev_metrics"] = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        if best_metric is None or (metric > best_metric if greater_is_better else metric < best_metric):
            best_metric, best_step = metric, step
            if ranks.main:
                atomic_dir(out_dir / "best", lambda d: model.save_pretrained(d))
        for hook in hooks:
            hook.on_evaluate(step, metrics)

    for hook in hooks:
        hook.on_train_begin(model, optimizer)
    if evaluator is not None and eval_at_start and step == 0:
        evaluate()

    autocast = bf16_autocast(device) if bf16 else contextlib.nullcontext
    model.train()
    loss_fn.train()
    start_step, examples_run = step, 0
    started = time.perf_counter()
    bar = tqdm(total=total_steps, initial=step, disable=not (progress and ranks.main), desc=desc, dynamic_ncols=True)
    log_every = max(total_steps // 10, 1)
    while step < total_steps:
        for indices in sampler:
            examples_run += len(indices)  # the global batch (a short last one counts as it is)
            indices = ranks.shard(indices)  # this rank's slice of the global batch
            batch = _batch_to(collate([examples[i] for i in indices], epoch=sampler.epoch), device)
            for hook in hooks:
                hook.on_batch(step + 1, batch)
            with autocast():
                loss = forward(*loss_inputs(batch))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if args.max_grad_norm:
                torch.nn.utils.clip_grad_norm_([p_ for g in optimizer.param_groups for p_ in g["params"]],
                                               args.max_grad_norm)
            lr = float(scheduler.get_last_lr()[0])
            optimizer.step()
            scheduler.step()
            step += 1
            for hook in hooks:
                hook.on_step_end(step, model, optimizer)
            value = ranks.mean(loss)  # all ranks see the same value (and stop together on a NaN)
            if not np.isfinite(value):
                raise FloatingPointError(f"loss is {value} at step {step}")
            history.append({"step": step, "loss": value, "lr": lr})
            bar.update(1)
            bar.set_postfix(loss=f"{value:.4f}", lr=f"{lr:.2e}")
            if ranks.main:
                report(f"{desc}: steps (loss {value:.4f})", step, total_steps)  # the UI's progress
            if not progress and ranks.main and (step % log_every == 0 or step == total_steps):  # the pipeline's progress
                log.info("%s step %d/%d loss %.4f lr %.2e", desc, step, total_steps, value, lr)
            # evaluate first, so the checkpoint records the best-so-far it has seen
            if evaluator is not None and args.eval_every and step % args.eval_every == 0:
                evaluate()
            if args.checkpoint_every and step % args.checkpoint_every == 0 and ranks.main:
                save_checkpoint()
            if step >= total_steps:
                break
    bar.close()
    seconds = time.perf_counter() - started

    if evaluator is not None and (not dev_curve or dev_curve[-1][0] != step):
        evaluate()
    model.eval()
    if evaluator is None:
        best_step, best_metric = step, None
    if ranks.main:
        atomic_dir(out_dir / "final", lambda d: model.save_pretrained(d))
        if evaluator is None:
            atomic_dir(out_dir / "best", lambda d: shutil.copytree(out_dir / "final", d, dirs_exist_ok=True))

    steps_run = step - start_step
    result = {
        "history": history,
        "best_step": best_step,
        "best_metric": best_metric,
        "start_metric": next((m for s, m in dev_curve if s == 0), None),
        "dev_curve": dev_curve,
        "seconds": seconds,
        "seconds_all_attempts": seconds_before + seconds,
        "pairs_per_second": examples_run / seconds if seconds > 0 and steps_run else 0.0,
        "total_steps": total_steps,
        "resumed_from": resumed_from,
    }
    if ranks.main:
        (out_dir / "history.json").write_text(json.dumps(result, indent=2))
        if history:
            plot_loss_curve(history, out_dir / "loss_curve.png")
    ranks.barrier()  # the other ranks return once rank 0's outputs are in place
    return result
