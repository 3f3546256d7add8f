"""`pforge compare SYSTEM_A SYSTEM_B`: the paired bootstrap interval of A's metric minus B's, from
the newest evaluation that scored both (or a given one): top-k answer accuracy from its
per-question results, or a qrels metric (nDCG@k for corpora without answers, BEIR's) from the runs
and judgements it read."""
from __future__ import annotations

from typing import Optional, Sequence

import pyarrow.compute as pc


def evaluation_with(store, systems: Sequence[str], version: Optional[str] = None):
    """The evaluation artifact `version`, else the newest whose metrics hold every system."""
    if version is not None:
        return store.find(f"evaluation:{version}")
    for row in reversed(store.list_artifacts("evaluation")):
        artifact = store.get("evaluation", row["version"])
        present = set(pc.unique(artifact.read_table("metrics", columns=["system"]).column("system")).to_pylist())
        if set(systems) <= present:
            return artifact
    raise ValueError(f"no evaluation in {store.root} scored all of {list(systems)}: run the config that builds them, "
                     "or name an evaluation with --evaluation")


def compare(store, a: str, b: str, split: str = "test", ks: Sequence[int] = (1, 20), samples: int = 10_000,
            seed: int = 0, version: Optional[str] = None, metric: str = "auto") -> tuple[object, list[dict]]:
    from tasks.evaluation.bootstrap import compare_systems, compare_systems_on_qrels, runs_by_system

    artifact = evaluation_with(store, (a, b), version)
    results = artifact.read_table("question_results")
    if metric == "auto":
        metric = "top_k_accuracy" if results.num_rows else "ndcg_cut"
    if metric == "top_k_accuracy":
        return artifact, compare_systems(results, a, b, split, ks, samples, seed)

    def read(name: str):
        source = artifact.manifest["inputs"][name]
        return store.get(source["stage"], source["version"])
    params = artifact.manifest["parameters"]
    questions = read("ingest_questions").read_table("questions", columns=["qid", "split"])
    passages = read("chunk").read_table(columns=["pid", "doc_id"]) if params.get("ignore_identical_ids") else None
    runs = runs_by_system([read(name).read_table() for name in params["runs"]], passages)
    split_of = dict(zip(questions.column("qid").to_pylist(), questions.column("split").to_pylist()))
    return artifact, compare_systems_on_qrels(runs, read("link_gold").read_table(), split_of, a, b, split, metric, ks,
                                              samples, seed)
