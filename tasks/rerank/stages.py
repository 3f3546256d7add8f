"""Rerank family: `rerank:` entries, each a stage `rerank:NAME` whose cross-attention classifier
(the `cross_encoder` stage) reorders the top `depth` of another system's run (BM25, a dense
system, a hybrid or fusion): an evaluated system (paper 001's classifier as a reranker). An
entry with `mix:` adds a stage `rerank:NAME-mix`, the same head ordered by a mix of the
classifier's and the first stage's scores whose weight is chosen on a tuning split
(tasks/rerank/mix.py)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from storage import Artifact
from storage.parquet import write_table
from tasks.compute.score import SCORING_SAMPLE, ScoringSettings, cross_encoder_on, scoring_agreement
from tasks.engine import Stage, StageParams
from tasks.fusion.runs import run_stages_by_system
from tasks.fusion.tuning import Tuning, TuningParams, split_scorer
from tasks.rerank.mix import DEFAULT_ALPHAS
from tasks.runners import LOCAL, RunnerConfig, run_shards, runner_stats

logger = logging.getLogger("passage_forge")


class MixConfig(Tuning):
    name: Optional[str] = Field(None, pattern=r"^[A-Za-z0-9_-]+$", description="system name (default: the rerank's "
                                                                                "system + '-mix')")
    tune_split: str = Field("dev", description="split on which alpha is chosen (the rerank must cover it)")
    tune_k: int = Field(1, ge=1, description="cut-off of the metric maximised when choosing alpha (below depth: "
                                             "the head's order matters only there)")
    alphas: list[float] = Field(default_factory=lambda: list(DEFAULT_ALPHAS), min_length=1, description=(
        "the classifier's weights tried, each in [0, 1] (0: the first stage's order, 1: the classifier's)"))

    @field_validator("alphas")
    @classmethod
    def _in_unit_interval(cls, alphas: list[float]) -> list[float]:
        if any(not 0.0 <= a <= 1.0 for a in alphas):
            raise ValueError(f"every alpha must be in [0, 1], got {alphas}")
        return alphas


class RerankConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run: str = Field(..., description="the system reranked: bm25, a dense system, hybrid(NAME), a fusion")
    name: Optional[str] = Field(None, pattern=r"^[A-Za-z0-9_-]+$", description="system name (default: RUN-rerank)")
    depth: int = Field(100, ge=1, description="passages reranked per question (the issue: the top 100)")
    splits: Optional[list[str]] = Field(None, description="questions reranked, by split (empty: all); the system "
                                                          "is evaluated on these splits only")
    shard_questions: int = Field(200, ge=1, description="questions per resumable shard")
    mix: Optional[MixConfig] = Field(None, description="also a system whose head mixes the classifier's and the "
                                                       "first stage's z-scored scores, the weight chosen on a split")

    @model_validator(mode="after")
    def _mix_is_tunable(self):
        if self.mix is None:
            return self
        if self.splits is not None and self.mix.tune_split not in self.splits:
            raise ValueError(f"rerank of {self.run!r}: mix.tune_split {self.mix.tune_split!r} is not reranked "
                             f"(splits: {self.splits}); add it to splits")
        if self.mix.tune_k >= self.depth:
            raise ValueError(f"rerank of {self.run!r}: mix.tune_k {self.mix.tune_k} must be below depth {self.depth}: "
                             "the top-k of a reordered head of depth <= k is the same passages whatever the weight")
        return self

    @property
    def system(self) -> str:
        return self.name or f"{self.run}-rerank".replace("(", "-").replace(")", "")

    @property
    def mix_system(self) -> Optional[str]:
        if self.mix is None:
            return None
        return self.mix.name or f"{self.system}-mix"

    @property
    def systems(self) -> list[str]:
        """The systems this entry makes: the reranked run, and the mix where there is one."""
        return [self.system] + ([self.mix_system] if self.mix is not None else [])


class RerankParams(StageParams):
    RUNTIME = frozenset({"device", "shard_size", "runner"})
    system: str
    run_stage: str
    depth: int
    splits: Optional[list[str]]
    shard_size: int         # questions per shard
    device: str
    batch_size: int
    scoring: ScoringSettings = ScoringSettings()
    runner: RunnerConfig = LOCAL


@dataclass(frozen=True)
class _RerankJob:
    """What every rerank shard shares (small and picklable: it travels to the runner's workers)."""
    model: str          # the cross_encoder artifact's model folder
    device: str         # as configured: 'auto' resolves on the worker
    batch_size: int
    depth: int
    system: str
    n_shards: int
    scoring: ScoringSettings = ScoringSettings()


def _rerank_shard(job: _RerankJob, spec: tuple[int, pa.Table, dict, dict]) -> pa.Table:
    """Shard i: its questions' run, reranked (the shard carries their questions and passages' texts)."""
    from tasks.progress import progress_logger
    from tasks.rerank.rerank import rerank_run

    i, part, question_of, text_of = spec
    device = job.scoring.device(job.device)
    model = cross_encoder_on(job.model, device, job.scoring)
    log = progress_logger(f"{job.system}: shard {i + 1}/{job.n_shards}: pairs")

    def scorer(pairs):
        return model.logits(pairs, batch_size=job.batch_size, device=device, bf16=job.scoring.autocast_bf16(device),
                            progress=log)
    return rerank_run(part, question_of, text_of, scorer, job.depth, job.system)


def build_rerank(params: RerankParams, inputs: dict[str, Artifact], out: Path, work: Path) -> dict:
    import pyarrow.parquet as pq

    from tasks.rerank.rerank import questions_in_shards
    from tasks.schemas import RUNS

    questions = inputs["ingest_questions"].read_table("questions", columns=["qid", "question", "split"])
    if params.splits is not None:
        questions = questions.filter(pc.is_in(questions.column("split"), value_set=pa.array(params.splits)))
    question_of = dict(zip(questions.column("qid").to_pylist(), questions.column("question").to_pylist()))
    run = inputs[params.run_stage].read_table()
    run = run.filter(pc.is_in(run.column("qid"), value_set=pa.array(sorted(question_of))))
    passages = inputs["chunk"].read_table(columns=["pid", "text"])
    text_of = dict(zip(passages.column("pid").to_pylist(), passages.column("text").to_pylist()))
    shards = questions_in_shards(run.column("qid").to_pylist(), params.shard_size)
    specs = []  # each shard carries its questions' run and texts; a fully resumed build loads no model
    for i, qids in enumerate(shards):
        part = run.filter(pc.is_in(run.column("qid"), value_set=pa.array(qids)))
        head = part.filter(pc.less_equal(part.column("rank"), params.depth)).column("pid").to_pylist()
        specs.append((i, part, {q: question_of[q] for q in qids}, {p: text_of[p] for p in head}))
    job = _RerankJob(str(inputs["cross_encoder"].subdir("model")), params.device, params.batch_size, params.depth,
                     params.system, len(shards), params.scoring)
    files = run_shards(params.runner, work, specs, partial(_rerank_shard, job), label=params.system) if shards else []
    table = pa.concat_tables([pq.read_table(f, schema=RUNS) for f in files]) if files else RUNS.empty_table()
    write_table(out, table)
    accuracy = _agreement(job, specs[0], table) if specs else {}
    return {"stats": {"questions": len(set(table.column("qid").to_pylist())), "depth": params.depth,
                      "runtime": params.scoring.runtime, "precision": params.scoring.precision, **accuracy,
                      "reranked_pairs": pc.sum(pc.less_equal(run.column("rank"), params.depth)).as_py() or 0,
                      "splits": params.splits, **runner_stats(params.runner)}}


def _agreement(job: _RerankJob, spec, table: pa.Table) -> dict:
    """The first shard's first reranked pairs: their p (sigmoid of the stored logits) against
    torch fp32's (`scoring_agreement`)."""
    import numpy as np

    from models.cross_encoder import sigmoid

    _, part, question_of, text_of = spec
    head = part.filter(pc.less_equal(part.column("rank"), job.depth)).slice(0, SCORING_SAMPLE)
    score = {(q, p): s for q, p, s in zip(table.column("qid").to_pylist(), table.column("pid").to_pylist(),
                                          table.column("score").to_pylist())}
    keys = list(zip(head.column("qid").to_pylist(), head.column("pid").to_pylist()))
    logits = np.array([score[k] for k in keys], dtype=np.float32)
    return scoring_agreement(job.model, job.scoring, [(question_of[q], text_of[p]) for q, p in keys], sigmoid(logits))


class MixParams(TuningParams):
    run_stage: str           # the first stage's runs
    rerank_stage: str        # the classifier's reranking of them
    depth: int
    alphas: list[float]


def build_mix(params: MixParams, inputs: dict[str, Artifact], out: Path) -> dict:
    from tasks.rerank.mix import choose_alpha, heads_of, mixed_run

    reranked = inputs[params.rerank_stage]
    reranked_depth = reranked.manifest.get("parameters", {}).get("depth")
    if reranked_depth != params.depth:  # below its depth a reranked run holds first-stage ranks, not logits
        raise ValueError(f"{params.system}: mixes a head of {params.depth} but {params.rerank_stage} "
                         f"({reranked.version}) reranked {reranked_depth} passages a question")
    heads = heads_of(inputs[params.run_stage].read_table(), reranked.read_table(), params.depth)
    metric, score_fn, tune = split_scorer(inputs, params, among=list(heads))
    tune_heads = {q: heads[q] for q in tune.column("qid").to_pylist()}
    alpha, scores = choose_alpha(tune_heads, score_fn, params.alphas, params.system)
    logger.info("%s: alpha %s chosen on %s (%s %.4f; 0 = the first stage, 1 = the classifier)", params.system, alpha,
                params.tune_split, metric, scores[alpha])
    write_table(out, mixed_run(heads, alpha, params.system))
    return {"stats": {"alpha": alpha, "tune_split": params.tune_split, "tune_metric": metric,
                      "tune_score": scores[alpha], "tune_curve": {str(a): v for a, v in scores.items()},
                      "questions": len(heads), "tune_questions": len(tune_heads), "depth": params.depth}}


def stages(cfg, earlier: list[Stage]) -> list[Stage]:
    if not cfg.rerank:
        return []
    if cfg.cross_encoder is None:
        raise ValueError("rerank: needs a cross_encoder: section (the classifier that reranks)")
    known = run_stages_by_system(earlier)
    out = []
    for r in cfg.rerank:
        if r.run not in known:
            raise ValueError(f"rerank of {r.run!r}: not a system with runs; systems: {sorted(known)}")
        params = RerankParams(system=r.system, run_stage=known[r.run], depth=r.depth, splits=r.splits,
                              shard_size=r.shard_questions, device=cfg.cross_encoder.device,
                              batch_size=cfg.cross_encoder.batch_size, scoring=ScoringSettings.of(cfg.cross_encoder),
                              runner=cfg.runner)
        out.append(Stage(f"rerank:{r.system}", "reranked_runs", "1",
                         ("cross_encoder", "ingest_questions", "chunk", known[r.run]), params, build_rerank,
                         produces_runs=True, resumable=True, variant={"system": r.system}))
        if r.mix is not None:
            mix = MixParams(system=r.mix_system, run_stage=known[r.run], rerank_stage=f"rerank:{r.system}",
                            depth=r.depth, alphas=r.mix.alphas, match_type=cfg.evaluation.match_type,
                            **r.mix.tuning())
            out.append(Stage(f"rerank:{r.mix_system}", "reranked_runs", "1",
                             ("ingest_questions", "chunk", "link_gold", known[r.run], f"rerank:{r.system}"), mix,
                             build_mix, produces_runs=True, variant={"system": r.mix_system}))
    return out
