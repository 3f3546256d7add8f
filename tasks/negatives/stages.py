"""Negatives family: the `negatives:` config section and one `negatives:STRATEGY` stage per
strategy a trained system names. Every strategy writes the same table (qid, pid, strategy, rank,
score), which any trainer reads as data."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field

from storage import Artifact
from storage.parquet import write_table
from tasks.engine import Stage, StageParams
from tasks.negatives.mining import answer_free_negatives, context_negatives


class RunNegativesConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    depth: int = Field(100, ge=1, description="ranks of the run mined per question")
    filter_answers: bool = Field(True, description="drop passages that contain an answer (paper 003 section 4.1)")
    splits: list[str] = Field(default_factory=lambda: ["train"], description="splits whose questions are mined")


class NegativesConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    bm25: RunNegativesConfig = Field(default_factory=RunNegativesConfig, description="BM25 negatives")


class RunNegativesParams(StageParams):
    strategy: str
    run_stage: str
    depth: int
    filter_answers: bool
    splits: list[str]
    match_type: str


def build_run_negatives(params: RunNegativesParams, inputs: dict[str, Artifact], out: Path) -> dict:
    questions = inputs["ingest_questions"].read_table("questions")
    questions = questions.filter(pc.is_in(questions.column("split"), value_set=pa.array(params.splits)))
    passages = inputs["chunk"].read_table(columns=["pid", "text"])
    negatives = answer_free_negatives(inputs[params.run_stage].read_table(), questions,
                                      dict(zip(passages.column("pid").to_pylist(), passages.column("text").to_pylist())),
                                      inputs["link_gold"].read_table(), params.strategy, params.depth,
                                      params.filter_answers, params.match_type)
    write_table(out, negatives)
    return {"stats": {"questions": len(set(negatives.column("qid").to_pylist())), "negatives": negatives.num_rows}}


class ContextParams(StageParams):
    pairs: list[str]  # the pairs stages whose positives get context negatives


def build_context_negatives(params: ContextParams, inputs: dict[str, Artifact], out: Path) -> dict:
    pairs = pa.concat_tables([inputs[name].read_table() for name in params.pairs])
    questions = inputs["ingest_questions"].read_table("questions", columns=["qid", "answers"])
    answers = dict(zip(questions.column("qid").to_pylist(), questions.column("answers").to_pylist()))
    negatives = context_negatives(pairs, inputs["chunk"].read_table(columns=["pid", "doc_id", "chunk_index", "text"]), answers)
    write_table(out, negatives)
    halves = pc.sum(pc.invert(pc.is_null(negatives.column("text")))).as_py() or 0
    return {"stats": {"queries": len(set(negatives.column("qid").to_pylist())), "negatives": negatives.num_rows,
                      "half_passages": halves}}


def _trained(cfg) -> list:
    return [s for s in (cfg.dense.systems if cfg.dense else []) if s.train]


def stages(cfg, earlier: list[Stage]) -> list[Stage]:
    out = []
    wanted = {n for s in _trained(cfg) for n in s.train.negatives}
    if "context" in wanted:
        # Paper 003 section 4.1: the other passages of the positive's document.
        sources = sorted({p for s in _trained(cfg) if "context" in s.train.negatives for p in s.train.pairs})
        stages_ = [f"pairs:{p}" for p in sources]
        out.append(Stage("negatives:context", "negatives", "1", ("ingest_questions", "chunk", *stages_),
                         ContextParams(pairs=stages_), build_context_negatives, variant={"strategy": "context"}))
    if "bm25" in wanted:
        c = cfg.negatives.bm25
        params = RunNegativesParams(strategy="bm25", run_stage="bm25_search", depth=c.depth, filter_answers=c.filter_answers,
                                    splits=c.splits, match_type=cfg.evaluation.match_type)
        out.append(Stage("negatives:bm25", "negatives", "2", ("ingest_questions", "chunk", "link_gold", "bm25_search"),
                         params, build_run_negatives, variant={"strategy": "bm25"}))
    return out
