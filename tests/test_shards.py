"""Resumable sharded builds: finished shards survive a killed build and are not computed again;
the work folder goes once the artifact is committed."""
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from storage import ArtifactStore
from storage.shards import build_shards, move_shards_into
from tasks.engine import Stage, StageParams, run_stage


class Params(StageParams):
    n_shards: int


def test_a_killed_build_resumes_at_the_next_shard(tmp_path):
    store = ArtifactStore(tmp_path / "store")
    computed, fail_at = [], {"shard": 2}

    def compute(i):
        if i == fail_at["shard"]:
            raise KeyboardInterrupt("killed")  # the build dies mid-way
        computed.append(i)
        return pa.table({"shard": [i, i]})

    def build(params, inputs, out, work):
        move_shards_into(build_shards(work, params.n_shards, compute), out)
        return {"stats": {"shards": params.n_shards}}

    stage = Stage("synthetic_queries", "synthetic_queries", "1", (), Params(n_shards=4), build, resumable=True)
    with pytest.raises(KeyboardInterrupt):
        run_stage(store, stage, {})
    assert computed == [0, 1] and store.list_artifacts() == []
    work = [p for p in (tmp_path / "store" / "synthetic_queries").iterdir() if p.name.startswith(".work-")]
    assert len(work) == 1 and sorted(f.name for f in work[0].iterdir()) == ["shard-00000.parquet", "shard-00001.parquet"]

    fail_at["shard"] = None
    artifact = run_stage(ArtifactStore(tmp_path / "store"), stage, {})  # reopening keeps the work folder
    assert computed == [0, 1, 2, 3]  # shards 0 and 1 were not computed again
    assert artifact.read_table().column("shard").to_pylist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert not work[0].exists()  # scratch removed after the commit


def test_a_partly_written_shard_is_never_taken_for_a_finished_one(tmp_path):
    (tmp_path / ".shard-00000.parquet.123.part").write_bytes(b"half")  # a write cut short
    files = build_shards(tmp_path, 1, lambda i: pa.table({"x": [i]}))
    assert [f.name for f in files] == ["shard-00000.parquet"]
    assert pq.read_table(files[0]).column("x").to_pylist() == [0]
