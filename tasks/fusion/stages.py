"""Fusion family: systems that fuse the runs of other systems, each an evaluated system.

- `fusion:` entries: linear fusion of any runs (runs[0] weight 1, the others' weights chosen on
  the dev split by coordinate search over a grid), reciprocal rank fusion (paper 003 section
  4.4, k=60), or embedding fusion of dense systems (paper 003 section 4.4: per-model coefficients
  chosen on dev, embeddings scaled and concatenated, one retrieval; tasks/fusion/embedding.py),
  as stage `fusion:NAME`.
- `dense.hybrid` (papers 000 and 003): BM25 + one dense system, linear, the BM25 weight chosen on
  dev; stage `hybrid`, system `hybrid(NAME)`.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal, Optional

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, model_validator

from storage import Artifact
from storage.parquet import write_table
from tasks.compute.search import QUERY_VECTORS
from tasks.engine import Stage
from tasks.fusion.runs import run_stages_by_system
from tasks.fusion.tuning import Tuning, TuningParams, split_scorer

logger = logging.getLogger("passage_forge")


class HybridConfig(Tuning):
    system: str = Field(..., description="the dense system fused with BM25 (papers 000 and 003)")


class FusionConfig(Tuning):
    name: str = Field(..., pattern=r"^[A-Za-z0-9_-]+$", description="system name in runs and metrics")
    method: Literal["linear", "rrf", "embedding"] = Field(
        "linear", description="weighted score sum, reciprocal rank fusion, or scaled concatenated embeddings")
    runs: list[str] = Field(..., min_length=2, description="systems fused: bm25, dense systems, earlier fusions "
                                                            "(embedding: dense systems only); linear and embedding: "
                                                            "the first keeps weight 1")
    rrf_k: int = Field(60, ge=1, description="RRF's k (paper 003 section 4.4, after Cormack et al. 2009)")
    rounds: int = Field(3, ge=1, description="linear and embedding: coordinate-search rounds over the weights")
    grid: Optional[list[float]] = Field(
        None, min_length=1, description="embedding: the coefficients tried per model (default 0..2, step 0.05, "
                                        "as the linear weights)")

    @model_validator(mode="after")
    def _embedding_runs(self):
        if self.grid is not None and self.method != "embedding":
            raise ValueError(f"fusion {self.name!r}: grid is for method embedding, not {self.method}")
        if self.method != "embedding":
            return self
        if self.grid is not None and any(g < 0 for g in self.grid):
            raise ValueError(f"fusion {self.name!r}: embedding coefficients must be >= 0, got {self.grid}")
        if "bm25" in self.runs:  # the one system known here to have no vectors; stages() checks the rest
            raise ValueError(f"fusion {self.name!r}: embedding fusion concatenates dense embeddings and run 'bm25' "
                             "has none (fuse it with method linear or rrf)")
        if len(set(self.runs)) != len(self.runs):
            raise ValueError(f"fusion {self.name!r}: embedding fusion lists a system twice: {self.runs}")
        return self


class FusionParams(TuningParams):
    method: str
    runs: list[str]          # input stage names, in fusion order
    rrf_k: int
    rounds: int
    k: int


def build_fusion(params: FusionParams, inputs: dict[str, Artifact], out: Path) -> dict:
    from tasks.dense.hybrid import choose_weights, fuse_linear, reciprocal_rank_fusion

    runs = [inputs[name].read_table() for name in params.runs]
    if params.method == "rrf":
        write_table(out, reciprocal_rank_fusion(runs, k_rrf=params.rrf_k, k=params.k, system=params.system))
        return {"stats": {"method": "rrf", "rrf_k": params.rrf_k}}
    metric, score_fn, tune_ids = _tuning(params, inputs)

    def on_tune(run: pa.Table) -> pa.Table:  # a speed-up: the scorer reads the tuning questions only
        return run.filter(pc.is_in(run.column("qid"), value_set=tune_ids))

    weights, scores = choose_weights([on_tune(r) for r in runs], score_fn, k=params.k, rounds=params.rounds)
    best = scores[weights]
    logger.info("%s: weights %s chosen on %s (%s %.4f)", params.system, weights, params.tune_split, metric, best)
    write_table(out, fuse_linear(runs, weights, k=params.k, system=params.system))
    stats = {"weights": [[run, w] for run, w in zip(params.runs, weights)],  # in fusion order
             "tune_split": params.tune_split, "tune_metric": metric, "tune_score": best}
    if len(runs) == 2:  # the BM25 weight of a hybrid, and its curve
        stats["weight"] = weights[1]
        stats["tune_scores"] = {str(w[1]): v for w, v in scores.items()}
    return {"stats": stats}


def _tuning(params: TuningParams, inputs: dict[str, Artifact]):
    metric, score_fn, tune = split_scorer(inputs, params)
    return metric, score_fn, tune.column("qid")


class EmbeddingFusionParams(TuningParams):
    systems: list[str]       # the dense systems fused, in order: inputs encode:X and search:X
    grid: list[float]
    rounds: int
    k: int


def build_embedding_fusion(params: EmbeddingFusionParams, inputs: dict[str, Artifact], out: Path) -> dict:
    from tasks.compute.embeddings import vectors_from_table
    from tasks.fusion.embedding import align_vectors, fused_passage_index, retrieve, rows_in_order, tune_coefficients

    pids, passage_vectors = align_vectors(
        [(s, *vectors_from_table(inputs[f"encode:{s}"].read_table())) for s in params.systems], "pid")
    index = fused_passage_index(passage_vectors)
    del passage_vectors  # the index holds its own copy
    qids, query_vectors = align_vectors(
        [(s, *vectors_from_table(inputs[f"search:{s}"].read_table(QUERY_VECTORS))) for s in params.systems], "qid")
    metric, score_fn, tune_ids = _tuning(params, inputs)
    tune_qids = tune_ids.to_pylist()
    tune_vectors = [rows_in_order(qids, v, tune_qids, s, "qid") for s, v in zip(params.systems, query_vectors)]
    coefficients, scores = tune_coefficients(index, pids, tune_vectors, tune_qids, score_fn, k=params.k,
                                             grid=params.grid, rounds=params.rounds, system=params.system)
    best = scores[coefficients]
    logger.info("%s: coefficients %s chosen on %s (%s %.4f)", params.system, coefficients, params.tune_split,
                metric, best)
    write_table(out, retrieve(index, pids, query_vectors, qids, coefficients, params.k, system=params.system))
    return {"stats": {"method": "embedding",
                      "coefficients": [[s, c] for s, c in zip(params.systems, coefficients)],  # in fusion order
                      "tune_split": params.tune_split, "tune_metric": metric, "tune_score": best,
                      "tune_curve": [{"coefficients": list(cs), "score": v} for cs, v in scores.items()],
                      "dim": int(index.d), "passages": len(pids), "queries": len(qids)}}


def _embedding_stage(cfg, fusion: FusionConfig, earlier: list[Stage]) -> Stage:
    """fusion:NAME over the vectors of dense systems: their encode:X and search:X stages."""
    from tasks.dense.hybrid import DEFAULT_GRID

    names = {s.name for s in earlier}
    dense = sorted(s.variant["system"] for s in earlier if s.name.startswith("search:") and "system" in s.variant)
    for run in fusion.runs:
        if f"encode:{run}" not in names or f"search:{run}" not in names:
            raise ValueError(f"fusion {fusion.name!r}: embedding fusion needs embeddings, and {run!r} is not a dense "
                             f"system (dense systems: {dense})")
    params = EmbeddingFusionParams(system=fusion.name, systems=list(fusion.runs),
                                   grid=list(fusion.grid if fusion.grid is not None else DEFAULT_GRID),
                                   rounds=fusion.rounds, k=cfg.bm25.k, match_type=cfg.evaluation.match_type,
                                   **fusion.tuning())
    vectors = [f"{stage}:{run}" for run in fusion.runs for stage in ("encode", "search")]
    return Stage(f"fusion:{fusion.name}", "hybrid_runs", "1", ("ingest_questions", "chunk", "link_gold", *vectors),
                 params, build_embedding_fusion, produces_runs=True, variant={"system": fusion.name})


def _stage(cfg, name: str, system: str, method: str, run_stages: list[str], tuning: Tuning, **extra) -> Stage:
    params = FusionParams(system=system, method=method, runs=run_stages, rrf_k=extra.get("rrf_k", 60),
                          rounds=extra.get("rounds", 1), k=cfg.bm25.k, match_type=cfg.evaluation.match_type,
                          **tuning.tuning())
    tuning_inputs = ("ingest_questions", "chunk", "link_gold") if method == "linear" else ()
    return Stage(name, "hybrid_runs", "3", (*tuning_inputs, *run_stages), params, build_fusion,
                 produces_runs=True, variant={"system": system})


def stages(cfg, earlier: list[Stage]) -> list[Stage]:
    known = run_stages_by_system(earlier)
    out = []
    hybrid = cfg.dense.hybrid if cfg.dense else None
    if hybrid is not None:
        # The dense run is the anchor (weight 1), BM25 gets the tuned weight (DPR's hybrid).
        out.append(_stage(cfg, "hybrid", f"hybrid({hybrid.system})", "linear",
                          [known[hybrid.system], known["bm25"]], hybrid))
    for fusion in cfg.fusion:
        known.update(run_stages_by_system(out))
        missing = [r for r in fusion.runs if r not in known]
        if missing:
            raise ValueError(f"fusion {fusion.name!r}: unknown systems {missing}; systems so far: {sorted(known)}")
        if fusion.method == "embedding":
            out.append(_embedding_stage(cfg, fusion, [*earlier, *out]))
            continue
        out.append(_stage(cfg, f"fusion:{fusion.name}", fusion.name, fusion.method, [known[r] for r in fusion.runs],
                          fusion, rrf_k=fusion.rrf_k, rounds=fusion.rounds))
    return out
