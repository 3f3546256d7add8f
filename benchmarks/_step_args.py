"""The command-line options every training-step benchmark shares (training_throughput.py,
xmoco_step_time.py, pretraining_throughput.py): the repeat protocol, steps per repeat, lengths,
threads, learning rate, device and bf16."""
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
