"""Where a sharded stage's shards compute (the `runner:` config section): here, one after another
(`local`, the default); on a thread pool (`threads`, Prefect's ThreadPoolTaskRunner); or on Dask
workers (`dask`, prefect-dask's DaskTaskRunner: a local cluster of worker processes, or a running
scheduler's `address`). `threads` and `dask` submit one Prefect task per shard, so each shard
shows in the UI.

The runner says where, never what: it is a RUNTIME field of every sharded stage's params (no
version changes with it). Every shard computes with one torch intra-op thread count (`intra_op_threads`,
models/threads.py), here or in any worker, so on one machine the shards' bytes are the same whichever
runner computed them (tests/test_dask_runner.py); `runner_stats` records it in the artifact's stats.
Dask workers on other machines need the artifact store's folder at the same path (the models they
load and the work folder they write shards into).
"""
from __future__ import annotations

import re
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Optional, Sequence

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, model_validator

from storage.shards import Runner, build_shards
from tasks.progress import report
from models.threads import WithThreads, resolve_threads

# tcp://host:8786, tls://..., or host:port (Dask's own forms)
_ADDRESS = re.compile(r"^(?:(?:tcp|tls|ucx|ws|wss|inproc)://\S+|[^\s:/]+:\d+)$")


class RunnerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["local", "threads", "dask"] = Field(
        "local", description="where shards compute: local (in the stage's process, in order), threads (a thread "
                             "pool), dask (Dask workers: a local cluster, or the scheduler at `address`)")
    address: Optional[str] = Field(None, description="dask only: a running scheduler, e.g. tcp://scheduler:8786 "
                                                     "(empty: a local cluster of `workers` processes)")
    workers: int = Field(2, ge=1, description="threads, or the local Dask cluster's worker processes")
    intra_op_threads: Optional[int] = Field(None, ge=1, description=(
        "torch intra-op threads every shard computes with, in this process and in every worker (one count: the same "
        "float sums, so the same bytes whichever runner); empty: $PFORGE_THREADS, else this process's count. A local "
        "cluster uses workers x intra_op_threads cores"))

    @model_validator(mode="after")
    def _address(self):
        if self.address is not None and self.kind != "dask":
            raise ValueError(f"runner.address is a Dask scheduler's address; kind is {self.kind!r}: "
                             "set kind: dask or drop the address")
        if self.address is not None and not _ADDRESS.match(self.address):
            raise ValueError(f"runner.address {self.address!r} is not a Dask scheduler address "
                             "(tcp://host:port or host:port)")
        return self


LOCAL = RunnerConfig()

# ---------------------------------------------------------------- models kept per process
# A worker computes many shards: it loads a model for the first and keeps it for the rest. At
# most two are kept, so a long-lived (remote) worker does not hold every stage's model.
_KEEP = 2
_cache: "OrderedDict[Any, Any]" = OrderedDict()
_cache_lock = threading.Lock()  # held while loading: threads of one process wait for one load
_builds = 0                     # sharded builds running in this process (the cache outlives none)


def worker_cached(key: Any, load: Callable[[], Any]) -> Any:
    """`load()`, once per process for `key` (hashable: what the model is and where it runs)."""
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
        else:
            _cache[key] = load()
            while len(_cache) > _KEEP:
                _cache.popitem(last=False)
        return _cache[key]


# ---------------------------------------------------------------- runners
def _shard_task():
    from prefect import task
    from prefect.cache_policies import NO_CACHE

    # The work folder is the cache (a finished shard is never computed again): Prefect's is off.
    @task(name="shard", cache_policy=NO_CACHE, retries=0, persist_result=False)
    def shard(fn: Callable, args: tuple):
        return fn(*args)
    return shard


def _task_runner(cfg: RunnerConfig):
    if cfg.kind == "threads":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=cfg.workers)
    from prefect_dask import DaskTaskRunner

    if cfg.address:
        return DaskTaskRunner(address=cfg.address)
    # One thread per worker process: a shard is a model's forward passes (GIL-bound Python
    # between them), so processes, not threads, give the parallelism; one model per process.
    return DaskTaskRunner(cluster_kwargs={"n_workers": cfg.workers, "threads_per_worker": 1, "processes": True,
                                          "dashboard_address": None})


def prefect_runner(cfg: RunnerConfig) -> Runner:
    """A `storage.shards.Runner` submitting one Prefect task per call to `cfg`'s task runner (a
    local Dask cluster starts here and closes when the calls are done)."""
    def run(fn: Callable, calls: list[tuple], names: list[str]) -> Iterator[int]:
        from prefect.futures import as_completed

        shard = _shard_task()
        with _task_runner(cfg) as runner:
            futures = [runner.submit(shard.with_options(task_run_name=name), {"fn": fn, "args": call})
                       for call, name in zip(calls, names)]
            index = {id(f): k for k, f in enumerate(futures)}
            for future in as_completed(futures):
                future.result()  # raises the shard's error; finished shards stay for a resumed build
                yield index[id(future)]
    return run


def runner_stats(cfg: RunnerConfig | None) -> dict:
    """What a sharded stage records in its stats about where and how its shards computed."""
    cfg = cfg or LOCAL
    return {"runner": cfg.kind, "intra_op_threads": resolve_threads(cfg.intra_op_threads)}


def run_shards(cfg: RunnerConfig | None, work: Path, shards: int | Sequence[Any], compute: Callable[[Any], pa.Table],
               on_shard: Callable[[int, bool], None] | None = None, label: str = "shard") -> list[Path]:
    """`storage.shards.build_shards` on `cfg`'s runner, every shard computing with the build's
    intra-op thread count (`runner_stats`), which is part of the shard plan: a build resumed with
    another count recomputes its shards rather than mix their bytes. The models this process loaded
    for the shards (local and threads runners) are let go when the last sharded build here ends."""
    global _builds
    cfg = cfg or LOCAL
    threads = resolve_threads(cfg.intra_op_threads)
    total = shards if isinstance(shards, int) else len(shards)
    done = 0

    def reported(i: int, reused: bool) -> None:
        nonlocal done
        done += 1
        report(f"{label}: shards", done, total)  # the UI's progress, whichever runner computed it
        if on_shard is not None:
            on_shard(i, reused)
    with _cache_lock:
        _builds += 1
    try:
        return build_shards(work, shards, WithThreads(compute, threads), reported,
                            runner=None if cfg.kind == "local" else prefect_runner(cfg), label=label,
                            plan={"intra_op_threads": threads})
    finally:
        with _cache_lock:
            _builds -= 1
            if _builds == 0:
                _cache.clear()
