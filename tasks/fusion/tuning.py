"""Choosing a system's weights on a split of its questions, shared by every tuned system (a linear
fusion, a hybrid, an embedding fusion, a rerank's mix): the settings their configs share
(`Tuning`), the parameters their stages hash (`TuningParams`), and the score the weights maximise
(`split_scorer` over a stage's inputs, `tune_scorer` over given tables)."""
from __future__ import annotations

from typing import Callable, Literal, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field

from tasks.engine import StageParams

TuneMetric = Literal["auto", "accuracy", "ndcg"]


class Tuning(BaseModel):
    """A config's tuning settings; a subclass may redeclare a field for its own default."""
    model_config = ConfigDict(extra="forbid")
    tune_split: str = Field("dev", description="split on which the weights are chosen")
    tune_k: int = Field(20, ge=1, description="cut-off of the metric maximised when choosing the weights")
    tune_metric: TuneMetric = Field(
        "auto", description="top-k answer accuracy, or nDCG@k on the gold qrels; 'auto': accuracy when questions carry answers")

    def tuning(self) -> dict:
        """The tuning settings alone, as `TuningParams` takes them."""
        return self.model_dump(include=set(Tuning.model_fields))


class TuningParams(StageParams):
    """What a tuned stage's builder reads to score a run on its tuning split."""
    system: str
    tune_split: str
    tune_k: int
    tune_metric: str
    match_type: str


def split_scorer(inputs: Mapping, params: TuningParams,
                 among: Sequence[str] | None = None) -> tuple[str, Callable[[pa.Table], float], pa.Table]:
    """`tune_scorer` over the questions of the tuning split (those of them in `among`, when given),
    read from a stage's inputs `ingest_questions`, `chunk` and `link_gold`: (metric name, run ->
    float, questions)."""
    questions = inputs["ingest_questions"].read_table("questions")
    if among is not None:
        questions = questions.filter(pc.is_in(questions.column("qid"), value_set=pa.array(sorted(among))))
    tune = questions.filter(pc.equal(questions.column("split"), params.tune_split))
    if tune.num_rows == 0:
        raise ValueError(f"{params.system}: no questions in split {params.tune_split!r} to tune on")
    passages = inputs["chunk"].read_table(columns=["pid", "text"])
    passage_text = dict(zip(passages.column("pid").to_pylist(), passages.column("text").to_pylist()))
    metric, score_fn = tune_scorer(params.tune_metric, tune, passage_text, inputs["link_gold"].read_table(),
                                   params.tune_k, params.match_type)
    return metric, score_fn, tune


def tune_scorer(metric: str, tune_questions: pa.Table, passage_text: Mapping[str, str], gold: pa.Table,
                k: int, match_type: str = "string") -> tuple[str, Callable[[pa.Table], float]]:
    """The score the weights maximise on the tuning split, as (name, run -> float).

    'accuracy': share of questions with an answer-bearing passage in the top k (DPR's measure);
    'ndcg': mean graded nDCG@k over the split's judged questions (BEIR data has no answer strings);
    'auto': accuracy when the questions carry answers, else nDCG."""
    from tasks.evaluation.ir_metrics import ir_metrics
    from tasks.evaluation.qa_metrics import carries_answers, first_hit_ranks

    if metric == "auto":
        metric = "accuracy" if carries_answers(tune_questions) else "ndcg"
    if metric == "accuracy":
        def accuracy(run: pa.Table) -> float:
            ranks = first_hit_ranks(run, passage_text, tune_questions, match_type, k).column("first_hit_rank")
            return sum(1 for r in ranks.to_pylist() if r is not None and r <= k) / max(len(ranks), 1)
        return f"accuracy@{k}", accuracy
    if metric != "ndcg":
        raise ValueError(f"unknown tuning metric {metric!r}: accuracy, ndcg or auto")
    judged = gold.filter(pc.is_in(gold.column("qid"), value_set=tune_questions.column("qid")))
    if judged.num_rows == 0:
        raise ValueError("no gold judgements for the tuning questions to choose the weights by nDCG")

    def ndcg(run: pa.Table) -> float:
        rows = ir_metrics(run, judged, p_at=(), recall_at=(), ndcg_at=(k,), mrr_at=()).to_pylist()
        return next((r["value"] for r in rows if r["split"] == "all"), 0.0)  # a fused run is one system
    return f"ndcg@{k}", ndcg
