"""The evaluation stage's logic: answer-match and qrels metrics for every system, and a report."""
from __future__ import annotations

import json
from typing import Sequence

import pyarrow as pa

from tasks.evaluation.ir_metrics import ir_metrics
from tasks.evaluation.qa_metrics import carries_answers, first_hit_ranks, qa_accuracy_metrics
from tasks.evaluation.report import metrics_markdown
from tasks.evaluation.scope import CURVE_K, questions_of_run
from tasks.schemas import METRICS, QUESTION_RESULTS


def evaluate_runs(questions: pa.Table, passages: pa.Table, gold: pa.Table, runs: list[pa.Table], *,
                  title: str, ks: Sequence[int] = (1, 5, 10, 20, 100), match_type: str = "string",
                  ignore_identical_ids: bool = False, gold_stats: dict | None = None) -> tuple[pa.Table, pa.Table, str]:
    """Top-k answer accuracy (when questions carry answers) and qrels metrics (when gold exists).
    With `ignore_identical_ids`, a retrieved passage of the query's own document is dropped first
    (BEIR's `ignore_identical_ids`: for corpora whose queries are documents too). First hits are
    looked for down to rank max(ks) or CURVE_K (100), the deeper: the report's top-k curve and
    comparisons at any k up to there read them from the per-question results."""
    has_answers = carries_answers(questions)
    split_of = dict(zip(questions.column("qid").to_pylist(), questions.column("split").to_pylist()))
    passage_text = dict(zip(passages.column("pid").to_pylist(), passages.column("text").to_pylist()))
    if ignore_identical_ids:
        from tasks.evaluation.identical_ids import drop_identical_ids

        doc_of = dict(zip(passages.column("pid").to_pylist(), passages.column("doc_id").to_pylist()))
        runs = [drop_identical_ids(run, doc_of) for run in runs]
    results, metrics = [], []
    for run in runs:
        run_questions, run_gold = questions_of_run(run, questions, gold, split_of)
        if has_answers:
            per_question = first_hit_ranks(run, passage_text, run_questions, match_type, max(*ks, CURVE_K))
            results.append(per_question)
            metrics.append(qa_accuracy_metrics(per_question, tuple(ks)))
        if run_gold.num_rows:
            # With answers, MRR comes from answer matches (DPR/ReQA style); otherwise from the qrels.
            metrics.append(ir_metrics(run, run_gold, split_of, mrr_at=() if has_answers else (10,)))
    results_table = pa.concat_tables(results) if results else QUESTION_RESULTS.empty_table()
    metrics_table = pa.concat_tables([m.cast(METRICS) for m in metrics]) if metrics else METRICS.empty_table()
    return results_table, metrics_table, _report(title, metrics_table, gold_stats or {})


def _report(title: str, metrics: pa.Table, gold_stats: dict) -> str:
    splits = sorted(set(metrics.column("split").to_pylist()), key=lambda s: (s != "all", s))
    lines = [f"# Evaluation: {title}", ""]
    for split in splits:
        lines += [f"## Split: {split}", "", metrics_markdown(metrics, split=split), ""]
    if gold_stats:
        lines += ["## Gold linking", "", "```json", json.dumps(gold_stats, indent=2, sort_keys=True), "```", ""]
    return "\n".join(lines)
