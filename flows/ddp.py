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

`pforge run CONFIG --stage train:NAME --nproc N` launches torchrun (`launch`). Rank 0 alone watches
the Prefect server (flows/server_watchdog.py): its flow run is the only one that talks to it. When
the server dies, rank 0 hands its one line to the launching `pforge` process, which ends the whole
run as a single-process run ends: torchrun frozen, then killed without a word (stopping the ranks
under it, it would report their end as its own failure, with a traceback), rank 0 killed, the
other ranks and what the ranks started stopped, then the line, exit 2. Under torchrun alone, rank
0 ends itself with the line and torchrun stops the other ranks its way. Either way the other
ranks, stopped by SIGTERM, remove their scratch folders and exit without a traceback. The launched
run's temporary files (its TMPDIR, torchrun's own files among them) are in one folder, which the
launcher removes when the run ends or is ended so (a signal to `pforge` stops the run without it:
a small folder is left).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from flows import interrupts
from flows.server_watchdog import EXIT_CODE, stopping_if_the_server_dies
from storage.atomic import atomic_write_text

if TYPE_CHECKING:  # torch: imported by the ranks, never by the launching `pforge`
    from tasks.training.distributed import Ranks

logger = logging.getLogger("passage_forge")
STOP_REQUEST = "PFORGE_DDP_STOP_REQUEST"  # set by `launch`: the file rank 0 writes its stop line to
REQUEST_POLL_S = 0.2    # how often `launch` looks for it
UNANSWERED_S = 10.0     # a request still running after this (its launcher gone): rank 0 ends itself


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.ddp", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--stage", required=True, help="a training stage: train:NAME")
    parser.add_argument("--root", help="artifact root (default: $PFORGE_HOME, else ./artifacts)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per Prefect API call otherwise, as in `pforge`

    from flows.registry import plan_for
    from tasks.config import load_config
    import torch

    from tasks.compute.device import resolve_device
    from tasks.training.distributed import process_group

    cfg = load_config(args.config)
    plan = plan_for(cfg)
    name = plan.resolve_name(args.stage)
    if not name.startswith("train:"):  # the builders that leave the writing to rank 0
        raise SystemExit(f"python -m flows.ddp: {name!r} is not a training stage (train:NAME)")
    stage = plan[name]
    with process_group(torch.device(resolve_device(stage.params.device))) as ranks, watching_the_server(ranks):
        if not ranks.main:  # one rank's log is the run's log
            logging.getLogger().setLevel(logging.WARNING)
        if ranks.main:
            # As in `pforge`: Prefect's log worker reports each failed write on the terminal while
            # its server is unreachable; the watchdog's one line says what happened instead.
            logging.raiseExceptions = False
            artifact = lead(plan, name, args.root, ranks, config_name=cfg.name)
            print(f"{name:18s} {artifact.version}")
        else:
            follow(plan[name], ranks)
    return 0


# -- the Prefect server dying ------------------------------------------------------------------
def watching_the_server(ranks: Ranks) -> contextlib.AbstractContextManager:
    """This rank's watch on the Prefect server: rank 0's, whose flow run is the one that talks to
    it (ending the run as the module's notes say); none on the other ranks, which run no flow."""
    if not ranks.main:
        return contextlib.nullcontext()
    return stopping_if_the_server_dies(end=_end_run_from_rank_zero)


def _end_run_from_rank_zero(line: str) -> None:
    request = os.environ.get(STOP_REQUEST)
    if request:
        atomic_write_text(request, json.dumps({"pid": os.getpid(), "line": line}))  # the launcher reads it whole
        time.sleep(UNANSWERED_S)  # the launcher stops this process meanwhile
    interrupts.end_process(line, EXIT_CODE)


def torchrun_command(nproc: int, module: str, *args: str) -> list[str]:
    """torchrun, on one machine (a local rendezvous on a free port), running `python -m MODULE ARGS` on `nproc` ranks."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
            "-m", module, *args]


def launch(command: list[str], cwd: Path) -> int:
    """Runs torchrun's `command` and returns its exit code; in a `pforge` process (one that ends
    itself on a signal: flows/interrupts.py), ends the run instead when rank 0 asks (its server
    died: see the module's notes). A caller's own process (a test's) is never ended."""
    if not interrupts.installed():
        return subprocess.run(command, cwd=cwd).returncode
    # The run's temporary files (torchrun's own among them, which a stopped torchrun cannot remove)
    # go in one folder, removed once the run is over; rank 0's request too.
    folder = Path(tempfile.mkdtemp(prefix="pforge-ddp-"))
    request = folder / "stop"
    try:
        torchrun = subprocess.Popen(command, cwd=cwd, env={**os.environ, "TMPDIR": str(folder),
                                                           STOP_REQUEST: str(request)})
        while True:
            try:
                return torchrun.wait(timeout=REQUEST_POLL_S)
            except subprocess.TimeoutExpired:
                if request.is_file():
                    _end_ranks(torchrun, json.loads(request.read_text(encoding="utf-8")), folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _end_ranks(torchrun: subprocess.Popen, request: dict, folder: Path) -> None:
    import psutil

    try:
        launched = psutil.Process(torchrun.pid).children(recursive=True)  # the ranks (each in a session of its own)
    except psutil.Error:
        launched = []
    torchrun.send_signal(signal.SIGSTOP)  # frozen: it neither restarts nor reports the ranks it loses
    # Rank 0 has nothing to clean (its build folder is a leftover the next start removes), and on
    # SIGTERM Prefect's engine would report the flow run crashed, in vain, to the server that is gone.
    for process in launched:
        if process.pid == request["pid"]:
            with contextlib.suppress(psutil.Error):
                process.kill()
    interrupts.stop_processes([p for p in launched if p.pid != request["pid"]], interrupts.CHILD_GRACE_S)
    torchrun.kill()
    torchrun.wait()
    shutil.rmtree(folder, ignore_errors=True)  # end_process exits at once: no finally runs
    interrupts.end_process(request["line"], EXIT_CODE)


# -- the ranks ---------------------------------------------------------------------------------
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
    with _scratch_folder(ranks.rank) as scratch:
        out = scratch / "out"
        out.mkdir()
        work = (scratch / "work",) if stage.resumable else ()
        for folder in work:
            folder.mkdir()
        stage.build(stage.params, inputs, out, *work)


@contextlib.contextmanager
def _scratch_folder(rank: int) -> Iterator[Path]:
    """A temporary folder, removed however the block ends: on SIGTERM too (with which torchrun, or
    `pforge run --nproc`, stops the other ranks once one has ended), then the process exits at
    once, without a traceback (128 + SIGTERM, as the shell reports it)."""
    folder = Path(tempfile.mkdtemp(prefix=f"pforge-rank{rank}-"))

    def stop(signum, frame):
        shutil.rmtree(folder, ignore_errors=True)
        os._exit(128 + signum)
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield folder
    finally:
        signal.signal(signal.SIGTERM, previous)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
