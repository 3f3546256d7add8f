"""The machine a record was measured on: the CPU as lscpu names it (model name, family, model),
the flags that choose precision and kernels, the thread count, and a short fp32 matrix-product
probe, so that a time measured on one CPU can be priced on another."""
from __future__ import annotations

import os
import subprocess
import time

# The flags that decide what `auto` runs and how fast: bf16 units, AVX-512, VNNI, AVX2.
FLAGS_THAT_MATTER = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
PROBE_SIZE = 1024  # an fp32 product of two 1024 x 1024 matrices: about 2.1 GFLOP, tens of ms on these CPUs


def lscpu_fields(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def describe_cpu(lscpu_text: str | None = None, cpuinfo_flags: frozenset[str] | None = None) -> dict:
    """{model_name, family, model, key, flags, cores}: `key` ("AMD EPYC (family 25 model 1)")
    tells apart CPUs that share a model name."""
    if lscpu_text is None:
        try:
            lscpu_text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            lscpu_text = ""
    fields = lscpu_fields(lscpu_text)
    if cpuinfo_flags is None:
        cpuinfo_flags = frozenset(fields.get("Flags", "").split())
    name, family, model = fields.get("Model name", "unknown CPU"), fields.get("CPU family"), fields.get("Model")
    key = f"{name} (family {family} model {model})" if family and model else name
    return {"model_name": name, "family": family, "model": model, "key": key,
            "flags": [f for f in FLAGS_THAT_MATTER if f in cpuinfo_flags], "cores": os.cpu_count()}


def sgemm_gflops(threads: int, size: int = PROBE_SIZE, repeat: int = 5) -> float:
    """The median fp32 GFLOP/s of a size x size matrix product on `threads` torch threads."""
    import torch

    from models.threads import pinned_threads

    a, b = torch.randn(size, size), torch.randn(size, size)
    times = []
    with pinned_threads(threads):
        a @ b  # warm-up: thread pool start and page faults
        for _ in range(repeat):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
    times.sort()
    return round(2 * size ** 3 / times[len(times) // 2] / 1e9, 1)


def this_machine(threads: int) -> dict:
    """describe_cpu() of this machine, with the thread count the study runs at and its probe."""
    return {**describe_cpu(), "threads": threads, "sgemm_gflops": sgemm_gflops(threads)}


def auto_precision(machine: dict) -> str:
    """What `auto` trains and encodes in on a record's machine: bf16 where the CPU has bf16 units
    (models.cpu_features.has_bf16_units' rule, read from the flags the record keeps), else fp32."""
    from models.cpu_features import BF16_UNIT_FLAGS

    return "bf16" if BF16_UNIT_FLAGS & set(machine.get("flags") or ()) else "fp32"
