"""A training run's resumable checkpoints on disk: out_dir/checkpoints/step-XXXXXXX/, each written
whole (a temporary folder renamed into place) and holding trainer_state.pt beside the model, the
loss module's own state, the optimizer and the scheduler (tasks/training/trainer.py writes and
reads them)."""
from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Callable, NamedTuple

from storage.atomic import TMP_DIR_PREFIX, atomic_dir

CHECKPOINTS = "checkpoints"
TRAINING = "training"   # a resumable stage's trainer runs in WORK/training (tasks.training.resumable)
_STEP_DIR = re.compile(r"^step-(\d{7,})$")
STATE_NAME = "trainer_state.pt"
LOSS_STATE_NAME = "loss.pt"  # the loss module's own parameters and buffers (not the model's)


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


def write_checkpoint(out_dir: Path, step: int, write: Callable[[Path], None], keep: int) -> None:
    """The checkpoint of `step`, filled by `write(folder)`, then all but the latest `keep` removed."""
    atomic_dir(Path(out_dir) / CHECKPOINTS / f"step-{step:07d}", write)
    for _, old in list_checkpoints(out_dir)[: -max(1, keep)]:
        shutil.rmtree(old, ignore_errors=True)


def remove_interrupted_saves(out_dir: Path) -> None:
    """The temporary folders of a save that a killed run left behind."""
    root = Path(out_dir) / CHECKPOINTS
    for stale in root.glob(f"{TMP_DIR_PREFIX}*") if root.is_dir() else []:
        shutil.rmtree(stale, ignore_errors=True)


class TrainingProgress(NamedTuple):
    step: int
    total: int
    seconds: float | None   # the training's own time to `step`, every attempt (None: an older checkpoint)


def training_progress(work: Path) -> TrainingProgress | None:
    """How far the latest checkpoint of the training run in a resumable stage's work folder
    (WORK/training) is, or None where there is none or it does not say its total."""
    import torch

    found = list_checkpoints(Path(work) / TRAINING)
    if not found:
        return None
    step, latest = found[-1]
    state = torch.load(latest / STATE_NAME, map_location="cpu", weights_only=False)
    total, seconds = state.get("total_steps"), state.get("seconds_so_far")
    if not total:
        return None
    return TrainingProgress(int(state.get("step", step)), int(total), float(seconds) if seconds is not None else None)
