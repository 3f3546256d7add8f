"""The evaluation report's figures (issue 26): the top-k curve of every system, the training curves
of every trained model and the paired comparisons as a forest plot, each a PNG.

Data and drawing are apart: the `*_curves` and `training_series` functions turn the evaluation's
tables and a trainer's history.json into plain numbers (tested against the metrics table and the
history), the `plot_*` functions only draw them. Drawing uses matplotlib's object API on its Agg
canvas (no pyplot: no global state, safe in the threads Prefect runs tasks in); the trainer's
loss_curve.png is drawn with the same helpers (`new_figure`, `draw_loss`, `save_figure`).
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

import numpy as np
import pyarrow as pa

from tasks.evaluation.scope import CURVE_K, questions_of_run

__all__ = ["CURVE_K", "topk_accuracy_curves", "recall_curves", "training_series", "new_figure", "save_figure",
           "draw_loss", "draw_dev", "plot_curves", "plot_training", "plot_comparisons", "figure_name", "metric_label",
           "read_history"]

_TICKS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
SVG_SALT = "passage-forge"   # matplotlib's svg.hashsalt: stable element ids
_STYLES = ("-", "--", ":", "-.")


# -- data ------------------------------------------------------------------------------------------

def topk_accuracy_curves(results: pa.Table, split: str = "all", max_k: int = CURVE_K) -> dict[str, list[float]]:
    """system -> [top-k accuracy at k = 1..max_k] over its questions of `split` ('all': every
    question it was scored on), from the evaluation's question_results: the share of questions
    whose first answer-bearing rank is <= k. The same numbers as qa_accuracy_metrics' top_k_accuracy
    at each k (exact up to the depth the first hits were looked for). Systems in order of first
    appearance; a system without questions of `split` has no curve."""
    ranks_of: dict[str, list] = {}
    for system, sp, rank in zip(results.column("system").to_pylist(), results.column("split").to_pylist(),
                                results.column("first_hit_rank").to_pylist()):
        if split == "all" or sp == split:
            ranks_of.setdefault(system, []).append(rank)
    curves = {}
    for system, ranks in ranks_of.items():
        counts = np.zeros(max_k + 1)
        for rank in ranks:
            if rank is not None and 1 <= rank <= max_k:
                counts[rank] += 1
        curves[system] = (np.cumsum(counts)[1:] / len(ranks)).tolist()
    return curves


def recall_curves(runs: Sequence[pa.Table], questions: pa.Table, gold: pa.Table, split: str = "all",
                  max_k: int = CURVE_K) -> dict[str, list[float]]:
    """system -> [Recall@k at k = 1..max_k] for qrels-only evaluations (BEIR: no answer strings),
    averaged as ir_metrics averages: over every judged query of `split` among the splits the run
    covers, a query the system retrieved nothing for (or without a relevant judgement) counting 0;
    relevant means relevance >= 1; the order is the run's rank, a passage retrieved twice keeping
    its best rank. The same numbers as ir_metrics' recall at each k."""
    from tasks.evaluation.ir_metrics import qrels_dict, run_dicts

    split_of = dict(zip(questions.column("qid").to_pylist(), questions.column("split").to_pylist()))
    curves: dict[str, list[float]] = {}
    for run in runs:
        _, run_gold = questions_of_run(run, questions, gold, split_of)
        judged = qrels_dict(run_gold)
        members = [q for q in judged if split == "all" or split_of.get(q) == split]
        if not members:
            continue
        for system, ranked_of in run_dicts(run).items():
            total = np.zeros(max_k)
            for qid in members:
                relevant = {pid for pid, rel in judged[qid].items() if rel >= 1}
                ranked = ranked_of.get(qid)
                if not relevant or not ranked:
                    continue
                top = sorted(ranked.items(), key=lambda kv: -kv[1])[:max_k]
                hits = np.zeros(max_k)
                hits[:len(top)] = [pid in relevant for pid, _ in top]
                total += np.cumsum(hits) / len(relevant)
            curves[system] = (total / len(members)).tolist()
    return curves


