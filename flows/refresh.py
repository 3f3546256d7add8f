"""The corpus-refresh flow: a thin Prefect layer over tasks/refresh (the plain functions). Its
report is also published as a Prefect markdown artifact before it is committed (a failed
publication registers nothing); its progress and each artifact's summary show as for a stage."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from flows.registry import plan_for
from flows.ui_artifacts import StageProgress, artifact_key, publish_summary
from storage import ArtifactStore, resolve_root
from tasks.config import PipelineConfig
from tasks.progress import listening
from tasks.refresh.stages import refresh_corpus


def _publish_report(config_name: str):
    def publish(out: Path) -> None:
        key = artifact_key(config_name, "corpus-refresh")
        create_markdown_artifact(key=key, markdown=(out / "report.md").read_text(encoding="utf-8"),
                                 description=f"corpus refresh of {config_name}")
    return publish


@flow(name="corpus-refresh", log_prints=True)
def corpus_refresh(config: PipelineConfig = PipelineConfig(), dump: Optional[str] = None,
                   root: Optional[str] = None) -> dict:
    """Refresh the corpus `config` built from a newer dump (`dump`: a path, a glob or a URL with
    an optional {date}; empty: the config's refresh.dump, else its own dump read again). Returns
    the versions in force, the counts and the report's path."""
    store = ArtifactStore(resolve_root(root), writable=True)

    def summarize(stage, artifact) -> None:
        publish_summary(artifact_key(config.name, stage.name, "summary"), stage.name, artifact)
    with listening(StageProgress(artifact_key(config.name, "corpus-refresh", "progress"), "corpus-refresh")):
        result = refresh_corpus(config, plan_for(config), store, dump, before_commit=_publish_report(config.name),
                                on_built=summarize)
    summary = result.summary()
    get_run_logger().info("corpus refresh of %s: %s", config.name,
                          "up to date" if result.up_to_date else summary["report"])
    return summary
