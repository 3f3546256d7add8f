"""`pforge compare SYSTEM_A SYSTEM_B`: the paired bootstrap interval of A's top-k accuracy minus
B's, from the per-question results of the newest evaluation that scored both (or a given one)."""
from __future__ import annotations

from typing import Optional, Sequence

import pyarrow.compute as pc


def evaluation_with(store, systems: Sequence[str], version: Optional[str] = None):
    """The evaluation artifact `version`, else the newest whose question results hold every system."""
    if version is not None:
        return store.find(f"evaluation:{version}")
    for row in reversed(store.list_artifacts("evaluation")):
        artifact = store.get("evaluation", row["version"])
        present = set(pc.unique(artifact.read_table("question_results", columns=["system"]).column("system")).to_pylist())
        if set(systems) <= present:
            return artifact
    raise ValueError(f"no evaluation in {store.root} scored all of {list(systems)}: run the config that builds them, "
                     "or name an evaluation with --evaluation")


def compare(store, a: str, b: str, split: str = "test", ks: Sequence[int] = (1, 20), samples: int = 10_000,
            seed: int = 0, version: Optional[str] = None) -> tuple[object, list[dict]]:
    from tasks.evaluation.bootstrap import compare_systems

    artifact = evaluation_with(store, (a, b), version)
    return artifact, compare_systems(artifact.read_table("question_results"), a, b, split, ks, samples, seed)
