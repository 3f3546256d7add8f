"""Evaluation family: the `evaluation:` config section and the evaluate stage, which scores every
system that produces runs on the same questions (answer-match accuracy, qrels metrics) and writes
the per-question results, the metrics table and a report."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from storage import Artifact
from storage.parquet import write_table
from tasks.engine import Stage, StageParams


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ks: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [1, 5, 10, 20, 100], min_length=1,
                                                  description="cut-offs k >= 1 of the top-k metrics")
    match_type: Literal["string", "regex"] = "string"
    # Paired bootstrap over the questions (issue 24): each pair's top-k differences with intervals.
    compare: list[tuple[str, str]] = Field(default_factory=list, description=(
        "pairs of systems [A, B] whose top-k differences get paired bootstrap intervals in the report"))
    compare_split: str = Field("test", description="the questions the comparisons resample")
    compare_ks: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [1, 20], min_length=1)
    bootstrap_samples: int = Field(10_000, ge=100, description="bootstrap resamples per comparison")
    bootstrap_seed: int = 0
    ignore_identical_ids: Optional[bool] = Field(
        None, description="drop a retrieved passage of the query's own document (BEIR's rule for corpora whose "
                          "queries are documents); empty: on for BEIR input, off otherwise")


class EvaluateParams(StageParams):
    title: str
    ks: list[int]
    match_type: str
    ignore_identical_ids: bool
    runs: list[str]  # input stages whose runs are scored
    compare: list[tuple[str, str]] = []
    compare_split: str = "test"
    compare_ks: list[int] = [1, 20]
    bootstrap_samples: int = 10_000
    bootstrap_seed: int = 0


def build_evaluation(params: EvaluateParams, inputs: dict[str, Artifact], out: Path) -> dict:
    from tasks.evaluation.evaluate import evaluate_runs

    results, metrics, report = evaluate_runs(
        inputs["ingest_questions"].read_table("questions"), inputs["chunk"].read_table(columns=["pid", "doc_id", "text"]),
        inputs["link_gold"].read_table(), [inputs[name].read_table() for name in params.runs],
        title=params.title, ks=params.ks, match_type=params.match_type, ignore_identical_ids=params.ignore_identical_ids,
        gold_stats=inputs["link_gold"].manifest.get("stats", {}))
    if "synthetic_queries" in inputs:
        report += synthetic_queries_section(inputs["synthetic_queries"].manifest.get("stats", {}))
    if "cross_encoder" in inputs:
        report += cross_encoder_section(inputs["cross_encoder"].manifest.get("stats", {}))
    if "pairs:silver" in inputs:
        report += silver_section(inputs["pairs:silver"].manifest.get("stats", {}))
    comparisons = _comparisons(params, results)
    if comparisons.num_rows:
        from tasks.evaluation.bootstrap import comparisons_markdown

        report += (f"\n## Paired comparisons\n\nTop-k accuracy of A minus B over the {params.compare_split} questions, "
                   f"with the {params.bootstrap_samples:,}-resample paired bootstrap interval; \"A better?\" is yes "
                   f"when the whole interval is above 0.\n\n{comparisons_markdown(comparisons.to_pylist())}\n")
    write_table(out, comparisons, name="comparisons")
    write_table(out, results, name="question_results")
    write_table(out, metrics, name="metrics")
    (out / "report.md").write_text(report, encoding="utf-8")
    return {"stats": {"systems": sorted(set(metrics.column("system").to_pylist()))}}


def _comparisons(params: EvaluateParams, results):
    import pyarrow as pa

    from tasks.evaluation.bootstrap import compare_systems
    from tasks.schemas import COMPARISONS

    rows = [row for a, b in params.compare
            for row in compare_systems(results, a, b, params.compare_split, params.compare_ks,
                                       params.bootstrap_samples, params.bootstrap_seed)]
    return pa.Table.from_pylist(rows, schema=COMPARISONS) if rows else COMPARISONS.empty_table()


def synthetic_queries_section(stats: dict) -> str:
    q = stats.get("quality", {})

    def fmt(value, digits=1):
        return "-" if value is None else f"{value:.{digits}f}"

    lines = ["", "## Synthetic queries", "",
             f"{stats.get('queries', 0):,} queries for {stats.get('passages', 0):,} passages. Against the gold questions of "
             f"the {q.get('reference_split')} split on the same passages ({q.get('scored_queries', 0):,} queries): "
             f"BLEU-4 {fmt(q.get('bleu4'))}, ROUGE-L {fmt(q.get('rougeL'))}. BM25 ranks the query's own passage first "
             f"for {fmt(100 * q.get('bm25_own_passage_first', 0))}%; duplicates {fmt(100 * q.get('duplicate_share', 0))}%.",
             "", "| passage | title | query |", "|---|---|---|"]
    lines += [f"| {e['pid']} | {e['title']} | {e['query']} |" for e in q.get("examples", [])]
    return "\n".join(lines) + "\n"


def cross_encoder_section(stats: dict) -> str:
    """Paper 001 table 2's shape: the classifier against the majority baseline and the dual encoder."""
    def cell(value):
        return "-" if value is None else f"{100 * value:.1f}"

    lines = ["", "## Cross-attention classifier", "",
             f"Trained on {stats.get('training_pairs', 0):,} pairs {stats.get('sources', {})}, best of "
             f"{stats.get('steps', 0)} steps by dev {stats.get('selected_by', 'log_loss')} (dev AUC "
             f"{100 * (stats.get('dev_auc') or 0):.1f}, log-loss {stats.get('dev_log_loss') or 0:.4f}); scored on "
             f"{stats.get('report_pairs', 0):,} pairs of the {stats.get('report_split')} split built the same way.", "",
             "| model | accuracy | precision | recall | F1 | AUC |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['model']} | {cell(r['accuracy'])} | {cell(r['precision'])} | {cell(r['recall'])} | "
              f"{cell(r['f1'])} | {cell(r['auc'])} |" for r in stats.get("report", [])]
    return "\n".join(lines) + "\n"


