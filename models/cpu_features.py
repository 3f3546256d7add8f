"""What this machine's processor offers, for choosing a precision per machine.

bf16 autocast on a CPU is fast only with bf16 units: AMX tiles (`amx_bf16`) or AVX-512's bf16 dot
product (`avx512_bf16`); there bf16 encodes well ahead of fp32 with vectors at a cosine to fp32 near 1.
On CPUs without them (AVX2 only, or AVX-512 without `avx512_bf16`) bf16 is emulated and slower than
fp32. So `auto` means bf16 on CUDA devices that support it and on CPUs with bf16 units, fp32 elsewhere
(and there models/encoder_runtimes.py runs it on OpenVINO). Measured in docs/benchmarks.md, "BM25,
chunking, encoding, training, generation" (passage encoding) and "CPU runtimes"
(benchmarks/encoding_throughput.py, benchmarks/runtime_encoding.py).
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# Another file in cpuinfo's format instead: the tests pin a CPU without bf16 units, so that every
# machine runs the same paths (the per-CPU choices have tests of their own), subprocesses included.
CPUINFO_ENV = "PFORGE_CPUINFO"


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The first processor's feature flags (Linux /proc/cpuinfo, or the file $PFORGE_CPUINFO
    names); empty where it cannot be read."""
    try:
        text = Path(os.environ.get(CPUINFO_ENV) or CPUINFO).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


BF16_UNIT_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})   # AMX tiles, AVX-512's bf16 dot product (vdpbf16ps)


def has_bf16_units() -> bool:
    """bf16 products in hardware: AMX tiles, or AVX-512's bf16 dot product (vdpbf16ps)."""
    return bool(BF16_UNIT_FLAGS & cpu_flags())


def auto_bf16(device: str) -> bool:
    """Whether `auto` autocasts to bf16 on `device` ('cpu', 'cuda', 'cuda:N'; resolved, not 'auto')."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return device == "cpu" and has_bf16_units()


def bf16_wanted(flag: str | bool, device: str) -> bool:
    """The one reading of a bf16 setting ('auto', 'on', 'off', True, False) on `device` (resolved):
    'auto' is `auto_bf16`; each caller then rules out what its path cannot take (int8, ONNX)."""
    if flag == "auto":
        return auto_bf16(device)
    return flag == "on" if isinstance(flag, str) else bool(flag)
