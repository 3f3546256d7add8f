"""Qrels-based retrieval metrics, computed by pytrec_eval (trec_eval's own C code).

``ir_metrics`` returns ``METRICS`` rows per system and split, plus split ``'all'``:

=========== ===== ====================================================================
metric      k     trec_eval measure
=========== ===== ====================================================================
``P``       N     ``P_N``: relevant passages in the top N, divided by N (always N)
``recall``  k     ``recall_k``: relevant passages in the top k / all relevant passages
``ndcg_cut`` k    ``ndcg_cut_k``: graded gains (the relevance value), 1/log2(rank+1)
                  discount; the ideal ranking is built from all judgements of the query
``mrr``     k     ``recip_rank`` over the run truncated to its top k (MRR@10: a first
                  relevant passage at rank 11 scores 0)
=========== ===== ====================================================================

Conventions (pinned by tests/test_evaluation.py and cross-checked with ir_measures):

* A passage is relevant when its relevance is >= 1 (trec_eval's default ``relevance_level``);
  nDCG uses the graded values as gains, as trec_eval does.
* Ranking order is the run's ``rank`` column: scores handed to trec_eval are ``-rank``, so
  trec_eval's sort by score reproduces the stored ranking exactly (raw scores may tie).
* **Averaging is over every query in the qrels** (trec_eval ``-c``, which ir_measures also
  applies): a query with judgements that a system retrieved nothing for counts 0, and a query whose
  judgements are all non-relevant counts 0 too (drop such rows from the qrels to exclude it). Run
  queries absent from the qrels are ignored. This differs from plain ``trec_eval`` (``-c`` off)
  and BEIR's ``EvaluateRetrieval.evaluate``, which average only over queries present in the run,
  so a system that returns nothing for hard queries is not rewarded here.
* Splits come from ``split_of`` (qid -> split); qrels queries it does not map appear only in
  ``'all'``. Without ``split_of`` only ``'all'`` rows are produced.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa
import pytrec_eval

from .qa_metrics import ALL_SPLITS, _metrics_table, _require

__all__ = ["ir_metrics", "qrels_dict", "run_dicts"]


def qrels_dict(qrels: pa.Table) -> dict[str, dict[str, int]]:
    """{qid: {pid: relevance}} from a (qid, pid, relevance) table; ``doc_id`` is accepted for pid."""
    pid_col = "pid" if "pid" in qrels.column_names else "doc_id"
    _require(qrels, ("qid", pid_col, "relevance"), "qrels")
    out: dict[str, dict[str, int]] = {}
    for qid, pid, rel in zip(qrels.column("qid").to_pylist(), qrels.column(pid_col).to_pylist(),
                             qrels.column("relevance").to_pylist()):
        judged = out.setdefault(str(qid), {})
        rel = int(rel)
        if pid in judged and judged[pid] != rel:
            raise ValueError(f"qrels judge qid {qid!r}, pid {pid!r} twice, with different "
                             f"relevance ({judged[pid]} and {rel})")
        judged[str(pid)] = rel
    return out


def run_dicts(runs: pa.Table) -> dict[str, dict[str, dict[str, float]]]:
    """{system: {qid: {pid: -rank}}}; a pid retrieved twice for a query keeps its best rank."""
    _require(runs, ("qid", "pid", "rank", "system"), "runs")
    out: dict[str, dict[str, dict[str, float]]] = {}
    for system, qid, pid, rank in zip(runs.column("system").to_pylist(),
                                      runs.column("qid").to_pylist(),
                                      runs.column("pid").to_pylist(),
                                      runs.column("rank").to_pylist()):
        ranked = out.setdefault(system, {}).setdefault(str(qid), {})
        pid, score = str(pid), -float(rank)
        if ranked.get(pid, float("-inf")) < score:
            ranked[pid] = score
    return out


def _truncate(run: dict[str, dict[str, float]], k: int) -> dict[str, dict[str, float]]:
    return {qid: dict(sorted(ranked.items(), key=lambda kv: -kv[1])[:k])
            for qid, ranked in run.items()}


def _evaluate(qrels: dict, run: dict, measures: set[str]) -> dict[str, dict[str, float]]:
    run = {qid: ranked for qid, ranked in run.items() if qid in qrels and ranked}
    if not run:
        return {}
    return pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)


def ir_metrics(runs: pa.Table, qrels: pa.Table, split_of: Mapping[str, str] | None = None,
               p_at: Sequence[int] = (1, 5, 10), recall_at: Sequence[int] = (20, 100),
               ndcg_at: Sequence[int] = (10,), mrr_at: Sequence[int] = (10,)) -> pa.Table:
    """P@N, Recall@k, nDCG@k and MRR@k per system and split (plus 'all'), as METRICS rows."""
    judged = qrels_dict(qrels)
    systems = run_dicts(runs)
    qids = list(judged)
    split_names = sorted({split_of[q] for q in qids if q in split_of} - {ALL_SPLITS}) \
        if split_of else []

    # (metric name in METRICS, k, trec_eval result key)
    wanted: list[tuple[str, int, str]] = []
    measures: set[str] = set()
    if p_at:
        measures.add("P." + ",".join(str(int(k)) for k in p_at))
        wanted += [("P", int(k), f"P_{int(k)}") for k in p_at]
    if recall_at:
        measures.add("recall." + ",".join(str(int(k)) for k in recall_at))
        wanted += [("recall", int(k), f"recall_{int(k)}") for k in recall_at]
    if ndcg_at:
        measures.add("ndcg_cut." + ",".join(str(int(k)) for k in ndcg_at))
        wanted += [("ndcg_cut", int(k), f"ndcg_cut_{int(k)}") for k in ndcg_at]

    rows = []
    for system, run in systems.items():
        # per-query values: {(metric, k): {qid: value}}
        per_query: dict[tuple[str, int], dict[str, float]] = {}
        if measures:
            scored = _evaluate(judged, run, measures)
            for metric, k, key in wanted:
                per_query[(metric, k)] = {q: v[key] for q, v in scored.items()}
        for k in mrr_at:
            scored = _evaluate(judged, _truncate(run, int(k)), {"recip_rank"})
            per_query[("mrr", int(k))] = {q: v["recip_rank"] for q, v in scored.items()}

        groups = [(s, [q for q in qids if split_of.get(q) == s]) for s in split_names]
        groups.append((ALL_SPLITS, qids))
        for split, members in groups:
            if not members:
                continue
            for (metric, k), values in per_query.items():
                mean = sum(values.get(q, 0.0) for q in members) / len(members)
                rows.append((system, metric, k, mean, split))
    return _metrics_table(rows)


#: trec_eval measure and result key of the metrics a paired comparison can resample.
PER_QUERY_MEASURES = {"ndcg_cut": ("ndcg_cut.{k}", "ndcg_cut_{k}"), "recall": ("recall.{k}", "recall_{k}"),
                      "P": ("P.{k}", "P_{k}"), "mrr": ("recip_rank", "recip_rank")}


def per_query_values(runs: pa.Table, qrels: pa.Table, qids: Sequence[str], metric: str, k: int) -> list[float]:
    """`metric`@k of one system's run for each of `qids`, in order, computed as `ir_metrics`
    averages it (a judged query the run misses scores 0): what a paired bootstrap resamples."""
    if metric not in PER_QUERY_MEASURES:
        raise ValueError(f"per-query {metric!r} is not supported; choose one of {sorted(PER_QUERY_MEASURES)}")
    systems = run_dicts(runs)
    if len(systems) != 1:
        raise ValueError(f"per-query values take one system's run, got {sorted(systems)}")
    run = next(iter(systems.values()))
    measure, key = (part.format(k=int(k)) for part in PER_QUERY_MEASURES[metric])
    if metric == "mrr":
        run = _truncate(run, int(k))
    scored = _evaluate(qrels_dict(qrels), run, {measure})
    return [float(scored.get(str(q), {}).get(key, 0.0)) for q in qids]
