"""A training run's resumable checkpoints on disk: out_dir/checkpoints/step-XXXXXXX/, each written
whole (a temporary folder renamed into place) and holding trainer_state.pt beside the model, the
loss module's own state, the optimizer and the scheduler (tasks/training/trainer.py writes and
reads them)."""
from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Callable

from storage.atomic import TMP_DIR_PREFIX, atomic_dir

CHECKPOINTS = "checkpoints"
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


def training_progress(folder: Path) -> tuple[int, int] | None:
    """(step, total steps) of the latest checkpoint of a training run anywhere below `folder` (a
    resumable stage's work folder), or None where there is none or it does not say its total."""
    import torch

    latest = max((found for root in Path(folder).rglob(CHECKPOINTS) if root.is_dir()
                  for found in list_checkpoints(root.parent)), default=None, key=lambda found: found[0])
    if latest is None:
        return None
    state = torch.load(latest[1] / STATE_NAME, map_location="cpu", weights_only=False)
    total = state.get("total_steps")
    return (int(state.get("step", latest[0])), int(total)) if total else None
