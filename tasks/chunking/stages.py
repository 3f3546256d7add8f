"""Chunk family: the `chunk:` config section and the chunk stage (documents -> passages), which
also takes DPR passage TSVs as they are (`data.dpr_passages`)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field

from storage import Artifact
from storage.parquet import ParquetTableWriter
from tasks import schemas
from tasks.chunking.chunker import chunk_documents
from tasks.engine import Stage, StageParams
from tasks.errors import InputError
from storage.file_identity import file_sha256
from tasks.progress import report
from tasks.readers.paths import existing

logger = logging.getLogger("passage_forge")


class ChunkConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # DPR / xMoCo section 4.1: disjoint 100-word passages. 0: one passage per document.
    words: int = Field(100, ge=0, description="passage length in words (0: whole documents)")
    stride: Optional[int] = Field(None, ge=1, description="words between passage starts (default: words, no overlap)")


class ChunkParams(StageParams):
    RUNTIME = frozenset({"tsv_paths"})
    words: int
    stride: Optional[int]
    tsv_files: dict[str, str] = {}    # DPR passage TSVs: file name -> content hash
    tsv_paths: list[str] = []         # where they are on this machine


def build_passages(params: ChunkParams, inputs: dict[str, Artifact], out: Path) -> dict:
    from tasks.readers.dpr import iter_dpr_passages

    writer = ParquetTableWriter(out, schemas.PASSAGES)
    table = inputs["ingest_documents"].read_table()
    done = 0
    for batch in table.to_batches(max_chunksize=1_000):
        writer.write_batch(list(chunk_documents(batch.to_pylist(), params.words, params.stride)))
        done += batch.num_rows
        report("chunk: documents", done, table.num_rows)
    seen: dict[str, str] = {}
    for path in params.tsv_paths:
        batch = []
        for passage in iter_dpr_passages(path):
            if passage["pid"] in seen:
                raise InputError(path, f"passage {passage['pid']!r}", f"duplicate id (also in {seen[passage['pid']]})")
            seen[passage["pid"]] = Path(path).name
            batch.append(passage)
            if len(batch) == 10_000:
                writer.write_batch(batch)
                batch = []
        writer.write_batch(batch)
    rows = writer.close()
    if rows == 0:
        raise InputError("chunk", "passages", "no passages: the documents are empty and no DPR passage file was given")
    logger.info("chunk: %s documents + %s DPR passages -> %s passages", f"{table.num_rows:,}", f"{len(seen):,}", f"{rows:,}")
    return {"stats": {"documents": table.num_rows, "dpr_passages": len(seen), "passages": rows}}


def chunk_params(cfg) -> ChunkParams:
    paths = [existing(cfg.data, p, "DPR passage file") for p in cfg.data.dpr_passages]
    return ChunkParams(words=cfg.chunk.words, stride=cfg.chunk.stride,
                       tsv_files={p.name: file_sha256(p) for p in paths}, tsv_paths=[str(p) for p in paths])


def stages(cfg, earlier: list[Stage]) -> list[Stage]:
    return [Stage("chunk", "passages", "1", ("ingest_documents",), chunk_params(cfg), build_passages)]
