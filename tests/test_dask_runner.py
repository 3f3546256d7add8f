"""Shard runners (tasks/runners.py): the encode stage's shards computed here, on a thread pool and
on a local two-worker Dask cluster (worker processes) give the same artifact, byte for byte, at
the same version; a runner resumes a half-built work folder; a bad `runner:` is refused at load."""
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from storage import ArtifactStore
from storage.shards import read_rows, shard_path
from tasks.config import ConfigError, load_config
from tasks.dense.stages import EncodeParams, EncodeSettings, Origin, _renamed, build_encode
from tasks.engine import NoParams, Stage, run_stage
from tasks.runners import RunnerConfig, run_shards

pytestmark = pytest.mark.usefixtures("flush_denormals")

WORDS = "the capital of france is paris a river flows through the city where old bridges cross it".split()


def _passages(n: int) -> pa.Table:
    texts = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(3 + (i * 5) % 17)) for i in range(n)]
    return pa.table({"pid": [f"p{i}" for i in range(n)], "doc_id": [f"d{i // 3}" for i in range(n)],
                     "title": [f"Doc {i // 3}" for i in range(n)], "text": texts})


def _encode(tmp_path, checkpoint, runner: RunnerConfig):
    """The chunk and encode stages in a store of their own: (encode artifact, its table files)."""
    from storage.parquet import write_table

    store = ArtifactStore(tmp_path / runner.kind)

    def chunk(params, inputs, out):
        write_table(out, _passages(23))

    chunked = run_stage(store, Stage("chunk", "chunk", "1", (), NoParams(), chunk), {})
    model = {"base": str(checkpoint), "shared": True, "pooling": "mean", "projection_dim": None,
             "normalize": True, "scale": 1.0}
    params = EncodeParams(system="tiny", origin=Origin(model=model), device="cpu", shard_size=6, runner=runner,
                          settings=EncodeSettings(batch_size=4, passage_max_len=32, query_max_len=16, dtype="float32",
                                                  bf16=False))
    stage = Stage("encode:tiny", "embeddings", "2", ("chunk",), params, _renamed(build_encode), resumable=True)
    artifact = _in_a_flow(store, stage, {"chunk": chunked})
    return artifact, artifact.table_files()


def _in_a_flow(store, stage, inputs):
    """As the pipeline runs a stage: a Prefect task in a flow run (the shard tasks nest in it)."""
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE

    @task(name=stage.name, cache_policy=NO_CACHE)
    def run():
        return run_stage(store, stage, inputs)

    @flow(name="dask-runner-test")
    def pipeline():
        return run()
    return pipeline()


def test_dask_and_threads_give_the_single_process_bytes(prefect_harness, tmp_path, tiny_checkpoint):
    local, local_files = _encode(tmp_path, tiny_checkpoint, RunnerConfig())
    assert len(local_files) == 4 and local.read_table().num_rows == 23  # shards of 6: 6, 6, 6, 5
    for runner in (RunnerConfig(kind="threads", workers=2), RunnerConfig(kind="dask", workers=2)):
        other, files = _encode(tmp_path, tiny_checkpoint, runner)
        assert other.version == local.version, runner.kind
        assert [f.name for f in files] == [f.name for f in local_files]
        for mine, theirs in zip(local_files, files):
            assert pq.read_table(theirs).equals(pq.read_table(mine)), (runner.kind, mine.name)
            assert theirs.read_bytes() == mine.read_bytes(), (runner.kind, mine.name)
    # each dask shard was a Prefect task run (what the UI lists)
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="encode:tiny ")))
    names = sorted(r.name for r in runs if r.state and r.state.is_completed())
    assert names == sorted([f"encode:tiny {i}/4" for i in range(1, 5)] * 2)  # threads and dask


CALLS: list[int] = []


def _shard_table(i: int) -> pa.Table:
    CALLS.append(i)
    return pa.table({"shard": [i] * 3, "pid": [os.getpid()] * 3})


def test_a_runner_computes_only_the_missing_shards(prefect_harness, tmp_path):
    from prefect import flow

    pq.write_table(pa.table({"shard": [-1], "pid": [0]}), shard_path(tmp_path, 1))  # left by a killed build
    before = shard_path(tmp_path, 1).read_bytes()
    seen = []

    @flow(name="resume-test")
    def resume():
        return run_shards(RunnerConfig(kind="threads", workers=3), tmp_path, 4, _shard_table,
                          on_shard=lambda i, reused: seen.append((i, reused)))
    files = resume()
    assert sorted(CALLS) == [0, 2, 3] and sorted(seen) == [(0, False), (1, True), (2, False), (3, False)]
    assert files == [shard_path(tmp_path, i) for i in range(4)] and shard_path(tmp_path, 1).read_bytes() == before
    assert [pq.read_table(f).column("shard")[0].as_py() for f in files] == [0, -1, 2, 3]
    assert not list(tmp_path.glob(".*.part"))


def test_a_worker_reads_only_its_rows(tmp_path):
    table = pa.table({"x": list(range(50)), "y": [str(i) for i in range(50)]})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=7)
    for start, stop in ((0, 50), (5, 23), (7, 14), (49, 50), (10, 10), (45, 60)):
        assert read_rows(tmp_path / "t.parquet", start, stop, ["x"]).equals(table.select(["x"]).slice(start, stop - start))


@pytest.mark.parametrize("runner,message", [
    ("{kind: spark}", "runner.kind: Input should be 'local', 'threads' or 'dask'"),
    ("{kind: threads, address: 'tcp://scheduler:8786'}", "set kind: dask or drop the address"),
    ("{kind: dask, address: 'scheduler 8786'}", "is not a Dask scheduler address"),
    ("{kind: dask, workers: 0}", "runner.workers: Input should be greater than or equal to 1"),
    ("{kind: dask, nodes: 3}", "runner.nodes: Extra inputs are not permitted"),
])
def test_a_bad_runner_is_refused_at_load(tmp_path, runner, message):
    path = tmp_path / "bad.yaml"
    path.write_text(f"name: bad\nrunner: {runner}\n")
    with pytest.raises(ConfigError, match="bad.yaml: invalid config") as err:
        load_config(path)
    assert message in str(err.value)


def test_a_scheduler_address_is_accepted(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("name: ok\nrunner: {kind: dask, address: 'tcp://10.0.0.5:8786'}\n")
    assert load_config(path).runner == RunnerConfig(kind="dask", address="tcp://10.0.0.5:8786", workers=2)
