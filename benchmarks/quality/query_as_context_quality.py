"""Query-as-context quality (paper 002): the test split's top-1/5/10/20/100 accuracy and MRR@10 of
each start (fine-tune only, passage-passage pre-training, the coCondenser and CoT-MAE forms) with
its retriever 1 (BM25 negatives) and retriever 2 (negatives mined by retriever 1), from one
pipeline run of a config, with seeds and runtimes.

    HF_HUB_OFFLINE=1 python benchmarks/quality/query_as_context_quality.py [--config configs/query-as-context.yaml] \
        [--root artifacts] [--seeds 42 ...] [--split test] [--out benchmarks/results/pretraining_quality_cpu.md]

Each seed runs the whole config through the flow (`pipeline`) with every pre-training and
fine-tuning seed set to it (the config's own seeds with no --seeds); artifacts the store already
holds are reused (a stage's runtime is then the one recorded when it was built: the "built" column
says which were built by this run). Rows follow the config's systems; a system's start is read
from its init_from (a pretrain run's form, or none: fine-tune only) and its retriever from its
negatives (a dense-mined strategy of another system: retriever 2). Metrics are the evaluation
stage's (the `metrics` table: top_k_accuracy and mrr@10 of the split). Runtimes: the pre-training
stage, the fine-tuning stage, and encode + index + search, in seconds as recorded in the manifests.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import time
from pathlib import Path

import _quality_bootstrap  # noqa: F401  (puts the project on sys.path)
import reporting  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

KS = (1, 5, 10, 20, 100)
FORM_NAMES = {"passage-passage": "passage-passage", "cocondenser": "coCondenser form", "cotmae": "CoT-MAE form"}


def with_seed(cfg, seed: int | None):
    """`cfg` with every pre-training and fine-tuning seed set to `seed` (None: unchanged)."""
    from tasks.config import PipelineConfig

    if seed is None:
        return cfg
    raw = cfg.model_dump()
    for run in raw["pretrain"]:
        run["seed"] = seed
    for system in (raw["dense"] or {}).get("systems", []):
        if system.get("train"):
            system["train"]["schedule"]["seed"] = seed   # a dump holds the trainer's settings as train.schedule
    out = PipelineConfig.model_validate(raw)
    out._config_dir = cfg._config_dir
    return out


def describe(cfg) -> dict[str, tuple[str, str]]:
    """system -> (start, retriever) from init_from and the negatives it draws."""
    forms = {p.name: p.form for p in cfg.pretrain}
    miners = {name: m.system for name, m in cfg.negatives.dense.items()}
    out = {}
    for s in cfg.dense.systems:
        init = s.init_from or ""
        if init.startswith("pretrain:"):
            start = FORM_NAMES[forms[init.split(":", 1)[1]]] + " then fine-tune"
        elif init:
            start = f"from {init}"
        else:
            start = "fine-tune only" if s.train else "no training (zero-shot)"
        mined_by = [miners[n] for n in (s.train.negatives if s.train else []) if n in miners]
        retriever = "-" if s.train is None else (f"2 (negatives of {', '.join(mined_by)})" if mined_by else "1 (BM25 negatives)")
        out[s.name] = (start, retriever)
    return out


def seconds_of(store, stage_versions: list[tuple[str, str]]) -> float:
    """Summed recorded build seconds of (artifact, version) pairs."""
    return sum(float(store.get(a, v).manifest.get("timings", {}).get("build_s", 0.0)) for a, v in stage_versions)


def run_seed(cfg, root: str, seed: int | None, split: str) -> tuple[list[dict], dict]:
    from flows.pipeline import pipeline
    from flows.registry import plan_for
    from storage import ArtifactStore

    cfg = with_seed(cfg, seed)
    started = dt.datetime.now(dt.timezone.utc)
    t0 = time.perf_counter()
    versions = pipeline(config=cfg, root=root)
    wall = time.perf_counter() - t0
    store = ArtifactStore(Path(root))
    plan = plan_for(cfg)
    metrics = store.get(plan["evaluate"].artifact, versions["evaluate"]).read_table("metrics")
    values = {}
    for row in metrics.to_pylist():
        if row["split"] == split:
            values[(row["system"], row["metric"], int(row["k"]))] = float(row["value"])

    def built_now(artifact, version):
        created = dt.datetime.fromisoformat(store.get(artifact, version).manifest["created_at"])
        return created >= started

    rows = []
    for system, (start, retriever) in describe(cfg).items():
        if f"search:{system}" not in versions:
            continue
        s = next(x for x in cfg.dense.systems if x.name == system)
        parts = {"pretrain": [], "train": [], "encode": []}
        seeds = []
        if s.init_from and s.init_from.startswith("pretrain:"):
            parts["pretrain"].append((plan[s.init_from].artifact, versions[s.init_from]))
            seeds.append(plan[s.init_from].params.pretrain.seed)
        if s.train is not None:
            seeds.append(s.train.schedule.seed)
        if s.train is not None:
            parts["train"].append((plan[f"train:{system}"].artifact, versions[f"train:{system}"]))
        for kind in ("encode", "index", "search"):
            parts["encode"].append((plan[f"{kind}:{system}"].artifact, versions[f"{kind}:{system}"]))
        rows.append({
            "system": system, "start": start, "retriever": retriever, "seeds": "/".join(map(str, seeds)) or "-",
            "top": {k: values.get((system, "top_k_accuracy", k)) for k in KS},
            "mrr10": values.get((system, "mrr", 10)),
            "questions": values.get((system, "n_questions", 0)),
            "seconds": {k: seconds_of(store, v) for k, v in parts.items()},
            "built": any(built_now(a, v) for part in parts.values() for a, v in part),
        })
    return rows, {"wall_s": wall, "evaluate": versions["evaluate"],
                  "pretrain": {n: versions[n] for n in versions if n.startswith("pretrain:")}}


def pct(v):
    return "-" if v is None else f"{100 * v:.1f}"


def table(rows: list[dict]) -> str:
    header = ["system", "start", "retriever", "seeds", *[f"top-{k}" for k in KS], "MRR@10",
              "pre-train s", "fine-tune s", "encode+search s", "built"]
    cells = []
    for r in rows:
        sec = r["seconds"]
        cells.append([
            r["system"], r["start"], r["retriever"], r["seeds"],
            *[pct(r["top"][k]) for k in KS], "-" if r["mrr10"] is None else f"{r['mrr10']:.3f}",
            f"{sec['pretrain']:.0f}" if sec["pretrain"] else "-", f"{sec['train']:.0f}" if sec["train"] else "-",
            f"{sec['encode']:.0f}", "yes" if r["built"] else "reused"])
    return reporting.markdown_table(header, cells, numeric_from=3)


def main(argv=None) -> dict:
    from storage import resolve_root
    from tasks.config import PROJECT_ROOT, load_config

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(PROJECT_ROOT / "configs" / "query-as-context.yaml"))
    ap.add_argument("--root", default=None, help="artifact store (default: $PFORGE_HOME or ./artifacts)")
    ap.add_argument("--seeds", type=int, nargs="*", default=None, help="runs with every seed set to each (default: the config's)")
    ap.add_argument("--split", default="test")
    ap.add_argument("--out", default=None, help="write the markdown here too")
    args = ap.parse_args(argv)

    import torch

    cfg = load_config(args.config)
    root = str(resolve_root(args.root))
    all_rows, runs = [], []
    for seed in (args.seeds or [None]):
        rows, info = run_seed(cfg, root, seed, args.split)
        all_rows += rows
        runs.append({"seed": seed, **info})
    device = (reporting.device_name("cuda") if torch.cuda.is_available()
              else f"cpu ({reporting.cpu_name()}, {os.cpu_count()} cores)")
    questions = {r["questions"] for r in all_rows if r["questions"]}
    report = [reporting.header(f"Query-as-context pre-training then fine-tuning ({Path(args.config).name}, {args.split} split)",
                               __file__, argv, env="HF_HUB_OFFLINE=1"),
              f"device {device}; torch {torch.__version__}; {', '.join(str(int(q)) for q in sorted(questions))} "
              f"{args.split} questions; store {root}", "",
              table(all_rows), "",
              "Seeds: pre-training/fine-tuning. Top-k: share of questions with an answer-bearing passage in "
              "the top k (DPR); MRR@10 as the evaluation stage computes it. Runtimes are each stage's recorded "
              "build seconds (`reused`: built before this run, by an earlier run of the same versions).", ""]
    for run in runs:
        report.append(f"- seed {run['seed'] if run['seed'] is not None else 'as configured'}: pipeline wall "
                      f"{run['wall_s']:.0f} s; evaluate {run['evaluate']}; "
                      + ", ".join(f"{k} {v}" for k, v in run["pretrain"].items()))
    text = "\n".join(report) + "\n"
    print(text)
    if args.out:
        reporting.write_report(Path(args.out), text)
    return {"rows": all_rows, "runs": runs}


if __name__ == "__main__":
    main()
