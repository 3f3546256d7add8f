"""Thin Prefect layer over the engine: one task per stage. While it runs, the stage's progress
reports feed a Prefect progress artifact; once built, its summary is a markdown artifact. The
evaluation also publishes its report and metrics as Prefect artifacts before its folder is
committed (a failed publication registers nothing)."""
from __future__ import annotations

import logging
from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from flows.ui_artifacts import StageProgress, artifact_key, embed_images, publish_summary
from storage import Artifact, ArtifactStore
from tasks.engine import Stage, run_stage
from tasks.progress import listening

logger = logging.getLogger("passage_forge")


def _publish_evaluation(config_name: str):
    def publish(out: Path) -> None:
        import pyarrow.parquet as pq

        key = artifact_key(config_name, "evaluation")
        create_markdown_artifact(key=key, markdown=embed_images((out / "report.md").read_text(encoding="utf-8"), out),
                                 description=f"evaluation report of {config_name}")
        metrics = pq.read_table(out / "data" / "metrics").to_pylist()
        create_table_artifact(key=f"{key}-metrics", table=metrics, description=f"metrics of {config_name}")
    return publish


def stage_task(stage: Stage, config_name: str):
    # The artifact store does the caching (content-hash versions), so Prefect's own is off.
    @task(name=stage.name, cache_policy=NO_CACHE, retries=0)
    def run(store: ArtifactStore, inputs: dict[str, Artifact]) -> Artifact:
        logger.info("%s: running", stage.name)  # which stage a run is in, before its first report
        publish = _publish_evaluation(config_name) if stage.name == "evaluate" else None
        key = artifact_key(config_name, stage.name)
        with listening(StageProgress(f"{key}-progress", stage.name)):
            artifact = run_stage(store, stage, inputs, before_commit=publish)
        publish_summary(f"{key}-summary", stage.name, artifact)
        return artifact

    return run
