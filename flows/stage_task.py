"""Thin Prefect layer over the engine: one task per stage; the evaluation also publishes its
report and metrics as Prefect artifacts, before its folder is committed (a failed publication
registers nothing)."""
from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from storage import Artifact, ArtifactStore
from tasks.engine import Stage, run_stage


def _publish_evaluation(config_name: str):
    def publish(out: Path) -> None:
        import pyarrow.parquet as pq

        key = f"{config_name}-evaluation".lower().replace("_", "-")
        create_markdown_artifact(key=key, markdown=(out / "report.md").read_text(encoding="utf-8"),
                                 description=f"evaluation report of {config_name}")
        metrics = pq.read_table(out / "data" / "metrics").to_pylist()
        create_table_artifact(key=f"{key}-metrics", table=metrics, description=f"metrics of {config_name}")
    return publish


def stage_task(stage: Stage, config_name: str):
    # The artifact store does the caching (content-hash versions), so Prefect's own is off.
    @task(name=stage.name, cache_policy=NO_CACHE, retries=0)
    def run(store: ArtifactStore, inputs: dict[str, Artifact]) -> Artifact:
        publish = _publish_evaluation(config_name) if stage.name == "evaluate" else None
        return run_stage(store, stage, inputs, before_commit=publish)

    return run
