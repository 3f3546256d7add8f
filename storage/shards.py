"""Resumable sharded output: each finished shard is renamed into a work folder, so a killed build
that starts again at the same version computes only the shards it lacks."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq


def shard_path(work: Path, index: int) -> Path:
    return work / f"shard-{index:05d}.parquet"


def build_shards(work: Path, n_shards: int, compute: Callable[[int], pa.Table],
                 on_shard: Callable[[int, bool], None] | None = None) -> list[Path]:
    """Shard i is `compute(i)`, written once: an existing shard file is kept (a resumed build).
    `on_shard(i, reused)` reports each shard. Returns the shard files in order."""
    files = []
    for i in range(n_shards):
        path = shard_path(work, i)
        reused = path.exists()
        if not reused:
            tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
            pq.write_table(compute(i), tmp)
            os.replace(tmp, path)  # a shard is there whole or not at all
        files.append(path)
        if on_shard is not None:
            on_shard(i, reused)
    return files


def move_shards_into(files: list[Path], out: Path) -> None:
    """The finished shards become the artifact's default table (data/part-XXXXX.parquet)."""
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    for i, f in enumerate(files):
        shutil.copyfile(f, data / f"part-{i:05d}.parquet")
