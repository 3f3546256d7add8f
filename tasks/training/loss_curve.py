"""The loss_curve.png a training run writes beside its history.json: the loss and the learning
rate per step."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence


def plot_loss_curve(history: Sequence[dict], path: Path) -> None:
    from tasks.evaluation.figures import draw_loss, new_figure, save_figure  # the report's training curves share these

    fig, ax = new_figure(7, 4)
    steps = [h["step"] for h in history]
    draw_loss(ax, steps, [h["loss"] for h in history])
    ax2 = ax.twinx()
    ax2.plot(steps, [h["lr"] for h in history], label="lr", color="tab:orange", alpha=0.6)
    ax2.set_ylabel("learning rate")
    ax.set_title("training loss")
    save_figure(fig, path)
