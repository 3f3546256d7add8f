"""Run one training stage data-parallel under torchrun (DDP: NCCL on GPUs, gloo on CPUs):

    torchrun --nproc_per_node 4 -m flows.ddp configs/squad-open.yaml --stage train:NAME [--root DIR]

Like `pforge run CONFIG --stage train:NAME` (the stage on its latest upstream artifacts), but
`pforge` itself cannot run under torchrun: every rank would build the stage into the store. Here
every rank plans the config, and rank 0 alone opens the artifact store: it resolves the inputs and
builds the stage through the engine (version lock, build folder, commit). When its build starts it
sends the inputs to the other ranks, which run the same builder on them in a scratch folder:
run_training trains all ranks together, and only rank 0's outputs become the artifact; the other
ranks register nothing. A cache hit (or a failure before the build) sends them home. Rank 0's
build is a Prefect flow run (`passage-forge-ddp`, the stage its task) on the configured Prefect
API, with the progress and summary artifacts of any stage. The `batch_size` of the config is
the global batch (a multiple of the number of ranks); the trained model is the same artifact
version a single-process run would register.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import tempfile
from pathlib import Path

from tasks.training.distributed import Ranks, process_group

logger = logging.getLogger("passage_forge")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.ddp", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--stage", required=True, help="a training stage: train:NAME")
    parser.add_argument("--root", help="artifact root (default: $PFORGE_HOME, else ./artifacts)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    from flows.registry import plan_for
    from tasks.config import load_config
    import torch

    from tasks.compute.device import resolve_device

    cfg = load_config(args.config)
    plan = plan_for(cfg)
    name = plan.resolve_name(args.stage)
    if not name.startswith("train:"):  # the builders that leave the writing to rank 0
        raise SystemExit(f"python -m flows.ddp: {name!r} is not a training stage (train:NAME)")
    stage = plan[name]
    with process_group(torch.device(resolve_device(stage.params.device))) as ranks:
        if not ranks.main:  # one rank's log is the run's log
            logging.getLogger().setLevel(logging.WARNING)
        if ranks.main:
            artifact = lead(plan, name, args.root, ranks, config_name=cfg.name)
            print(f"{name:18s} {artifact.version}")
        else:
            follow(plan[name], ranks)
    return 0


def lead(plan, name: str, root: str | None, ranks: Ranks, config_name: str | None = None):
    """Rank 0: build the stage into the store as `pforge run --stage` would, telling the other
    ranks when the build starts (and with which inputs). With `config_name`, as a Prefect flow
    run whose task reports to the UI like the pipeline's; without, through the engine alone."""
    from storage import ArtifactStore, resolve_root
    from tasks.engine import run_stage

    store = ArtifactStore(resolve_root(root), writable=True)
    stage = plan[name]
    started = []

    def build(params, inputs, out, *work):
        started.append(True)
        ranks.broadcast(inputs)
        return stage.build(params, inputs, out, *work)

    try:
        staged, inputs = dataclasses.replace(stage, build=build), plan.upstream_for_single_stage(store, name)
        if config_name is None:
            return run_stage(store, staged, inputs)
        return _as_flow_run(staged, config_name, store, inputs)
    finally:
        if not started:  # a cache hit or an error before the build: nothing to train
            ranks.broadcast(None)


def _as_flow_run(stage, config_name: str, store, inputs):
    """The stage's task (flows/stage_task.py: progress and summary artifacts) in a flow run."""
    from prefect import flow

    from flows.stage_task import stage_task

    @flow(name="passage-forge-ddp", flow_run_name=f"{config_name} {stage.name}", log_prints=True)
    def data_parallel():
        return stage_task(stage, config_name)(store, inputs)
    return data_parallel()


def follow(stage, ranks: Ranks) -> None:
    """Ranks 1..N-1: the same builder on rank 0's inputs, into a folder nobody registers."""
    inputs = ranks.broadcast(None)
    if inputs is None:
        return
    with tempfile.TemporaryDirectory(prefix=f"pforge-rank{ranks.rank}-") as scratch:
        out = Path(scratch) / "out"
        out.mkdir()
        work = (Path(scratch) / "work",) if stage.resumable else ()
        for folder in work:
            folder.mkdir()
        stage.build(stage.params, inputs, out, *work)


if __name__ == "__main__":
    sys.exit(main())
