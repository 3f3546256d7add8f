"""The end-to-end flow: the pipeline's table of contents."""
from __future__ import annotations

from typing import Optional

from prefect import flow, get_run_logger

from storage import ArtifactStore, resolve_root
from tasks.config import PipelineConfig
from tasks.prefect_tasks import stage_task
from tasks.stages import resolve_stage_name, stages_for, upstream_for_single_stage

# The stages every config runs, in order; dense systems and the hybrid add theirs before evaluate
# (tasks/stages.py: stages_for).
PIPELINE = list(stages_for(PipelineConfig()))


@flow(name="passage-forge", log_prints=True)
def pipeline(config: PipelineConfig = PipelineConfig(), stage: Optional[str] = None,
             root: Optional[str] = None) -> dict[str, str]:
    """Run the pipeline (or only `stage`, on its latest upstream artifacts). Returns stage -> version."""
    store_root = str(resolve_root(root))
    store = ArtifactStore(resolve_root(root))
    logger = get_run_logger()
    if stage is not None:
        name = resolve_stage_name(stage, config)
        artifact = stage_task(name)(store_root, config, upstream_for_single_stage(store, name, config))
        return {name: artifact.version}
    done = {}
    for name, declared in stages_for(config).items():
        inputs = {dep: done[dep] for dep in declared.inputs}
        done[name] = stage_task(name)(store_root, config, inputs)
    logger.info("artifacts under %s", store_root)
    return {name: artifact.version for name, artifact in done.items()}