def training_series(record: Mapping) -> dict:
    """A trainer's history.json (train_bi_encoder's result) as the series the training figure
    draws: loss per step, the dev metric per evaluation (with the untrained model's at step 0
    when it was evaluated), the dev metric's name and the step kept."""
    history = list(record.get("history") or [])
    dev = [(int(step), float(value)) for step, value in record.get("dev_curve") or []]
    if not dev:  # a record without dev_curve: the values on the history entries
        dev = [(int(h["step"]), float(h["dev_metric"])) for h in history if h.get("dev_metric") is not None]
    name = None
    for h in history:
        if h.get("dev_metric") is not None and h.get("dev_metrics"):
            name = next((k for k, v in h["dev_metrics"].items() if v == h["dev_metric"]), None)
            if name:
                break
    best = record.get("best_step")
    return {"steps": [int(h["step"]) for h in history], "loss": [float(h["loss"]) for h in history],
            "dev_steps": [s for s, _ in dev], "dev": [v for _, v in dev], "dev_metric": name,
            "best_step": int(best) if best is not None and dev else None}


# -- drawing ---------------------------------------------------------------------------------------

def new_figure(width: float = 7.0, height: float = 4.0, ncols: int = 1):
    """(figure, axes) on matplotlib's Agg canvas, without pyplot."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.subplots(1, ncols)


def save_figure(fig, path: Path, dpi: int = 100) -> Path:
    """A PNG, or an SVG when `path` ends in .svg: the same figure gives the same bytes (no date,
    a fixed salt for the element ids), so a site drawing it at each build stays byte-stable."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".svg":
        from matplotlib import rc_context

        with rc_context({"svg.hashsalt": SVG_SALT}):
            fig.savefig(path, format="svg", metadata={"Date": None})
    else:
        fig.savefig(path, dpi=dpi, format="png")
    return path


