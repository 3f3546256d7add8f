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
    assert len(work) == 1 and sorted(f.name for f in work[0].iterdir()) == ["plan.sha256", "shard-00000.parquet",
                                                                        "shard-00001.parquet"]

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


def test_a_build_resumed_with_another_partition_recomputes_instead_of_mixing_shards(tmp_path, caplog):
    """A runtime shard size leaves the version alone, so a killed build may resume with another
    one: the old partition's shards must not be taken for the new one's."""
    rows = list(range(10))
    computed = []

    def compute(spec):
        start, stop = spec
        if start >= 6 and fail["on"]:
            raise KeyboardInterrupt("killed")
        computed.append(spec)
        return pa.table({"row": rows[start:stop]})

    def partition(size):
        return [(s, min(s + size, len(rows))) for s in range(0, len(rows), size)]

    def rows_of(files):
        return pa.concat_tables([pq.read_table(f) for f in files]).column("row").to_pylist()

    fail = {"on": True}
    with pytest.raises(KeyboardInterrupt):
        build_shards(tmp_path, partition(3), compute)  # shards 0-2 and 3-5 finished
    fail["on"] = False
    computed.clear()
    with caplog.at_level("WARNING", logger="passage_forge"):
        files = build_shards(tmp_path, partition(4), compute)
    assert rows_of(files) == rows and computed == partition(4)
    assert "2 finished shards" in caplog.text and "another shard plan" in caplog.text
    computed.clear()
    assert rows_of(build_shards(tmp_path, partition(4), compute)) == rows and computed == []  # same plan: all reused
    # the tables a rerank shard carries count by their rows, not by their (truncated) repr
    from storage.shards import plan_fingerprint

    long = pa.table({"x": list(range(100))})
    edited = pa.table({"x": list(range(99)) + [-1]})
    assert plan_fingerprint([(0, long)]) != plan_fingerprint([(0, edited)])
    assert plan_fingerprint([(0, long)]) == plan_fingerprint([(0, pa.table({"x": list(range(100))}))])
