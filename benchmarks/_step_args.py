"""What every training-step benchmark shares (training_throughput.py, xmoco_step_time.py,
pretraining_throughput.py, the length_pieces scripts): the command-line options (the repeat protocol,
steps per repeat, lengths, threads, learning rate, device, bf16), the timed optimizer step and the
alternated run of every system's steps."""
from __future__ import annotations

import argparse

import timing


def add_step_arguments(ap: argparse.ArgumentParser, *, steps_per_repeat: int = 1, passage_length: int = 128,
                       lr: float = 2e-5, passage_help: str = "passage tokens", bf16_choice: bool = False) -> None:
    """`bf16_choice`: --bf16 auto|on|off, the trainers' own choice by default (the steps measured as
    the pipeline runs them); else --bf16 is a flag that turns the autocast on."""
    timing.add_repeat_argument(ap, what="timed repeats")
    ap.add_argument("--steps-per-repeat", type=int, default=steps_per_repeat, help="steps per system in each repeat")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per system first")
    ap.add_argument("--query-length", type=int, default=32)
    ap.add_argument("--passage-length", type=int, default=passage_length, help=passage_help)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=lr)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    if bf16_choice:
        ap.add_argument("--bf16", default="auto", choices=["auto", "on", "off"],
                        help="bf16 autocast of the forward and loss; auto: the trainer's choice "
                             "(tasks/training/precision.py: CUDA, CPUs with bf16 units)")
    else:
        ap.add_argument("--bf16", action="store_true", help="torch.autocast(bfloat16) forward + loss (meant for CUDA)")


def optimizer_step(loss_fn, inputs: tuple, optimizer, autocast) -> float:
    """One timed training step as every step benchmark takes it: the loss under `autocast()`,
    backward, optimizer step, gradients cleared; returns the loss."""
    with autocast():
        loss = loss_fn(*inputs)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def alternate_steps(steps: dict, batches: list, warmup: int, steps_per_repeat: int, repeat: int,
                    sync=None) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Every system's `step(batch) -> loss` on the same batches: `warmup` untimed steps each, then
    `repeat` repeats of `steps_per_repeat` steps each on that repeat's batches, the systems
    alternated (timing.alternate). Returns (seconds per repeat, losses: warm-up then timed) by system."""
    losses = {name: [] for name in steps}
    for batch in batches[:warmup]:
        for name, step in steps.items():
            losses[name].append(step(batch))

    def timed(name):
        def run(r):
            first = warmup + r * steps_per_repeat
            losses[name].extend(steps[name](batch) for batch in batches[first:first + steps_per_repeat])
        return run

    seconds, _ = timing.alternate({name: timed(name) for name in steps}, repeat, sync)
    return seconds, losses
