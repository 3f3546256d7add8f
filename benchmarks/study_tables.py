"""The corpus-scale study's tables (issue 24) from its artifact root: each stage's build time,
the test split's metrics of every system, the paired comparisons and the reproduction table
("paper claim | here | interval | reproduced?"). It reads the artifacts that the study's configs
plan (their versions), so a phase not run yet shows as "not run". Nothing is trained here.

    .venv/bin/python benchmarks/study_tables.py --root ~/pforge-runs/study > benchmarks/results/study_cpu.md
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.timing import cpu_name  # noqa: E402

PHASES = ("study-teacher", "study-qgen", "study", "study-query-as-context")
# Issue 25's adaptation runs into the same root (its generator is squad-open.yaml's): their stages
# are listed under their own config, not mistaken for the study's.
OTHER_CONFIGS = ("squad-open", "nfcorpus-adapt-qgen", "nfcorpus-adapt", "nfcorpus-adapt-ablations",
                 "nfcorpus-adapt-tuned-teacher")

# (paper, claim, system A, system B, k): A beats B at top-k on the test split.
CLAIMS = [
    ("001 table 2", "the cross-attention classifier beats the dual encoder on F1 and AUC", None, None, None),
    ("001 sec. 5", "reranking by the classifier lifts the hybrid's top-1 (bar: >= 80)", "hybrid-gold-s1-rerank",
     "hybrid(gold-s1)", 1),
    ("001 sec. 5", "reranking by the classifier lifts a dense system's top-1", "gold-s1-rerank", "gold-s1", 1),
    ("001 table 3", "gold + silver (weighted) beats gold only", "silver-s1", "gold-s1", 1),
    ("001 table 3", "gold + silver (weighted) beats gold only (seed 2)", "silver-s2", "gold-s2", 1),
    ("001 sec. 4.2", "the weighted softmax beats the plain one on gold + silver", "silver-s1", "silver-plain-s1", 1),
    ("001 (distillation)", "a student distilled from the classifier beats gold only", "distilled-s1", "gold-s1", 1),
    ("003 sec. 4.1", "two-stage beats gold only (top-1)", "two-stage-s1", "gold-s1", 1),
    ("003 sec. 4.1", "two-stage beats gold only (top-1, seed 2)", "two-stage-s2", "gold-s2", 1),
    ("003 sec. 4.1", "two-stage beats gold only (top-20)", "two-stage-s1", "gold-s1", 20),
    ("003 sec. 4.1", "gold fine-tuning improves on stage 1 (synthetic only)", "two-stage-s1", "stage1-s1", 1),
    ("003 table 2", "BM25 hard negatives beat Rnd", "gold-s1", "rnd-s1", 1),
    ("003 table 2", "mixed hard negatives beat Rnd", "mixed-s1", "rnd-s1", 1),
    ("003 sec. 4.4", "the embedding-fusion ensemble beats its best member", "ensemble-embedding", "mixed-s1", 1),
    ("003 sec. 4.4", "the rank-fusion ensemble beats its best member", "ensemble-rank", "mixed-s1", 1),
    ("000 table 2", "xMoCo beats DPR at equal steps", "xmoco-s1", "dpr-s1", 20),
    ("002 table 1", "query-as-context pre-training beats fine-tuning only (retriever 1)", "cocondenser-r1", "ft-r1", 1),
    ("002 figure 3", "retriever 2 beats retriever 1", "cocondenser-r2", "cocondenser-r1", 1),
]


def planned_versions(configs=PHASES + OTHER_CONFIGS) -> dict[str, dict[str, str]]:
    """config -> {plan step: version} of each config's plan (configs/NAME.yaml)."""
    from flows.registry import plan_for
    from tasks.config import PROJECT_ROOT, load_config

    out = {}
    for name in configs:
        plan = plan_for(load_config(PROJECT_ROOT / "configs" / f"{name}.yaml"))
        out[name] = {step: plan.planned_version(step) for step in plan.names()}
    return out


def evaluations(root: Path, planned: dict[str, dict[str, str]]):
    """phase -> its evaluation artifact (None: not run yet), from the versions its config plans."""
    from storage import ArtifactStore

    store = ArtifactStore(root, create=False)
    out = {}
    for phase in PHASES:
        version = planned[phase]["evaluate"]
        out[phase] = store.get("evaluation", version) if (root / "evaluation" / version).is_dir() else None
    return store, out


