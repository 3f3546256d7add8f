"""A simulated kill of a training run, for the resume tests: `crash_at(step)` is a trainer callback
that raises `Crash` at the end of that step (after its optimizer step, before its checkpoint)."""
from tasks.training.callbacks import TrainerCallback


class Crash(Exception):
    pass


class _CrashAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, step, model, optimizer):
        if step == self.step:
            raise Crash


def crash_at(step: int) -> TrainerCallback:
    return _CrashAt(step)
