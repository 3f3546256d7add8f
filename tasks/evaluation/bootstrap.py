"""Paired bootstrap intervals for the difference between two systems on the same questions
(Koehn 2004; Efron & Tibshirani 1993): resample the questions with replacement, recompute the
difference of the two systems' means on each resample, and report the percentile interval."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_CHUNK = 500  # resamples drawn at a time: (chunk, questions) indices stay small in memory


def paired_bootstrap(a: Sequence[float], b: Sequence[float], samples: int = 10_000, seed: int = 0,
                     level: float = 0.95) -> dict:
    """a[i], b[i]: the two systems' scores of question i. Returns the means, their difference,
    the `level` percentile interval of the difference and the share of resamples where a does not
    beat b (a one-sided bootstrap p-value for "a > b")."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or not len(a):
        raise ValueError(f"paired bootstrap needs two equal, non-empty score vectors; got {a.shape} and {b.shape}")
    if samples < 1 or not 0 < level < 1:
        raise ValueError(f"samples must be >= 1 and level in (0, 1); got {samples}, {level}")
    diff, n = a - b, len(a)
    rng = np.random.default_rng(seed)
    means = np.concatenate([diff[rng.integers(0, n, size=(min(_CHUNK, samples - done), n))].mean(axis=1)
                            for done in range(0, samples, _CHUNK)])
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return {"questions": n, "a": float(a.mean()), "b": float(b.mean()), "difference": float(diff.mean()),
            "low": float(low), "high": float(high), "p_not_better": float(np.mean(means <= 0)),
            "samples": int(samples), "level": float(level)}


def first_hit_ranks_of(results: pa.Table, system: str, split: str) -> dict[str, int | None]:
    """qid -> first answer-bearing rank (None: none in the run) of `system` on `split` ('all': every split)."""
    rows = results.filter(pc.equal(results.column("system"), system))
    if split != "all":
        rows = rows.filter(pc.equal(rows.column("split"), split))
    return dict(zip(rows.column("qid").to_pylist(), rows.column("first_hit_rank").to_pylist()))


def compare_systems(results: pa.Table, a: str, b: str, split: str = "test", ks: Sequence[int] = (1, 20),
                    samples: int = 10_000, seed: int = 0, level: float = 0.95) -> list[dict]:
    """One row per k: top-k accuracy of `a` minus that of `b` over the questions of `split` both
    were scored on (evaluation's question_results), with its paired bootstrap interval."""
    known = sorted(set(results.column("system").to_pylist()))
    ranks = {}
    for system in (a, b):
        ranks[system] = first_hit_ranks_of(results, system, split)
        if not ranks[system]:
            raise ValueError(f"no question results of system {system!r} on split {split!r}; systems: {known}")
    qids = sorted(ranks[a].keys() & ranks[b].keys())
    if not qids:
        raise ValueError(f"systems {a!r} and {b!r} share no question of split {split!r}")
    rows = []
    for k in ks:
        hits = {s: [1.0 if (r := ranks[s][q]) is not None and r <= k else 0.0 for q in qids] for s in (a, b)}
        stats = paired_bootstrap(hits[a], hits[b], samples=samples, seed=seed, level=level)
        rows.append({"system_a": a, "system_b": b, "split": split, "metric": "top_k_accuracy", "k": int(k), **stats})
    return rows


def compare_systems_on_qrels(runs: dict[str, pa.Table], qrels: pa.Table, split_of: dict[str, str], a: str, b: str,
                             split: str = "test", metric: str = "ndcg_cut", ks: Sequence[int] = (10,),
                             samples: int = 10_000, seed: int = 0, level: float = 0.95) -> list[dict]:
    """One row per k: `metric`@k of `a` minus that of `b` over the judged queries of `split`
    (corpora judged by qrels, BEIR's: nDCG@10 is their measure), with its paired bootstrap interval."""
    from tasks.evaluation.ir_metrics import per_query_values

    for system in (a, b):
        if system not in runs:
            raise ValueError(f"no run of system {system!r}; systems: {sorted(runs)}")
    judged = sorted(set(qrels.column("qid").to_pylist()))
    qids = [q for q in judged if split == "all" or split_of.get(q) == split]
    if not qids:
        raise ValueError(f"no judged query of split {split!r} to compare {a!r} and {b!r} on")
    rows = []
    for k in ks:
        values = {s: per_query_values(runs[s], qrels, qids, metric, int(k)) for s in (a, b)}
        stats = paired_bootstrap(values[a], values[b], samples=samples, seed=seed, level=level)
        rows.append({"system_a": a, "system_b": b, "split": split, "metric": metric, "k": int(k), **stats})
    return rows


def runs_by_system(runs: Sequence[pa.Table], passages: pa.Table | None = None) -> dict[str, pa.Table]:
    """system -> its run as the metrics scored it: with `passages` (BEIR's ignore_identical_ids),
    a retrieved passage of the query's own document dropped."""
    if passages is not None:
        from tasks.evaluation.identical_ids import drop_identical_ids

        doc_of = dict(zip(passages.column("pid").to_pylist(), passages.column("doc_id").to_pylist()))
        runs = [drop_identical_ids(run, doc_of) for run in runs]
    return {system: run.filter(pc.equal(run.column("system"), system))
            for run in runs for system in pc.unique(run.column("system")).to_pylist()}


def verdict(row: dict) -> str:
    """Whether A beats B: yes when the whole interval is above 0, "no, B is" when it is below."""
    return "yes" if row["low"] > 0 else ("no, B is" if row["high"] < 0 else "not shown")


def comparisons_markdown(rows: Sequence[dict]) -> str:
    """The report's table: differences in points with their intervals."""
    if not rows:
        return ""
    level = int(round(100 * rows[0]["level"]))
    lines = [f"| A | B | split | metric | A | B | A - B | {level}% interval | A better? |",
             "|---|---|---|---|---:|---:|---:|---|---|"]
    for r in rows:
        lines.append(f"| {r['system_a']} | {r['system_b']} | {r['split']} | {_metric_label(r)} | {100 * r['a']:.1f} | "
                     f"{100 * r['b']:.1f} | {100 * r['difference']:+.1f} | [{100 * r['low']:+.1f}, {100 * r['high']:+.1f}] "
                     f"| {verdict(r)} |")
    return "\n".join(lines)


def _metric_label(row: dict) -> str:
    from tasks.evaluation.report import column_label

    return f"top-{row['k']}" if row.get("metric", "top_k_accuracy") == "top_k_accuracy" else column_label(row["metric"], row["k"])
