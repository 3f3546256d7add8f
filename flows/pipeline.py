"""The end-to-end flow: the pipeline's table of contents (the stages come from the registry)."""
from __future__ import annotations

from typing import Optional

from prefect import flow, get_run_logger

from flows.registry import plan_for
from flows.stage_task import stage_task
from storage import ArtifactStore, resolve_root
from tasks.config import PipelineConfig
from tasks.engine import not_needed


@flow(name="passage-forge", log_prints=True)
def pipeline(config: PipelineConfig = PipelineConfig(), stage: Optional[str] = None,
             root: Optional[str] = None, upto: Optional[str] = None) -> dict[str, str]:
    """Run the pipeline (or only `stage`, on its latest upstream artifacts; or `upto`: that stage
    (or each of "A,B") and every stage it needs, not the rest). Returns stage -> version."""
    plan = plan_for(config)
    store = ArtifactStore(resolve_root(root), writable=True)  # opened once per flow run
    logger = get_run_logger()
    if stage is not None:
        name = plan.resolve_name(stage)
        artifact = stage_task(plan[name], config.name)(store, plan.upstream_for_single_stage(store, name))
        return {name: artifact.version}
    needed = set().union(*(plan.needed_for(n.strip()) for n in upto.split(","))) if upto is not None else None
    names = [s.name for s in plan if needed is None or s.name in needed]
    left_out = not_needed(plan, store, names)
    done = {}
    for declared in plan:
        if declared.name not in names or declared.name in left_out:
            continue
        if any(dep in left_out for dep in declared.inputs):   # built (or it would be left out): read, not rerun
            done[declared.name] = store.get(declared.artifact, plan.planned_version(declared.name))
            logger.info("%s: %s %s (built; its inputs are not in this root)", declared.name, declared.artifact,
                        done[declared.name].version)
            continue
        if plan.missing_pins(store, declared.name) and (
                built := store.get(declared.artifact, plan.planned_version(declared.name))) is not None:
            # imported (the study's shared inputs): the generator another run fine-tuned is not needed
            done[declared.name] = built
            logger.info("%s: %s %s (built; the other run's artifact it read is not in this root)", declared.name,
                        declared.artifact, built.version)
            continue
        inputs = {dep: done[dep] for dep in declared.inputs}
        inputs.update(plan.pinned_inputs(store, declared.name))
        done[declared.name] = stage_task(declared, config.name)(store, inputs)
    if left_out:
        logger.info("not run (every stage that reads them is built): %s", ", ".join(sorted(left_out)))
    logger.info("artifacts under %s", store.root)
    return {name: artifact.version for name, artifact in done.items()}
