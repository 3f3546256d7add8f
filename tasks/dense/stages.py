"""Dense family: the model, encode and index config sections, and per dense system the stages
encode:NAME (passages -> vectors), index:NAME (FAISS) and search:NAME (questions -> runs).

Where a system's encoder comes from (its `origin`) is shared with the training family: the
system's own trained model, another system's (`init_from: NAME`), a model artifact of any run in
the store (`init_from: dense_model:VERSION`), a pre-trained base encoder (`init_from:
pretrain:NAME`), a folder (`init_from: path`), or the base checkpoint.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from storage import Artifact
from storage.parquet import write_table
from tasks.dense.models import encode_side, for_inference, load_bi_encoder, resolve_device
from tasks.engine import Pinned, Stage, StageParams

#: The table of a search stage's artifact holding its question vectors (qid, vector).
QUERY_VECTORS = "query_vectors"
from tasks.errors import InputError
from tasks.runners import LOCAL, RunnerConfig, run_shards, runner_stats, worker_cached

logger = logging.getLogger("passage_forge")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DenseModelConfig(_Strict):
    base: str = Field("minilm", description="backbone: 'minilm' (the offline all-MiniLM-L6-v2), a local path or a hub name")
    shared: bool = Field(True, description="one tower for questions and passages (paper 003) or two (DPR, xMoCo)")
    pooling: Literal["cls", "mean"] = "mean"
    projection_dim: Optional[int] = Field(None, ge=1, description="FC layer on the pooled vector (paper 003 section 3)")
    normalize: bool = Field(True, description="l2-normalise embeddings")
    scale: float = Field(1.0, gt=0, description="similarity scale (paper 001 section 4.2 uses 100 with normalisation)")


class EncodeConfig(_Strict):
    batch_size: int = Field(64, ge=1)
    shard_size: int = Field(100_000, ge=1, description="passages read, tokenised and written at a time")
    passage_max_len: int = Field(256, ge=8)
    query_max_len: int = Field(64, ge=4)
    dtype: Literal["float32", "float16"] = Field("float32", description="stored embedding precision")
    bf16: Union[bool, Literal["auto"]] = Field(
        "auto", description="bf16 while encoding (torch's autocast; OpenVINO's precision hint); auto: on for CUDA "
        "with bf16 and for CPUs with bf16 units, AMX or avx512_bf16 (models/cpu_features.py: 3.33x fp32 on an AMX "
        "Xeon, slower than fp32 without them), off with int8 or onnx")
    int8: bool = Field(False, description="CPU only: int8 weights (torch: dynamic int8 Linear layers; onnx: ORT dynamic int8; benchmarks/runtime_encoding.py measures speed and accuracy)")
    runtime: Literal["auto", "torch", "onnx", "openvino"] = Field(
        "auto", description="torch (the reference), onnx (ONNX Runtime, CPU) or openvino (OpenVINO, CPU; fp32 or bf16); "
        "auto: openvino at bf16 where the CPU has bf16 units (4.36x sentence-transformers' torch fp32 on a Zen 5), "
        "torch elsewhere (ONNX Runtime fp32 at parity on a Zen 1 EPYC, 1.26-1.45x on a Zen 3; its int8 1.85-2.05x "
        "there but up to 0.4 off the demo's top-20: benchmarks/runtime_encoding.py)")
    device: str = Field("auto", description="'auto' picks CUDA when present")


class FaissConfig(_Strict):
    kind: Literal["flat", "hnsw", "ivfpq"] = "flat"
    hnsw_m: int = 32
    ef_search: int = 128
    nlist: Optional[int] = None
    pq_m: Optional[int] = None
    nprobe: int = 16


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
        from models.onnx_runtime import resolve_runtime

        values = encode.model_dump(include=set(cls.model_fields) - {"runtime", "bf16"})
        bf16 = encode.bf16
        if bf16 == "auto":  # resolved at planning, like the runtime: a version hashes what it ran
            from models.cpu_features import auto_bf16

            bf16 = (not encode.int8 and encode.runtime in ("auto", "torch", "openvino")
                    and auto_bf16(resolve_device(encode.device)))
        return cls(**values, bf16=bf16, runtime=resolve_runtime(encode.runtime, encode.device, bf16))

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


class Origin(BaseModel):
    """Where a system's starting encoder comes from (see the module docstring)."""
    model_config = ConfigDict(frozen=True, extra="forbid")
    model: dict                             # the system's model section (base, towers, pooling, ...)
    model_input: Optional[str] = None       # the input whose model/ folder holds the weights
    init_path: Optional[str] = None         # a folder on this machine (not hashed: init_hash is)
    init_hash: Optional[str] = None

    def folder(self, inputs: dict[str, Artifact]) -> Optional[Path]:
        """The weights' folder (None: the base checkpoint of the model section)."""
        if self.model_input is not None:
            return inputs[self.model_input].subdir("model")
        return Path(self.init_path) if self.init_path is not None else None

    def load(self, inputs: dict[str, Artifact]):
        return self.load_from(self.folder(inputs))

    def load_from(self, path: Optional[Path]):
        if path is not None:
            from models.bi_encoder import CONFIG_NAME

            # A saved bi-encoder keeps its own towers; an exported or plain HF folder (a pretrain
            # stage's base checkpoint) is a backbone under this system's model section.
            return load_bi_encoder(self.model, path) if (path / CONFIG_NAME).is_file() else \
                load_bi_encoder({**self.model, "base": str(path)})
        return load_bi_encoder(self.model)


