"""Which runtime a generation runs with, and a generator loaded on it. Chosen when a run is
planned, so that the version hashes the runtime that will run: 'auto' is llama.cpp (models/llamacpp_generator.py) on a CPU for a
Llama-family causal model when llama_cpp imports, else CTranslate2 int8
(models/ct2_generator.py) when ctranslate2 does, else torch (CUDA keeps torch: its batched fp32
path is the measured one there). Above both runtimes, so that neither imports the other."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, get_args

from models import ct2_generator, llamacpp_generator

#: what a config may name; planning resolves 'auto' (resolve_generator_runtime)
GeneratorRuntime = Literal["auto", "torch", "ctranslate2", "llamacpp"]
GeneratorPrecision = Literal["auto", "int8", "float32", "bfloat16"]
RUNTIMES = get_args(GeneratorRuntime)
COMPUTE_TYPES = get_args(GeneratorPrecision)
#: packaged aliases (models/checkpoints.py) and their model_type, known without building them
ALIAS_MODEL_TYPES = {"smollm2": "llama"}


def model_type_of(generator: str) -> str | None:
    """config.json's model_type of an alias or a local folder; None when unknown without loading
    (a hub name)."""
    if generator.lower() in ALIAS_MODEL_TYPES:
        return ALIAS_MODEL_TYPES[generator.lower()]
    config = Path(generator) / "config.json"
    if config.is_file():
        return json.loads(config.read_text()).get("model_type")
    return None


def resolve_generator_runtime(runtime: str, compute_type: str, generator: str, kind: str, device: str) -> tuple[str, str]:
    """The (runtime, compute_type) a generation runs with: 'auto' resolved for this machine and
    model. torch always computes in float32; CTranslate2 defaults to int8, llama.cpp to q8_0, or to
    bf16 where both the CPU and the llama.cpp build multiply bf16 in hardware."""
    if runtime not in RUNTIMES:
        raise ValueError(f"qgen.generate.runtime must be one of {RUNTIMES}, got {runtime!r}")
    if compute_type not in COMPUTE_TYPES:
        raise ValueError(f"qgen.generate.compute_type must be one of {COMPUTE_TYPES}, got {compute_type!r}")
    if runtime == "auto":
        runtime = "torch"
        if device == "cpu" and kind in ("auto", "causal") and model_type_of(generator) in ct2_generator.LLAMA_FAMILY:
            # llama.cpp ahead of CTranslate2 on the CPU (docs/benchmarks.md, "CPU runtimes")
            if llamacpp_generator.llamacpp_available():
                runtime = "llamacpp"
            elif ct2_generator.ctranslate2_available():
                runtime = "ctranslate2"
    if runtime == "torch":
        if compute_type not in ("auto", "float32"):
            raise ValueError(f"qgen.generate.compute_type {compute_type!r} needs runtime llamacpp or ctranslate2 "
                             "(torch generates in float32)")
        return "torch", "float32"
    if runtime == "ctranslate2" and compute_type == "bfloat16":
        raise ValueError("qgen.generate.compute_type bfloat16 needs runtime llamacpp (CTranslate2 has no bf16 on the CPU)")
    if compute_type == "auto":
        # llama.cpp bf16 where bf16 runs in hardware: faster than q8_0 with the questions' quality kept
        # (docs/benchmarks.md, "CPU runtimes"); emulated, and slow, without AVX-512 bf16
        return runtime, "bfloat16" if runtime == "llamacpp" and llamacpp_generator.llamacpp_bf16_in_hardware() else "int8"
    return runtime, compute_type


def load_on_runtime(base, source: str, runtime: str, compute_type: str, device: str, threads: int | None):
    """`base` (a QueryGenerator loaded from `source`, an alias or folder) ready to sample on a
    resolved `runtime`: wrapped with its cached llama.cpp or CTranslate2 conversion, or moved to
    `device` for torch."""
    if runtime == "llamacpp":
        return llamacpp_generator.load_llamacpp_generator(base, source, compute_type, threads)
    if runtime == "ctranslate2":
        return ct2_generator.load_ct2_generator(base, source, compute_type, device, threads)
    base.model.to(device).eval()
    return base
