"""The training loop's hooks: `TrainerCallback` lives in models/callbacks.py (a loss module that is
also a callback, such as xMoCo's, subclasses it without importing the trainer); re-exported here
for the trainer and for users."""
from models.callbacks import TrainerCallback

__all__ = ["TrainerCallback"]
