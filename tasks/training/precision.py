"""Whether a training step autocasts to bf16, and its autocast context (the trainer's loop and the
generator's dev loss use both)."""
from __future__ import annotations

import warnings
from typing import Any, Callable

import torch


def use_bf16(flag: str | bool, device: torch.device) -> bool:
    """TrainerArgs.bf16 ('auto', 'on', 'off'; True/False too) -> whether to autocast to bf16 on
    `device`: CUDA and the CPU autocast alike (models/cpu_features.py says where it is fast)."""
    from models.cpu_features import bf16_wanted, has_bf16_units

    if device.type not in ("cuda", "cpu"):
        if flag in ("on", True):
            warnings.warn(f"bf16 autocast is for CUDA and CPUs; training in fp32 on {device.type}")
        return False
    on = bf16_wanted(flag, device.type)
    if on and flag != "auto" and device.type == "cpu" and not has_bf16_units():
        warnings.warn("bf16 on a CPU without bf16 units (AMX, avx512_bf16) is emulated: slower than fp32")
    return on


def bf16_autocast(device: torch.device) -> Callable[[], Any]:
    """A factory of the training step's bf16 autocast context on `device` (CUDA or CPU)."""
    return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)
