"""The study's figures from its committed records alone (no artifact root), as SVG: the Results
page draws them at each site build (docs/hooks.py), so they follow every record that lands.

- `topk.svg`: top-k accuracy at every k up to CURVE_K on the test split, one curve per main
  retrieval row (`curve_rows`: every measured row scored by answer match, a system's later seeds
  left out, since its first seed stands for it: BM25, zero-shot, each trained system's `-s1`, the
  hybrids, the reranked rows and the ensembles; rows judged by qrels keep no ranks, so no curve).
- `comparisons.svg`: the reproduction table's paired comparisons as a forest plot, one row per
  claim "A beats B" whose two rows are measured: A minus B at the claim's k with the paired
  bootstrap interval the table shows (flows.study.tables.compare, the same resamples and seed).
- `classifier-dev-auc.svg`: the classifier's dev AUC at each evaluation of its training, the
  checkpoint kept starred, when its record keeps the curve (`details.dev_curve`: [[step, auc], ...]).

A figure without data is not drawn; `MISSING` says why, for the page to say instead.
"""
from __future__ import annotations

import inspect
import re
import tempfile
from pathlib import Path

from flows.study.definition import Study
from flows.study.records import RANK
from flows.study.tables import SPLIT, Results, compare, study_tables

TOPK, COMPARISONS, CLASSIFIER = "topk.svg", "comparisons.svg", "classifier-dev-auc.svg"
FIGURES = (TOPK, COMPARISONS, CLASSIFIER)
MISSING = {
    TOPK: "No retrieval row of the study is measured yet, so no top-k curve is drawn.",
    COMPARISONS: "No claim of the reproduction table has both its rows measured yet, so no comparison is drawn.",
    CLASSIFIER: ("The classifier's record keeps no dev curve (a record takes it from the classifier's training "
                 "history), so no figure of its training is drawn."),
}
# The reproduction table's resamples (study_tables' default), so the plot's intervals are the table's.
SAMPLES = inspect.signature(study_tables).parameters["samples"].default
_LATER_SEED = re.compile(r"-s([2-9]|\d{2,})$")


# -- data ------------------------------------------------------------------------------------------

def curve_rows(results: Results) -> list[str]:
    """The rows drawn as top-k curves, in the study's order: measured on the test split by
    answer match (first-hit ranks), a later seed (`NAME-s2`, ...) left out."""
    return [row.name for row in results.study.ordered()
            if results.test(row.name) and results.measure(row.name) == RANK and not _LATER_SEED.search(row.name)]


def topk_curves(results: Results, rows: list[str] | None = None) -> dict[str, list[float]]:
    """row -> [top-k accuracy at k = 1..CURVE_K] (shares) on the test split, from the ranks its
    record keeps (the evaluation report's curve function, on the same first-hit ranks)."""
    import pyarrow as pa

    from tasks.evaluation.figures import topk_accuracy_curves

    names = curve_rows(results) if rows is None else rows
    ranks = [(name, rank) for name in names for rank in results.test(name).values()]
    table = pa.table({"system": [n for n, _ in ranks], "split": [SPLIT] * len(ranks),
                      "first_hit_rank": pa.array([r for _, r in ranks], type=pa.int64())})
    return topk_accuracy_curves(table, split=SPLIT)


def comparison_rows(results: Results, samples: int = SAMPLES) -> list[dict]:
    """One row per claim "A beats B" whose two rows are measured, in the study's order: the
    reproduction table's comparison (A minus B on the test split, its paired bootstrap
    interval), in the form the forest plot draws."""
    rows = []
    for claim in results.study.claims:
        if claim.row is not None or results.test(claim.a) is None or results.test(claim.b) is None:
            continue
        metric = "top_k_accuracy" if results.measure(claim.a) == RANK else "ndcg_cut"   # the table's nDCG@10
        rows.append({"system_a": claim.a, "system_b": claim.b, "split": SPLIT, "metric": metric, "k": claim.k,
                     "claim": claim.claim, "paper": claim.paper,
                     **compare(results, claim.a, claim.b, claim.k, samples)})
    return rows


def classifier_curve(record: dict | None) -> list[tuple[int, float]]:
    """[(step, dev AUC)] a classifier record keeps (`details.dev_curve`); [] without one. Entries
    are [step, auc] pairs, or {step, auc, ...} as the classifier's manifest lists its evaluations."""
    curve = ((record or {}).get("details") or {}).get("dev_curve") or []
    out = []
    for entry in curve:
        step, auc = (entry.get("step"), entry.get("auc")) if isinstance(entry, dict) else entry
        if auc is not None:
            out.append((int(step), float(auc)))
    return out


def classifier_record(results: Results) -> dict | None:
    """The record of the study's first classifier row that keeps a dev curve (None: none does)."""
    for row in results.study.ordered():
        record = results.records.get(row.name)
        if row.kind == "classifier" and classifier_curve(record):
            return record
    return None


# -- drawing ---------------------------------------------------------------------------------------

def draw_figures(study: Study, folder: Path, records: dict[str, dict] | None = None,
                 samples: int = SAMPLES) -> dict[str, Path]:
    """Each figure the records give, drawn into `folder` as SVG: name -> path (absent: not drawn)."""
    from tasks.evaluation.figures import draw_dev, new_figure, plot_comparisons, plot_curves, save_figure

    results = Results(study, records)
    folder = Path(folder)
    out = {}
    curves = topk_curves(results)
    if curves:
        out[TOPK] = plot_curves(curves, folder / TOPK, ylabel="top-k accuracy",
                                title=f"Study {study.name}: top-k accuracy on the {SPLIT} questions")
    comparisons = comparison_rows(results, samples)
    if comparisons:
        out[COMPARISONS] = plot_comparisons(comparisons, folder / COMPARISONS)
    record = classifier_record(results)
    if record is not None:
        curve = classifier_curve(record)
        fig, ax = new_figure(6.5, 3.6)
        draw_dev(ax, [s for s, _ in curve], [v for _, v in curve], (record.get("details") or {}).get("best_step"),
                 "dev AUC")
        ax.set_title(f"{record['row']}: dev AUC over its training")
        out[CLASSIFIER] = save_figure(fig, folder / CLASSIFIER)
    return out


def study_figures(study: Study, records: dict[str, dict] | None = None, samples: int = SAMPLES) -> dict[str, bytes]:
    """name -> SVG bytes of each figure the records give (the same records, the same bytes)."""
    with tempfile.TemporaryDirectory(prefix="study-figures-") as tmp:
        return {name: path.read_bytes() for name, path in draw_figures(study, Path(tmp), records, samples).items()}