def stage_times(store, planned: dict[str, dict[str, str]]) -> list[str]:
    """Each artifact built in 30 s or more, with the first config (the study's phases first) that plans it."""
    config_of: dict[str, str] = {}
    for config, versions in planned.items():
        for version in versions.values():
            config_of.setdefault(version, config)
    lines = ["| config | stage | version | build | rows |", "|---|---|---|---:|---:|"]
    for row in store.list_artifacts():
        manifest = store.get(row["stage"], row["version"]).manifest
        seconds = (manifest.get("timings") or {}).get("build_s")
        variant = (manifest.get("variant") or {}).get("system")
        name = f"{row['stage']} ({variant})" if variant else row["stage"]
        if seconds is not None and seconds >= 30:
            lines.append(f"| {config_of.get(row['version'], 'another config')} | {name} | {row['version']} | "
                         f"{seconds / 60:.1f} min | {row['rows'] or 0:,} |")
    return lines


def classifier_row(paper: str, claim: str, manifest: dict | None) -> str:
    """Paper 001's table 2 claim from the classifier's report (its manifest's stats)."""
    rows = ((manifest or {}).get("stats") or {}).get("report") or []
    by = {r["model"].split(" ")[0]: r for r in rows}
    if "cross-attention" not in by or "dual" not in by:
        return f"| {paper} | {claim} | not run | - | - |"
    ce, de = by["cross-attention"], by["dual"]
    here = f"F1 {100 * ce['f1']:.1f} vs {100 * de['f1']:.1f}; AUC {100 * ce['auc']:.1f} vs {100 * de['auc']:.1f}"
    reproduced = "yes" if ce["f1"] > de["f1"] and ce["auc"] > de["auc"] else "no"
    return f"| {paper} | {claim} | {here} | - | {reproduced} |"


def metrics_table(results) -> list[str]:
    """Top-1/5/20/100 on the test split per system, from question_results (every phase's)."""
    ranks: dict[str, list] = {}
    for system, split, rank in zip(*(results.column(c).to_pylist() for c in ("system", "split", "first_hit_rank"))):
        if split == "test":
            ranks.setdefault(system, []).append(rank)
    lines = ["| system | questions | top-1 | top-5 | top-20 | top-100 |", "|---|---:|---:|---:|---:|---:|"]
    for system, rs in sorted(ranks.items()):
        cells = [f"{100 * sum(1 for r in rs if r is not None and r <= k) / len(rs):.1f}" for k in (1, 5, 20, 100)]
        lines.append(f"| {system} | {len(rs):,} | " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    import pyarrow as pa

    from tasks.evaluation.bootstrap import compare_systems, verdict

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path.home() / "pforge-runs" / "study")
    parser.add_argument("--samples", type=int, default=10_000)
    args = parser.parse_args()
    planned = planned_versions()
    store, phases = evaluations(args.root, planned)
    print(f"# Corpus-scale study (issue 24)\n\nCPU: {cpu_name()}; root {args.root}; phases run: "
          f"{', '.join(p for p, a in phases.items() if a) or 'none'}.\n")
    print("## Stage build times (30 s or more)\n")
    print("\n".join(stage_times(store, planned)) + "\n")
    tables = [a.read_table("question_results") for a in phases.values() if a is not None]
    results = pa.concat_tables(tables).group_by(["system", "qid", "split"]).aggregate([("first_hit_rank", "min")]) \
        .rename_columns(["system", "qid", "split", "first_hit_rank"]) if tables else None
    if results is not None:
        print("## Test split (top-k answer accuracy, %)\n")
        print("\n".join(metrics_table(results)) + "\n")
    classifier_version = planned["study-teacher"]["cross_encoder"]   # the study's, not the newest in the root
    classifier = store.get("cross_encoder", classifier_version) \
        if (args.root / "cross_encoder" / classifier_version).is_dir() else None
    print("## Reproduction\n")
    print("| paper | claim | here (A vs B) | 95% interval of A - B | reproduced? |\n|---|---|---|---|---|")
    known = set(results.column("system").to_pylist()) if results is not None else set()
    for paper, claim, a, b, k in CLAIMS:
        if a is None:
            print(classifier_row(paper, claim, classifier.manifest if classifier is not None else None))
        elif not {a, b} <= known:
            print(f"| {paper} | {claim} | not run ({a} vs {b}) | - | - |")
        else:
            r = compare_systems(results, a, b, "test", (k,), samples=args.samples)[0]
            print(f"| {paper} | {claim} | top-{k} {100 * r['a']:.1f} vs {100 * r['b']:.1f} ({a} vs {b}) | "
                  f"[{100 * r['low']:+.1f}, {100 * r['high']:+.1f}] | {verdict(r)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
