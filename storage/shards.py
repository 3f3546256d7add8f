"""Resumable sharded output: each finished shard is renamed into a work folder, so a killed build
that starts again at the same version computes only the shards it lacks.

Shards may compute anywhere: `build_shards` takes a `runner` (tasks/runners.py makes one from the
config) that runs `compute_shard` calls in threads or on other processes. Whoever computes a shard
writes it, whole, into the work folder; the build lists the files in shard order, so the output
is the same bytes whichever runner ran it (where every shard computes with the same thread count:
tasks/runners.py pins it).

A work folder belongs to one shard plan (the shard inputs, and whatever else the caller says
the shards' bytes depend on, such as the intra-op thread count they computed with): a build
resumed with another plan (a changed runtime `shard_size` or thread count) discards the old shards
instead of mixing them in."""
from __future__ import annotations

import hashlib
import logging
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from .atomic import atomic_path, atomic_write_text

#: runner(fn, calls, names): runs fn(*call) for each call (names label them, e.g. in the UI) and
#: yields each call's index as it finishes; a failed call raises.
Runner = Callable[[Callable, list[tuple], list[str]], Iterator[int]]

PLAN = "plan.sha256"  # in the work folder: the fingerprint of the shard inputs its shards were made from
logger = logging.getLogger("passage_forge")


def shard_path(work: Path, index: int) -> Path:
    return work / f"shard-{index:05d}.parquet"


def write_shard(path: Path, table: pa.Table) -> Path:
    # a unique temporary: shards of one build may be written by threads of one process
    with atomic_path(path) as tmp:  # a shard is there whole or not at all
        pq.write_table(table, tmp)
    return path


def compute_shard(compute: Callable[[Any], pa.Table], spec: Any, path: Path) -> Path:
    """What a runner runs for one shard (in any process): compute its table and write it."""
    return write_shard(path, compute(spec))


def _digest(value: Any, h) -> None:
    """Feed `value` to the hash `h`, tagged by kind (Arrow tables by their rows, not their repr,
    which is a preview)."""
    if isinstance(value, (tuple, list)):
        h.update(b"(%d" % len(value))
        for v in value:
            _digest(v, h)
        h.update(b")")
    elif isinstance(value, dict):
        _digest(list(value.items()), h)
    elif isinstance(value, (pa.Table, pa.RecordBatch)):
        h.update(b"table")
        _digest([value.schema.names, [value.column(i).to_pylist() for i in range(value.num_columns)]], h)
    else:
        h.update(type(value).__name__.encode() + b":" + repr(value).encode() + b";")


def plan_fingerprint(specs: int | Sequence[Any], extra: Any = None) -> str:
    """What a work folder's shards were computed from: the shard count and every shard's input
    (and `extra`, the other things their bytes depend on, when given)."""
    h = hashlib.sha256()
    _digest(specs if isinstance(specs, int) else list(specs), h)
    if extra is not None:
        _digest(extra, h)
    return h.hexdigest()


def _adopt_plan(work: Path, specs: int | Sequence[Any], label: str, extra: Any = None) -> None:
    """Keep the finished shards only if they were made from this plan; otherwise (a resumed
    build whose partition or thread count changed, or shards of unknown origin) remove them first."""
    plan = work / PLAN
    fingerprint = plan_fingerprint(specs, extra)
    if plan.exists() and plan.read_text() == fingerprint:
        return
    stale = sorted(work.glob("shard-*.parquet"))
    if stale:
        logger.warning("%s: %d finished shards in %s were made from another shard plan (a changed shard size or "
                       "thread count?): "
                       "recomputing them", label, len(stale), work)
        for f in stale:
            f.unlink()
    atomic_write_text(plan, fingerprint)


def build_shards(work: Path, shards: int | Sequence[Any], compute: Callable[[Any], pa.Table],
                 on_shard: Callable[[int, bool], None] | None = None, runner: Runner | None = None,
                 label: str = "shard", plan: Any = None) -> list[Path]:
    """Shard i is `compute(i)` (`shards` a count) or `compute(shards[i])` (each shard's own input),
    written once: an existing shard file of the same plan is kept (a resumed build). Without a runner the shards
    compute here, in order. With one, `compute` and the shard inputs travel to its workers, so
    they are picklable and small: a module-level function (or a partial of one) that loads its
    model once per process, and the shard's own rows. `on_shard(i, reused)` reports each shard
    (with a runner, as it finishes). `plan` (e.g. the thread count) joins the shard inputs in the
    plan a resumed build must match. Returns the shard files in order."""
    _adopt_plan(work, shards, label, plan)
    specs = range(shards) if isinstance(shards, int) else shards
    files = [shard_path(work, i) for i in range(len(specs))]
    if runner is None:
        for i, path in enumerate(files):
            reused = path.exists()
            if not reused:
                write_shard(path, compute(specs[i]))
            if on_shard is not None:
                on_shard(i, reused)
        return files
    todo = [i for i, path in enumerate(files) if not path.exists()]
    if on_shard is not None:
        for i in sorted(set(range(len(files))) - set(todo)):
            on_shard(i, True)
    if todo:
        calls = [(compute, specs[i], files[i]) for i in todo]
        names = [f"{label} {i + 1}/{len(files)}" for i in todo]
        for k in runner(compute_shard, calls, names):
            if on_shard is not None:
                on_shard(todo[k], False)
    return files


def read_rows(path: Path, start: int, stop: int, columns: list[str] | None = None) -> pa.Table:
    """Rows [start, stop) of a Parquet file, reading only the row groups that hold them (a
    worker reads its own shard of a large table)."""
    f = pq.ParquetFile(path, pre_buffer=False)
    groups, offset, first = [], 0, 0
    for g in range(f.metadata.num_row_groups):
        n = f.metadata.row_group(g).num_rows
        if offset < stop and offset + n > start:
            first = offset if not groups else first
            groups.append(g)
        offset += n
    if not groups:
        return f.schema_arrow.empty_table().select(columns) if columns else f.schema_arrow.empty_table()
    return f.read_row_groups(groups, columns=columns).slice(start - first, stop - start)


def move_shards_into(files: list[Path], out: Path) -> None:
    """The finished shards become the artifact's default table (data/part-XXXXX.parquet)."""
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    for i, f in enumerate(files):
        shutil.copyfile(f, data / f"part-{i:05d}.parquet")
