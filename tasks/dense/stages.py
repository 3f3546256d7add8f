"""Dense family: the model, encode and index config sections, and per dense system the stages
encode:NAME (passages -> vectors), index:NAME (FAISS) and search:NAME (questions -> runs).

Where a system's encoder comes from (its `origin`) and how vectors are computed are shared with
the other families that encode: tasks/compute/origin.py, tasks/compute/encode.py.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from storage import Artifact
from storage.parquet import write_table
from tasks.compute.device import resolve_device
from tasks.compute.encode import EncodeParams, EncodeSettings, encode_in_shards
from tasks.compute.origin import Origin, origin_of
from tasks.compute.search import QUERY_VECTORS, search_texts
from tasks.engine import Stage, StageParams
from tasks.runners import runner_stats

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


class FaissConfig(_Strict):
    kind: Literal["flat", "hnsw", "ivfpq"] = "flat"
    hnsw_m: int = 32
    ef_search: int = 128
    nlist: Optional[int] = None
    pq_m: Optional[int] = None
    nprobe: int = 16


# ---------------------------------------------------------------- encode, index, search
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
    from tasks.compute.embeddings import vectors_from_table

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
    from tasks.compute import faiss_index
    from tasks.compute.embeddings import vectors_from_table

    _, vectors = vectors_from_table(inputs["encode"].read_table())
    index = faiss_index.build_index(vectors.astype("float32"), kind=params.kind, hnsw_m=params.hnsw_m,
                                    ef_search=params.ef_search, nlist=params.nlist, pq_m=params.pq_m, nprobe=params.nprobe)
    faiss_index.save_index(index, out / "index")
    return {"stats": faiss_index.index_params(index)}


def build_search(params: SearchParams, inputs: dict[str, Artifact], out: Path) -> dict:
    from tasks.compute.embeddings import query_vectors_table

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