def folder_hash(path: Path) -> str:
    from models.runtime_cache import folder_digest

    return folder_digest(path)  # the same digest keys runtime conversions


def origin_of(system, cfg_dir: Path | None = None, trained: bool = True) -> tuple[Origin, tuple[str, ...], dict[str, Pinned]]:
    """(origin, input stages, pinned inputs) of `system`'s encoder: with `trained`, its own train
    stage when it has one; otherwise where training starts from."""
    model = system.model.model_dump()
    if trained and system.train is not None:
        return Origin(model=model, model_input=f"train:{system.name}"), (f"train:{system.name}",), {}
    init = system.init_from
    if init is None:
        return Origin(model=model), (), {}
    if init.startswith("pretrain:"):  # a pretrain stage's base checkpoint (its model/ folder)
        return Origin(model=model, model_input=init), (init,), {}
    if init.startswith("dense_model:"):
        return Origin(model=model, model_input="init"), (), {"init": Pinned("dense_model", init.split(":", 1)[1])}
    if "/" in init or init.startswith("."):
        path = Path(init).expanduser()
        if not path.is_absolute():
            path = (cfg_dir or Path.cwd()) / path
        if not path.is_dir():
            raise InputError(path, f"dense system {system.name!r} init_from", "no such model folder")
        return Origin(model=model, init_path=str(path.resolve()), init_hash=folder_hash(path)), (), {}
    return Origin(model=model, model_input=f"train:{init}"), (f"train:{init}",), {}


# ---------------------------------------------------------------- encode, index, search
class EncodeParams(StageParams):
    RUNTIME = frozenset({"device", "shard_size", "origin.init_path", "runner"})
    system: str
    origin: Origin
    settings: EncodeSettings
    device: str
    shard_size: int
    runner: RunnerConfig = LOCAL


class IndexParams(StageParams):
    kind: str
    hnsw_m: int
    ef_search: int
    nlist: Optional[int]
    pq_m: Optional[int]
    nprobe: int


class SearchParams(EncodeParams):
    k: int


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
    from tasks.dense.encode import embeddings_table

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


def build_encode(params: EncodeParams, inputs: dict[str, Artifact], out: Path, work: Path) -> dict:
    """Encode the passages in resumable shards (`encode_in_shards`)."""
    import pyarrow.parquet as pq

    from storage.parquet import parquet_rows
    from storage.shards import move_shards_into

    files = encode_in_shards(params.origin, params.origin.folder(inputs), params.settings, params.device, params.runner,
                             work, inputs["chunk"].table_files(), params.shard_size, f"encode:{params.system}")
    first = next(f for f in inputs["chunk"].table_files() if parquet_rows(f))  # the first shard's passages
    accuracy = reference_agreement(params.origin, params.origin.folder(inputs), params.settings,
                                   resolve_device(params.device), first, files[0])
    move_shards_into(files, out)
    dim = pq.read_schema(files[0]).field("vector").type.list_size
    total = sum(parquet_rows(f) for f in files)
    return {"stats": {"passages": total, "dim": dim, "shard_size": params.shard_size, "shards": len(files),
                      "runtime": params.settings.runtime, "precision": params.settings.precision, **accuracy,
                      **runner_stats(params.runner)}}


REFERENCE_SAMPLE = 32  # passages re-encoded by torch fp32 to check a faster path (seconds, not minutes)


