"""Thin Prefect layer over the stages: one task per stage, results published as Prefect artifacts."""
from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from storage import Artifact, ArtifactStore
from tasks.config import PipelineConfig
from tasks.stages import run_stage


def stage_task(name: str):
    # The artifact store does the caching (content-hash versions), so Prefect's own is off.
    @task(name=name, cache_policy=NO_CACHE, retries=0)
    def run(root: str, config: PipelineConfig, inputs: dict[str, Artifact]) -> Artifact:
        artifact = run_stage(ArtifactStore(Path(root)), name, config, inputs)
        if name == "evaluate":
            report = (artifact.path / "report.md").read_text(encoding="utf-8")
            key = f"{config.name}-evaluation".lower().replace("_", "-")
            create_markdown_artifact(key=key, markdown=report, description=f"evaluation {artifact.version}")
            metrics = artifact.read_table("metrics").to_pylist()
            create_table_artifact(key=f"{key}-metrics", table=metrics, description=f"metrics of evaluation {artifact.version}")
        return artifact

    return run

