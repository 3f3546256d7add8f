"""How dense vectors are computed, shared by every stage that computes them (encode, search, the
training dev metric, mining, silver's dense retriever, refresh): the `dense.encode` config
section, the settings a version hashes, and a passages table encoded in resumable shards."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from models.encoder_runtimes import EncoderRuntime, resolve_encoder_runtime
from tasks.compute.device import resolve_device
from tasks.compute.origin import Origin
from tasks.compute.bi_encoder import encode_side, for_inference
from tasks.engine import StageParams
from tasks.runners import LOCAL, RunnerConfig, run_shards, worker_cached

logger = logging.getLogger("passage_forge")


class EncodeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    batch_size: int = Field(64, ge=1)
    shard_size: int = Field(100_000, ge=1, description="passages read, tokenised and written at a time")
    passage_max_len: int = Field(256, ge=8)
    query_max_len: int = Field(64, ge=4)
    dtype: Literal["float32", "float16"] = Field("float32", description="stored embedding precision")
    bf16: Union[bool, Literal["auto"]] = Field(
        "auto", description="bf16 while encoding (torch's autocast; OpenVINO's precision hint); auto: on for CUDA "
        "with bf16 and for CPUs with bf16 units (AMX or avx512_bf16; emulated, and slower than fp32, without them), "
        "off with int8 or onnx")
    int8: bool = Field(False, description="CPU only: int8 weights (torch: dynamic int8 Linear layers; onnx: ORT dynamic int8; benchmarks/runtime_encoding.py measures speed and accuracy)")
    runtime: EncoderRuntime = Field(
        "auto", description="torch (the reference), onnx (ONNX Runtime, CPU) or openvino (OpenVINO, CPU; fp32 or bf16); "
        "auto: openvino at bf16 where the CPU has bf16 units, torch elsewhere (measured in docs/benchmarks.md, "
        "'CPU runtimes')")
    device: str = Field("auto", description="'auto' picks CUDA when present")


class EncodeSettings(BaseModel):
    """How vectors are computed (hashed wherever vectors are computed, the dev metric included)."""
    model_config = ConfigDict(frozen=True, extra="forbid")
    batch_size: int
    passage_max_len: int
    query_max_len: int
    dtype: str
    bf16: bool
    int8: bool = False
    runtime: Literal["torch", "onnx", "openvino"] = "torch"   # resolved at planning: the runtime a version was computed with

    @classmethod
    def of(cls, encode: EncodeConfig) -> "EncodeSettings":
        values = encode.model_dump(include=set(cls.model_fields) - {"runtime", "bf16"})
        bf16 = encode.bf16
        if bf16 == "auto":  # resolved at planning, like the runtime: a version hashes what it ran
            from models.cpu_features import bf16_wanted

            bf16 = (not encode.int8 and encode.runtime in ("auto", "torch", "openvino")
                    and bf16_wanted("auto", resolve_device(encode.device)))
        return cls(**values, bf16=bf16, runtime=resolve_encoder_runtime(encode.runtime, encode.device, bf16))

    @property
    def precision(self) -> str:
        return "int8" if self.int8 else "bf16" if self.bf16 else "fp32"

    def for_inference(self, model, device: str):
        return for_inference(model, device, self.int8, self.runtime, self.bf16)

    def device(self, configured: str) -> str:
        """Where vectors are computed: the CPU for onnx and int8 (a worker of a planned-on-CPU
        version may see a GPU), else the configured device ('auto' resolved here)."""
        return "cpu" if self.runtime in ("onnx", "openvino") or self.int8 else resolve_device(configured)

    def encode(self, model, texts, side: str, device: str, **kw):
        # bf16 is torch's autocast for a torch model (the dev metric's model in training, whatever the
        # runtime: no export per evaluation) and compiled into an OpenVINO one
        import torch

        return encode_side(model, texts, side, batch_size=self.batch_size, passage_max_len=self.passage_max_len,
                           query_max_len=self.query_max_len, dtype=self.dtype,
                           bf16=self.bf16 and isinstance(model, torch.nn.Module), device=device, **kw)


class EncodeParams(StageParams):
    """A stage that encodes passages with a system's encoder: the dense family's encode and the
    corpus refresh's re-encode hash the same fields, so one change of how vectors are computed
    moves both."""
    RUNTIME = frozenset({"device", "shard_size", "origin.init_path", "runner"})
    system: str
    origin: Origin
    settings: EncodeSettings
    device: str
    shard_size: int
    runner: RunnerConfig = LOCAL


def _log(message: str) -> None:
    logger.info(message)


@dataclass(frozen=True)
class _EncodeJob:
    """What every encode shard shares (small and picklable: it travels to the runner's workers)."""
    origin: Origin
    folder: Optional[str]
    settings: EncodeSettings
    device: str       # as configured: 'auto' resolves on the worker, which may have a GPU
    total: int


def _encode_shard(job: _EncodeJob, spec: tuple[str, int, int, int]):
    """Shard (file, start, stop, rows before it): its passages' vectors, as an embeddings table."""
    from storage.shards import read_rows
    from tasks.compute.embeddings import embeddings_table

    path, start, stop, done = spec
    device = job.settings.device(job.device)
    model = worker_cached(("bi_encoder", job.origin.model_dump_json(), job.folder, device, job.settings.int8,
                           job.settings.runtime, job.settings.bf16),
                          lambda: job.settings.for_inference(job.origin.load_from(job.folder and Path(job.folder)), device))
    rows = read_rows(Path(path), start, stop, ["pid", "title", "text"])
    pairs = list(zip(rows.column("title").to_pylist(), rows.column("text").to_pylist()))
    vectors = job.settings.encode(model, pairs, "passage", device, done=done, total=job.total, log=_log)
    return embeddings_table(rows.column("pid").to_pylist(), vectors)


def encode_in_shards(origin: Origin, folder: Optional[Path], settings: EncodeSettings, device: str,
                     runner: RunnerConfig | None, work: Path, files: list[Path], shard_size: int, label: str) -> list[Path]:
    """The passages of `files` (pid, title, text) encoded in resumable shards of `shard_size` rows
    (each read, tokenised and written at a time, so memory is bounded by a shard, not by the
    corpus), computed where `runner` says. Returns the embeddings shards, in the passages' order."""
    from storage.parquet import parquet_rows

    specs, total = [], 0
    for f in files:
        rows = parquet_rows(f)
        specs += [(str(f), start, min(start + shard_size, rows), total + start) for start in range(0, rows, shard_size)]
        total += rows
    if not specs:
        raise ValueError(f"{label}: the passages table is empty")
    job = _EncodeJob(origin, str(folder) if folder else None, settings, device, total)
    return run_shards(runner, work, specs, partial(_encode_shard, job), label=label)