def reference_agreement(origin: Origin, folder: Optional[Path], settings: EncodeSettings, device: str,
                        passages: Path, vectors: Path) -> dict:
    """For a path other than torch fp32 (onnx, int8, bf16): the mean and min cosine between its
    vectors of the first passages (`vectors`, the first shard written from the `passages` file)
    and torch fp32's vectors of the same passages; {} for torch fp32 itself."""
    import numpy as np
    import pyarrow.parquet as pq

    from storage.shards import read_rows
    from tasks.dense.encode import vectors_from_table

    if settings.runtime == "torch" and settings.precision == "fp32":
        return {}
    got = vectors_from_table(pq.read_table(vectors).slice(0, REFERENCE_SAMPLE))[1].astype(np.float32)
    rows = read_rows(passages, 0, len(got), ["title", "text"])
    pairs = list(zip(rows.column("title").to_pylist(), rows.column("text").to_pylist()))
    reference = settings.model_copy(update={"runtime": "torch", "int8": False, "bf16": False})
    model = reference.for_inference(origin.load_from(folder), device)
    want = reference.encode(model, pairs, "passage", device).astype(np.float32)
    cos = (got * want).sum(1) / np.maximum(np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1), 1e-12)
    return {"reference": {"against": "torch fp32", "passages": len(got), "mean_cosine": round(float(cos.mean()), 6),
                          "min_cosine": round(float(cos.min()), 6)}}


def build_index(params: IndexParams, inputs: dict[str, Artifact], out: Path) -> dict:
    from tasks.dense import faiss_index
    from tasks.dense.encode import vectors_from_table

    _, vectors = vectors_from_table(inputs["encode"].read_table())
    index = faiss_index.build_index(vectors.astype("float32"), kind=params.kind, hnsw_m=params.hnsw_m,
                                    ef_search=params.ef_search, nlist=params.nlist, pq_m=params.pq_m, nprobe=params.nprobe)
    faiss_index.save_index(index, out / "index")
    return {"stats": faiss_index.index_params(index)}


def search_texts(origin: Origin, settings: EncodeSettings, inputs: dict[str, Artifact], encoded: Artifact,
                 index: Artifact, qids, texts: list[str], k: int, device: str, system: str, log=None):
    """(RUNS, query vectors): `texts` encoded by `origin`'s encoder with `settings`, searched in
    the FAISS `index` artifact whose rows are the `encoded` artifact's passages."""
    from tasks.dense import faiss_index

    pids = encoded.read_table(columns=["pid"]).column("pid")
    model = settings.for_inference(origin.load(inputs), device)
    vectors = settings.encode(model, texts, "query", device, log=log)
    loaded = faiss_index.load_index(index.subdir("index"))
    return faiss_index.search(loaded, vectors.astype("float32"), k, pids, qids, system=system), vectors


def build_search(params: SearchParams, inputs: dict[str, Artifact], out: Path) -> dict:
    from tasks.dense.encode import query_vectors_table

    device = params.settings.device(params.device)
    questions = inputs["ingest_questions"].read_table("questions", columns=["qid", "question"])
    runs, vectors = search_texts(params.origin, params.settings, inputs, inputs["encode"], inputs["index"],
                                 questions.column("qid"), questions.column("question").to_pylist(), params.k, device,
                                 params.system, log=_log)
    write_table(out, runs)
    # The question vectors too: miners and embedding fusion read them instead of re-encoding.
    write_table(out, query_vectors_table(questions.column("qid").to_pylist(), vectors), name=QUERY_VECTORS)
    return {"stats": {"queries": questions.num_rows, "hits": runs.num_rows}}


def _renamed(build, **keys):
    """`build` with inputs also reachable under generic keys (e.g. 'encode' for 'encode:NAME')."""
    def run(params, inputs, out, *work):
        return build(params, {**inputs, **{alias: inputs[name] for alias, name in keys.items()}}, out, *work)
    return run


def stages(cfg, earlier: list[Stage]) -> list[Stage]:
    if cfg.dense is None:
        return []
    out = []
    enc, settings = cfg.dense.encode, EncodeSettings.of(cfg.dense.encode)
    for system in cfg.dense.systems:
        if not system.evaluate:  # train-only: its model is an input of other systems, not a run
            continue
        n = system.name
        origin, model_stages, pinned = origin_of(system, cfg.config_dir)
        common = dict(system=n, origin=origin, settings=settings, device=enc.device,
                      shard_size=enc.shard_size, runner=cfg.runner)
        variant = {"system": n}
        out.append(Stage(f"encode:{n}", "embeddings", "2", ("chunk", *model_stages), EncodeParams(**common),
                         _renamed(build_encode), pinned=pinned, variant=variant, resumable=True))
        out.append(Stage(f"index:{n}", "faiss_index", "1", (f"encode:{n}",), IndexParams(**cfg.dense.index.model_dump()),
                         _renamed(build_index, encode=f"encode:{n}"), variant=variant))
        out.append(Stage(f"search:{n}", "dense_runs", "3", ("ingest_questions", f"encode:{n}", f"index:{n}", *model_stages),
                         SearchParams(**common, k=cfg.bm25.k), _renamed(build_search, encode=f"encode:{n}", index=f"index:{n}"),
                         produces_runs=True, pinned=pinned, variant=variant))
    return out