def silver_section(stats: dict) -> str:
    """Silver pairs added relative to gold (paper 001 section 5.3) and the distribution of p."""
    lines = ["", "## Silver pairs", "",
             f"{stats.get('silver', 0):,} of {stats.get('candidates', 0):,} candidates kept (p >= "
             f"{stats.get('threshold')}; {stats.get('retriever')} top {stats.get('top_k')}).", "",
             "| queries | labelled | candidates | silver | gold pairs | added vs gold |", "|---|---:|---:|---:|---:|---:|"]
    for source, s in stats.get("by_source", {}).items():
        added = s.get("added_vs_gold")
        lines.append(f"| {source} | {s['queries']:,} | {s['candidates']:,} | {s['silver']:,} | {s['gold_pairs']:,} | "
                     f"{'-' if added is None else f'+{100 * added:.1f}%'} |")
    by_source = stats.get("by_source", {})
    bins = next(iter(by_source.values()), {}).get("p_histogram", [])
    lines += ["", "| p | " + " | ".join(f"{b['from']:.1f}-{b['to']:.1f}" for b in bins) + " |",
              "|---|" + "---:|" * len(bins)]
    for source, s in by_source.items():
        lines.append(f"| {source} | " + " | ".join(f"{b['pairs']:,}" for b in s.get("p_histogram", [])) + " |")
    return "\n".join(lines) + "\n"


def stages(cfg, earlier: list[Stage]) -> list[Stage]:
    runs = [s.name for s in earlier if s.produces_runs]
    reports = [s.name for s in earlier if s.name in ("synthetic_queries", "cross_encoder", "pairs:silver")]
    e = cfg.evaluation
    ignore = e.ignore_identical_ids if e.ignore_identical_ids is not None else cfg.data.beir is not None
    params = EvaluateParams(title=cfg.name, ks=e.ks, match_type=e.match_type, ignore_identical_ids=ignore, runs=runs,
                            compare=e.compare, compare_split=e.compare_split, compare_ks=e.compare_ks,
                            bootstrap_samples=e.bootstrap_samples, bootstrap_seed=e.bootstrap_seed)
    return [Stage("evaluate", "evaluation", "3", ("ingest_questions", "chunk", "link_gold", *runs, *reports), params,
                  build_evaluation)]
