"""Markdown reports of METRICS tables.

:func:`metrics_markdown` lays out one table: systems as rows, ``metric@k`` as columns.
Formatting is fixed so reports compare at a glance:

* fractions (top-k accuracy, answer precision, P, recall, nDCG and any other metric) are shown as
  percentages with one decimal (``78.4``); a note under the table says so;
* MRR stays on its 0..1 scale with three decimals (``0.512``), labelled ``MRR@k``;
* ``n_questions`` is an integer count (column ``N``);
* a missing value is an en dash.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import pyarrow as pa

from storage.atomic import atomic_write_text

__all__ = ["metrics_markdown", "write_report", "column_label", "format_value"]

# Column order and labels; metrics not listed follow, sorted by name.
_ORDER = ["top_k_accuracy", "answer_precision", "P", "recall", "ndcg_cut", "mrr", "n_questions"]
_LABELS = {"top_k_accuracy": "Top-{k}", "answer_precision": "P@{k} (ans)", "P": "P@{k}",
           "recall": "R@{k}", "ndcg_cut": "nDCG@{k}", "mrr": "MRR@{k}", "n_questions": "N"}
_MISSING = "\u2013"


def column_label(metric: str, k: int) -> str:
    template = _LABELS.get(metric, metric + "@{k}")
    return template.format(k=k)


def format_value(metric: str, value: float | None) -> str:
    if value is None or value != value:  # None or NaN
        return _MISSING
    if metric == "n_questions":
        return str(int(round(value)))
    if metric == "mrr":
        return f"{value:.3f}"
    return f"{100.0 * value:.1f}"


def _escape(cell: str) -> str:
    return str(cell).replace("|", "\\|")


def metrics_markdown(metrics: pa.Table, systems: Sequence[str] | None = None,
                     split: str | None = None) -> str:
    """Markdown table of ``metrics`` (METRICS schema) for one split.

    ``systems`` gives the rows and their order (default: order of first appearance); a listed
    system without rows shows dashes. ``split`` picks the split; by default ``'all'`` when present,
    else every split, with a Split column.
    """
    names = metrics.column_names
    for col in ("system", "metric", "k", "value", "split"):
        if col not in names:
            raise ValueError(f"metrics table lacks column {col!r}; has {names}")
    records = list(zip(metrics.column("system").to_pylist(), metrics.column("metric").to_pylist(),
                       metrics.column("k").to_pylist(), metrics.column("value").to_pylist(),
                       metrics.column("split").to_pylist()))
    present_splits = list(dict.fromkeys(r[4] for r in records))
    if split is None and "all" in present_splits:
        split = "all"
    if split is not None:
        records = [r for r in records if r[4] == split]
    show_split = split is None and len(present_splits) > 1

    cells: dict[tuple[str, str], dict[tuple[str, int], float]] = {}
    columns: dict[tuple[str, int], None] = {}
    for system, metric, k, value, sp in records:
        row = cells.setdefault((system, sp), {})
        key = (metric, int(k))
        if key in row:
            raise ValueError(f"metrics has two values for system {system!r}, split {sp!r}, "
                             f"{metric}@{k}")
        row[key] = value
        columns[key] = None
    order = {m: i for i, m in enumerate(_ORDER)}
    cols = sorted(columns, key=lambda mk: (order.get(mk[0], len(_ORDER)), mk[0], mk[1]))

    row_systems = list(systems) if systems is not None else \
        list(dict.fromkeys(r[0] for r in records))
    row_keys: list[tuple[str, str | None]] = []
    for system in row_systems:
        splits = [sp for (s, sp) in cells if s == system] or [split]
        row_keys += [(system, sp) for sp in splits]

    header = ["System"] + (["Split"] if show_split else []) + [column_label(*c) for c in cols]
    lines = ["| " + " | ".join(_escape(h) for h in header) + " |",
             "|" + "|".join(["---"] * (1 + show_split) + ["---:"] * len(cols)) + "|"]
    for system, sp in row_keys:
        row = cells.get((system, sp), {})
        values = [format_value(m, row.get((m, k))) for m, k in cols]
        lead = [system] + ([sp if sp is not None else _MISSING] if show_split else [])
        lines.append("| " + " | ".join(_escape(c) for c in lead + values) + " |")
    note = "Values in % except MRR (0..1) and N (question count)."
    if split is not None:
        note = f"Split: {split}. " + note
    return "\n".join(lines) + "\n\n" + note + "\n"


def write_report(path: str | os.PathLike, title: str,
                 sections: Iterable[tuple[str, str]]) -> Path:
    """Write ``# title`` then ``## heading`` + markdown per section; atomic; returns the path."""
    parts = [f"# {title}\n"]
    for heading, body in sections:
        parts.append(f"## {heading}\n\n{body.rstrip()}\n")
    return atomic_write_text(Path(path), "\n".join(parts))
