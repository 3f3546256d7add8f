"""Where a stage's trainer writes. A resumable stage gets a work folder that outlives a killed run
of the same version, so the trainer, run there, resumes from its latest checkpoint (set
`checkpoint_every`); the build folder keeps only the chosen model and the run's record."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

from tasks.training.checkpoints import TRAINING
from tasks.training.distributed import torchrun_world_size


def training_dir(out: Path, work: Optional[Path]) -> Path:
    """work/training when the stage has a work folder, else out/training. Under torchrun each
    rank has its own work folder, and a resume would find rank 0's checkpoints only: the ranks
    then train in the build folder, from the start, as they always did."""
    if work is None or torchrun_world_size() > 1:
        return Path(out) / TRAINING
    return Path(work) / TRAINING


RECORD = ("history.json", "loss_curve.png")  # what the trainers write beside their checkpoints


def keep_record(train_dir: Path, out: Path) -> Path:
    """Copies the run's record (history.json, loss_curve.png, those present) to out/training,
    which the artifact keeps; checkpoints and model copies stay behind."""
    dest = Path(out) / TRAINING
    if Path(train_dir).resolve() != dest.resolve():
        dest.mkdir(parents=True, exist_ok=True)
        for name in RECORD:
            if (Path(train_dir) / name).is_file():
                shutil.copy2(Path(train_dir) / name, dest / name)
    return dest


def training_times(result: dict) -> dict:
    """A training run's times as its stage's stats carry them: this attempt's (`seconds`) and the
    whole run's with the attempts it resumed (`seconds_all_attempts`, what the study prices from)."""
    return {"seconds": result["seconds"], "seconds_all_attempts": result["seconds_all_attempts"]}
