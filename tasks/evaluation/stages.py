"""Evaluation family: the `evaluation:` config section and the evaluate stage, which scores every
system that produces runs on the same questions (answer-match accuracy, qrels metrics) and writes
the per-question results, the metrics table and a report. The report's figures (figures/*.png,
linked from report.md): every system's top-k accuracy (or, qrels only, Recall@k) at k = 1..100,
the paired comparisons as a forest plot, and the loss and dev-metric curves of every trained model
it reads (train:NAME, pretrain:NAME, cross_encoder: their training/history.json)."""
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
    compare_metric: Literal["auto", "top_k_accuracy", "ndcg_cut", "recall", "mrr", "P"] = Field(
        "auto", description="what the comparisons resample per question: 'auto' is top-k answer accuracy when the "
                            "questions carry answers, else nDCG@k on the qrels (BEIR's measure)")
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
    compare_metric: str = "auto"
    bootstrap_samples: int = 10_000
    bootstrap_seed: int = 0


def build_evaluation(params: EvaluateParams, inputs: dict[str, Artifact], out: Path) -> dict:
    from tasks.evaluation.evaluate import evaluate_runs

    questions, gold = inputs["ingest_questions"].read_table("questions"), inputs["link_gold"].read_table()
    passages = inputs["chunk"].read_table(columns=["pid", "doc_id", "text"])
    runs = [inputs[name].read_table() for name in params.runs]
    results, metrics, report = evaluate_runs(
        questions, passages, gold, runs,
        title=params.title, ks=params.ks, match_type=params.match_type, ignore_identical_ids=params.ignore_identical_ids,
        gold_stats=inputs["link_gold"].manifest.get("stats", {}))
    report += curve_section(params, questions, passages, gold, runs, results, out)
    if "synthetic_queries" in inputs:
        report += synthetic_queries_section(inputs["synthetic_queries"].manifest.get("stats", {}))
    if "cross_encoder" in inputs:
        report += cross_encoder_section(inputs["cross_encoder"].manifest.get("stats", {}))
    if "pairs:silver" in inputs:
        report += silver_section(inputs["pairs:silver"].manifest.get("stats", {}))
    report += _queries_and_teacher(inputs)
    comparisons = _comparisons(params, results, questions, passages, gold, runs)
    if comparisons.num_rows:
        from tasks.evaluation.bootstrap import comparisons_markdown

        measured = "Top-k accuracy" if comparisons.column("metric")[0].as_py() == "top_k_accuracy" else "The metric"
        report += (f"\n## Paired comparisons\n\n{measured} of A minus B over the {params.compare_split} questions, "
                   f"with the {params.bootstrap_samples:,}-resample paired bootstrap interval; \"A better?\" is yes "
                   f"when the whole interval is above 0.\n\n{comparisons_markdown(comparisons.to_pylist())}\n")
        report += comparisons_chart(comparisons.to_pylist(), out)
    report += training_section(inputs, out)
    write_table(out, comparisons, name="comparisons")
    write_table(out, results, name="question_results")
    write_table(out, metrics, name="metrics")
    (out / "report.md").write_text(report, encoding="utf-8")
    return {"stats": {"systems": sorted(set(metrics.column("system").to_pylist()))}}


def _comparisons(params: EvaluateParams, results, questions, passages, gold, runs):
    """The paired bootstrap rows of every configured [A, B]: on first-hit ranks (top-k answer
    accuracy), or on per-query qrels metrics (nDCG@k by default where questions carry no answers)."""
    import pyarrow as pa

    from tasks.evaluation.bootstrap import compare_systems, compare_systems_on_qrels, runs_by_system
    from tasks.schemas import COMPARISONS

    metric = params.compare_metric
    if metric == "auto":
        metric = "top_k_accuracy" if results.num_rows else "ndcg_cut"
    rows = []
    if params.compare and metric == "top_k_accuracy":
        rows = [row for a, b in params.compare
                for row in compare_systems(results, a, b, params.compare_split, params.compare_ks,
                                           params.bootstrap_samples, params.bootstrap_seed)]
    elif params.compare:
        by_system = runs_by_system(runs, passages if params.ignore_identical_ids else None)
        split_of = dict(zip(questions.column("qid").to_pylist(), questions.column("split").to_pylist()))
        rows = [row for a, b in params.compare
                for row in compare_systems_on_qrels(by_system, gold, split_of, a, b, params.compare_split, metric,
                                                    params.compare_ks, params.bootstrap_samples, params.bootstrap_seed)]
    return pa.Table.from_pylist(rows, schema=COMPARISONS) if rows else COMPARISONS.empty_table()


FIGURES = "figures"  # the report's PNGs, beside report.md in the artifact; linked relatively
TRAINED = ("train:", "pretrain:")  # stages whose record (training/history.json) the report draws; and cross_encoder


def curve_split(params: EvaluateParams, questions) -> str:
    """The questions the top-k curve is drawn over: those the comparisons resample when that split
    exists, else all."""
    return params.compare_split if params.compare_split in set(questions.column("split").to_pylist()) else "all"


