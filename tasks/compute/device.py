"""Which device computes: one rule for every stage, so a configured 'auto' means the same
everywhere (training, encoding, scoring, generation)."""
from __future__ import annotations


def resolve_device(wanted: str) -> str:
    """`wanted` as a device name: 'auto' is CUDA when present, else the CPU; any other name as
    given. A string, so it hashes and pickles; wrap it in `torch.device` where torch wants one."""
    import torch

    return ("cuda" if torch.cuda.is_available() else "cpu") if wanted == "auto" else wanted
