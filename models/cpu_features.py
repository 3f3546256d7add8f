"""What this machine's processor offers, for choosing a precision per machine.

bf16 autocast on a CPU is fast only with bf16 matrix units: on a Xeon with AMX (`amx_bf16`)
encoding ran 3.33x fp32 (README, "Benchmarks"); on CPUs without them (the AVX2 AMD EPYCs of this
project) bf16 is emulated and slower than fp32. So `auto` means bf16 on CUDA devices that support
it and on CPUs that list `amx_bf16`, fp32 elsewhere.
"""
from __future__ import annotations

import functools
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The first processor's feature flags (Linux /proc/cpuinfo); empty where it cannot be read."""
    try:
        text = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def has_amx_bf16() -> bool:
    return "amx_bf16" in cpu_flags()


def auto_bf16(device: str) -> bool:
    """Whether `auto` autocasts to bf16 on `device` ('cpu', 'cuda', 'cuda:N'; resolved, not 'auto')."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return device == "cpu" and has_amx_bf16()