def curve_section(params: EvaluateParams, questions, passages, gold, runs, results, out: Path) -> str:
    """Top-k accuracy of every system at k = 1..100 (answer-match evaluations) or, for qrels-only
    ones (BEIR), Recall@k; one PNG and its report section."""
    from tasks.evaluation import figures

    split = curve_split(params, questions)
    which = "all the" if split == "all" else f"the {split}"
    if results.num_rows:
        curves = figures.topk_accuracy_curves(results, split)
        ylabel, what = "top-k accuracy", f"Share of {which} questions with an answer in the top k passages"
    else:
        if params.ignore_identical_ids:
            from tasks.evaluation.identical_ids import drop_identical_ids

            doc_of = dict(zip(passages.column("pid").to_pylist(), passages.column("doc_id").to_pylist()))
            runs = [drop_identical_ids(run, doc_of) for run in runs]
        curves = figures.recall_curves(runs, questions, gold, split)
        ylabel, what = "Recall@k", f"Recall@k over {'all the judged' if split == 'all' else f'the judged {split}'} queries"
    if not curves:
        return ""
    name = "top_k_accuracy.png" if results.num_rows else "recall_at_k.png"
    figures.plot_curves(curves, out / FIGURES / name, ylabel=ylabel,
                        title=f"{ylabel}, {which} {'questions' if results.num_rows else 'queries'}, k = 1..{figures.CURVE_K}")
    return (f"\n## {ylabel[0].upper() + ylabel[1:]} curve\n\n{what}, k = 1..{figures.CURVE_K}, every system "
            f"(log k axis).\n\n![{ylabel} at k = 1..{figures.CURVE_K}]({FIGURES}/{name})\n")


def comparisons_chart(rows: list[dict], out: Path) -> str:
    from tasks.evaluation.figures import plot_comparisons

    if not rows:
        return ""
    plot_comparisons(rows, out / FIGURES / "comparisons.png")
    return f"\n![paired comparisons: A - B with its interval]({FIGURES}/comparisons.png)\n"


def training_section(inputs: dict[str, Artifact], out: Path) -> str:
    """Loss and dev-metric curves of every trained model the evaluation read (train:NAME,
    pretrain:NAME, cross_encoder), from the history.json its artifact keeps."""
    from tasks.evaluation import figures

    parts = []
    for name, artifact in inputs.items():
        if not (name.startswith(TRAINED) or name == "cross_encoder"):
            continue
        record = figures.read_history(artifact.path / "training" / "history.json")
        series = figures.training_series(record) if record else None
        if not series or not series["steps"]:
            continue
        png = figures.figure_name(name)
        figures.plot_training(series, out / FIGURES / png, title=f"{name}: training")
        line = f"{len(series['steps']):,} steps, final loss {series['loss'][-1]:.4f}"
        if series["dev"]:
            best = series["best_step"]
            kept = series["dev"][series["dev_steps"].index(best)] if best in series["dev_steps"] else None
            line += (f"; {figures.metric_label(series['dev_metric'])} at {len(series['dev'])} evaluations"
                     + (f", kept step {best} ({kept:.4f})" if kept is not None else ""))
        what = "loss and dev metric" if series["dev"] else "loss"
        parts.append(f"### {name}\n\n{line}.\n\n![{name}: {what}]({FIGURES}/{png})\n")
    return "\n## Training curves\n\n" + "\n".join(parts) if parts else ""


def _queries_and_teacher(inputs: dict[str, Artifact]) -> str:
    """Issue 25's account: the teacher's origin, the round trip, the teacher's scores per distilled student."""
    from tasks.evaluation.adaptation_report import adaptation_section

    def stats(name):
        return inputs[name].manifest.get("stats", {}) if name in inputs else {}
    students = {name.split(":", 1)[1]: stats(name)["teacher"] for name in inputs
                if name.startswith("train:") and stats(name).get("teacher")}
    return adaptation_section(stats("cross_encoder"), stats("pairs:synthetic"), students)


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
    """Paper 001 table 2's shape: the classifier against the majority baseline and the dual encoder
    (nothing for a classifier imported from another run: "Generated queries and the teacher" names it)."""
    if stats.get("imported_from"):
        return ""

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
    reports = [s.name for s in earlier if s.name in ("synthetic_queries", "pairs:synthetic", "cross_encoder", "pairs:silver")]
    trained = [s.name for s in earlier if s.name.startswith(TRAINED)]  # their training curves
    e = cfg.evaluation
    ignore = e.ignore_identical_ids if e.ignore_identical_ids is not None else cfg.data.beir is not None
    params = EvaluateParams(title=cfg.name, ks=e.ks, match_type=e.match_type, ignore_identical_ids=ignore, runs=runs,
                            compare=e.compare, compare_split=e.compare_split, compare_ks=e.compare_ks,
                            compare_metric=e.compare_metric,
                            bootstrap_samples=e.bootstrap_samples, bootstrap_seed=e.bootstrap_seed)
    return [Stage("evaluate", "evaluation", "4", ("ingest_questions", "chunk", "link_gold", *runs, *reports, *trained),
                  params, build_evaluation)]
