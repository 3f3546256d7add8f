"""BM25 family: the `bm25:` config section, the Lucene index over the passages and the BM25 run
of every question (the baseline, and the pool the BM25 negatives are mined from)."""
from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from storage import Artifact
from storage.parquet import write_table
from tasks.engine import Stage, StageParams


class BM25Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # DPR / xMoCo section 4.1: BM25 with k1=0.9, b=0.4 for open-domain QA.
    k1: float = Field(0.9, gt=0)
    b: float = Field(0.4, ge=0, le=1)
    k: int = Field(100, ge=1, description="passages retrieved per question")
    threads: int = Field(2, ge=1)


class IndexParams(StageParams):
    RUNTIME = frozenset({"threads"})
    threads: int


class SearchParams(StageParams):
    RUNTIME = frozenset({"threads"})
    k1: float
    b: float
    k: int
    threads: int


def build_index(params: IndexParams, inputs: dict[str, Artifact], out: Path) -> dict:
    from tasks.bm25.index import build_bm25_index

    passages = inputs["chunk"].read_table(columns=["pid", "title", "text"])
    return {"stats": build_bm25_index(passages, out / "index", threads=params.threads)}


def build_runs(params: SearchParams, inputs: dict[str, Artifact], out: Path) -> dict:
    from tasks.bm25.search import bm25_search

    questions = inputs["ingest_questions"].read_table("questions", columns=["qid", "question"])
    queries = list(zip(questions.column("qid").to_pylist(), questions.column("question").to_pylist()))
    runs = bm25_search(inputs["bm25_index"].subdir("index"), queries, k=params.k, k1=params.k1,
                       b=params.b, threads=params.threads, system="bm25")
    write_table(out, runs)
    return {"stats": {"queries": len(queries), "hits": runs.num_rows}}


def stages(cfg, earlier: list[Stage]) -> list[Stage]:
    b = cfg.bm25
    return [
        Stage("bm25_index", "bm25_index", "1", ("chunk",), IndexParams(threads=b.threads), build_index),
        Stage("bm25_search", "bm25_runs", "1", ("bm25_index", "ingest_questions"),
              SearchParams(k1=b.k1, b=b.b, k=b.k, threads=b.threads), build_runs, produces_runs=True,
              variant={"system": "bm25"}),
    ]
