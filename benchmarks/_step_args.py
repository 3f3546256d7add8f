"""What every training-step benchmark shares (training_throughput.py, xmoco_step_time.py,
pretraining_throughput.py): the command-line options (the repeat protocol, steps per repeat,
lengths, threads, learning rate, device, bf16) and the timed optimizer step."""
from __future__ import annotations

import argparse

import timing


def add_step_arguments(ap: argparse.ArgumentParser, *, steps_per_repeat: int = 1, passage_length: int = 128,
                       lr: float = 2e-5, passage_help: str = "passage tokens") -> None:
    timing.add_repeat_argument(ap, what="timed repeats")
    ap.add_argument("--steps-per-repeat", type=int, default=steps_per_repeat, help="steps per system in each repeat")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per system first")
    ap.add_argument("--query-length", type=int, default=32)
    ap.add_argument("--passage-length", type=int, default=passage_length, help=passage_help)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=lr)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
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
