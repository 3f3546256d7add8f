"""The end-to-end flow: the pipeline's table of contents."""
from __future__ import annotations

from typing import Optional

from prefect import flow, get_run_logger

from storage import ArtifactStore, resolve_root
from tasks.config import PipelineConfig
from tasks.prefect_tasks import STAGE_TASKS
from tasks.stages import STAGES, resolve_stage_name, upstream_for_single_stage

# Declared once: stage order (each stage's inputs come before it in this list).
PIPELINE = ["ingest_documents", "ingest_questions", "chunk", "link_gold", "bm25_index", "bm25_search", "evaluate"]


@flow(name="passage-forge", log_prints=True)
def pipeline(config: PipelineConfig = PipelineConfig(), stage: Optional[str] = None,
             root: Optional[str] = None) -> dict[str, str]:
    """Run the pipeline (or only `stage`, on its latest upstream artifacts). Returns stage -> version."""
    store_root = str(resolve_root(root))
    store = ArtifactStore(resolve_root(root))
    logger = get_run_logger()
    if stage is not None:
        name = resolve_stage_name(stage)
        artifact = STAGE_TASKS[name](store_root, config, upstream_for_single_stage(store, name, config))
        return {name: artifact.version}
    done = {}
    for name in PIPELINE:
        inputs = {dep: done[dep] for dep in STAGES[name].inputs}
        done[name] = STAGE_TASKS[name](store_root, config, inputs)
    logger.info("artifacts under %s", store_root)
    return {name: artifact.version for name, artifact in done.items()}