def draw_loss(ax, steps: Sequence[int], losses: Sequence[float]) -> None:
    """The training loss per step; a long run also gets its moving mean over ~1/25 of the steps."""
    smooth = len(losses) >= 50
    ax.plot(steps, losses, color="tab:blue", lw=1.0, alpha=0.35 if smooth else 1.0,
            marker="o" if len(losses) <= 30 else None, ms=3, label="loss")
    if smooth:
        w = max(len(losses) // 25, 2)
        mean = np.convolve(np.asarray(losses, dtype=float), np.ones(w) / w, mode="valid")
        ax.plot(steps[w - 1:], mean, color="tab:blue", lw=1.8, label=f"loss, mean of {w} steps")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.grid(alpha=0.3)
    _integer_steps(ax)


def _integer_steps(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_curves(curves: Mapping[str, Sequence[float]], path: Path, *, ylabel: str, title: str) -> Path:
    """Every system's curve over k = 1..len(curve), in percent, on a log k axis."""
    from matplotlib.ticker import FixedLocator, NullFormatter

    fig, ax = new_figure(7.5, 4.6)
    # the legend lists the systems from the highest curve (by area) down
    order = sorted(curves, key=lambda s: -float(np.mean(curves[s])) if len(curves[s]) else 0.0)
    max_k, top = 1, 0.0
    for i, system in enumerate(order):
        values = 100.0 * np.asarray(curves[system], dtype=float)
        if not len(values):
            continue
        ks = np.arange(1, len(values) + 1)
        max_k, top = max(max_k, len(values)), max(top, float(values.max()))
        ax.plot(ks, values, label=system, lw=1.6, color=f"C{i % 10}", ls=_STYLES[(i // 10) % len(_STYLES)])
    ax.set_xscale("log")
    ax.set_xlim(1, max(max_k, 2))
    ax.xaxis.set_major_locator(FixedLocator([t for t in _TICKS if t <= max_k] + ([max_k] if max_k not in _TICKS else [])))
    ax.xaxis.set_major_formatter(lambda x, _: f"{x:g}")
    ax.xaxis.set_minor_formatter(NullFormatter())
    high = min(100.0, 10.0 * np.ceil((top * 1.05 + 1e-9) / 10.0))
    ax.set_ylim(0, 1.02 * high)  # a curve at the top tick stays clear of the frame
    ax.set_xlabel("k (passages retrieved)")
    ax.set_ylabel(f"{ylabel} (%)")
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    if curves:
        ax.legend(loc="lower right", fontsize="small", ncols=2 if len(curves) > 8 else 1)
    return save_figure(fig, path)


def plot_training(series: Mapping, path: Path, *, title: str) -> Path:
    """Loss per step and, when the run was evaluated, the dev metric per evaluation beside it."""
    with_dev = bool(series["dev"])
    fig, axes = new_figure(10.0 if with_dev else 6.0, 3.6, ncols=2 if with_dev else 1)
    loss_ax = axes[0] if with_dev else axes
    draw_loss(loss_ax, series["steps"], series["loss"])
    loss_ax.set_title("training loss" if with_dev else f"{title} (no dev metric)")
    if with_dev:
        draw_dev(axes[1], series["dev_steps"], series["dev"], series["best_step"], metric_label(series["dev_metric"]))
        axes[1].set_title("dev metric")
        if series["steps"]:  # both panels over the same steps
            lo = min(series["dev_steps"][0], series["steps"][0])
            hi = max(series["dev_steps"][-1], series["steps"][-1])
            for a in axes:
                a.set_xlim(lo - 0.02 * (hi - lo) - 0.5, hi + 0.02 * (hi - lo) + 0.5)
        fig.suptitle(title)
    return save_figure(fig, path)


def draw_dev(ax, steps: Sequence[int], values: Sequence[float], best_step: Optional[int], name: str) -> None:
    """The dev metric at each evaluation, the kept step starred."""
    ax.plot(steps, values, color="tab:green", marker="o", ms=4, lw=1.4, label=name)
    if best_step is not None and best_step in steps:
        value = values[list(steps).index(best_step)]
        ax.plot([best_step], [value], marker="*", ms=13, color="tab:red", ls="none", label=f"kept: step {best_step}")
    ax.set_xlabel("step")
    ax.set_ylabel(name)
    ax.grid(alpha=0.3)
    _integer_steps(ax)
    ax.legend(loc="best", fontsize="small")


def metric_label(name: Optional[str]) -> str:
    """A dev metric's name for people: 'dev_top20' (tasks.training.dev_metric) -> 'dev top-20 hit rate'."""
    if not name:
        return "dev metric"
    m = re.fullmatch(r"(\w+?)_top(\d+)", name)
    return f"{m.group(1)} top-{m.group(2)} hit rate" if m else name


def plot_comparisons(rows: Sequence[Mapping], path: Path) -> Path:
    """Forest plot of the paired comparisons (evaluation's comparisons rows): per pair and k, A's
    top-k accuracy (or qrels metric) minus B's in points, with its bootstrap interval; green when
    the whole interval is above 0, red when below, grey otherwise."""
    n = len(rows)
    fig, ax = new_figure(7.5, 1.3 + 0.36 * n)
    y = np.arange(n)
    for i, r in enumerate(rows):
        d, lo, hi = 100 * r["difference"], 100 * r["low"], 100 * r["high"]
        color = "tab:green" if r["low"] > 0 else ("tab:red" if r["high"] < 0 else "tab:gray")
        ax.errorbar([d], [i], xerr=[[d - lo], [hi - d]], fmt="o", color=color, ecolor=color, capsize=4, ms=5, lw=1.6)
    lows = [100 * r["low"] for r in rows] + [0.0]
    highs = [100 * r["high"] for r in rows] + [0.0]
    pad = max(0.08 * (max(highs) - min(lows)), 1.0)
    ax.set_xlim(min(lows) - pad, max(highs) + pad)
    ax.axvline(0.0, color="black", lw=0.8, ls="--")
    ax.set_ylim(n - 0.5, -0.5)  # the first row on top
    ax.set_yticks(y, [f"{r['system_a']} \u2212 {r['system_b']}, {_compared(r)}" for r in rows])
    right = ax.twinx()
    right.set_ylim(n - 0.5, -0.5)
    right.set_yticks(y, [f"{100 * r['difference']:+.1f} [{100 * r['low']:+.1f}, {100 * r['high']:+.1f}]" for r in rows])
    right.tick_params(length=0, labelsize="small")
    level = int(round(100 * rows[0]["level"])) if rows else 95
    splits = sorted({r["split"] for r in rows})
    measured = "top-k accuracy" if all(_is_top_k(r) for r in rows) else "metric \u00d7 100"
    ax.set_xlabel(f"A \u2212 B, {measured} points ({level}% paired bootstrap interval)")
    ax.set_title(f"Paired comparisons on the {', '.join(splits)} questions", fontsize="medium")
    ax.grid(axis="x", alpha=0.3)
    return save_figure(fig, path)


def _is_top_k(row: Mapping) -> bool:
    return row.get("metric", "top_k_accuracy") == "top_k_accuracy"


def _compared(row: Mapping) -> str:
    """'top-20' for top-k accuracy, the metrics table's label otherwise ('nDCG@10')."""
    from tasks.evaluation.report import column_label

    return f"top-{row['k']}" if _is_top_k(row) else column_label(row["metric"], row["k"])


def figure_name(stage: str) -> str:
    """A file name for a stage's figure: 'train:minilm-dpr' -> 'training-train-minilm-dpr.png'."""
    return "training-" + re.sub(r"[^A-Za-z0-9._-]+", "-", stage).strip("-") + ".png"


def read_history(path: Path) -> Optional[dict]:
    import json

    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
