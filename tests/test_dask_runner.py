"""Shard runners (tasks/runners.py): the encode stage's shards computed here, on a thread pool and
on a local two-worker Dask cluster (worker processes) give the same artifact, byte for byte, at
the same version, since every shard computes with the same pinned intra-op thread count (recorded
in the stats); a runner resumes a half-built work folder; a bad `runner:` is refused at load."""
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from storage import ArtifactStore
from storage.shards import PLAN, plan_fingerprint, read_rows, shard_path
from tasks.compute.encode import EncodeParams, EncodeSettings
from tasks.compute.origin import Origin
from tasks.config import ConfigError, load_config
from tasks.dense.stages import _renamed, build_encode
from tasks.engine import NoParams, Stage, run_stage
from tasks.runners import RunnerConfig, run_shards
from models.threads import ENV as THREADS_ENV
from models.threads import resolve_threads

# No flush_denormals here: torch.set_flush_denormal sets the calling thread's MXCSR only, so the
# local runner (shards in this thread) would flush subnormals that the threads runner's pool
# threads and Dask's workers keep, and the byte comparisons would depend on which thread got which
# chunk of an op (a rare failure of the threads comparison, seen once in CI).

WORDS = "the capital of france is paris a river flows through the city where old bridges cross it".split()


def _passages(n: int) -> pa.Table:
    texts = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(3 + (i * 5) % 17)) for i in range(n)]
    return pa.table({"pid": [f"p{i}" for i in range(n)], "doc_id": [f"d{i // 3}" for i in range(n)],
                     "title": [f"Doc {i // 3}" for i in range(n)], "text": texts})


def _encode(tmp_path, checkpoint, runner: RunnerConfig, runtime: str = "torch"):
    """The chunk and encode stages in a store of their own: (encode artifact, its table files)."""
    from storage.parquet import write_table

    store = ArtifactStore(tmp_path / f"{runner.kind}-{runtime}")

    def chunk(params, inputs, out):
        write_table(out, _passages(23))

    chunked = run_stage(store, Stage("chunk", "chunk", "1", (), NoParams(), chunk), {})
    model = {"base": str(checkpoint), "shared": True, "pooling": "mean", "projection_dim": None,
             "normalize": True, "scale": 1.0}
    params = EncodeParams(system="tiny", origin=Origin(model=model), device="cpu", shard_size=6, runner=runner,
                          settings=EncodeSettings(batch_size=4, passage_max_len=32, query_max_len=16, dtype="float32",
                                                  bf16=False, runtime=runtime))
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


def _completed_shard_runs(prefix: str) -> list[str]:
    """Names of the completed shard task runs (what the UI lists) whose name starts with `prefix`."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_=prefix)))
    return sorted(r.name for r in runs if r.state and r.state.is_completed() and r.name.startswith(prefix))


def test_dask_and_threads_give_the_single_process_bytes(prefect_harness, tmp_path, tiny_checkpoint):
    local, local_files = _encode(tmp_path, tiny_checkpoint, RunnerConfig())
    assert len(local_files) == 4 and local.read_table().num_rows == 23  # shards of 6: 6, 6, 6, 5
    # the thread count every shard computed with: this process's (Dask's workers would take 1)
    threads = resolve_threads()
    assert local.manifest["stats"]["intra_op_threads"] == threads and local.manifest["stats"]["runner"] == "local"
    for runner in (RunnerConfig(kind="threads", workers=2), RunnerConfig(kind="dask", workers=2)):
        other, files = _encode(tmp_path, tiny_checkpoint, runner)
        assert other.version == local.version, runner.kind
        assert other.manifest["stats"]["intra_op_threads"] == threads and other.manifest["stats"]["runner"] == runner.kind
        assert [f.name for f in files] == [f.name for f in local_files]
        for mine, theirs in zip(local_files, files):
            # the same bytes: every shard computed with the same pinned count (the CTranslate2
            # tests before this one once left OpenMP's count at 1 and MKL's at 2 in this thread)
            assert pq.read_table(theirs).equals(pq.read_table(mine)), (runner.kind, mine.name)
            assert theirs.read_bytes() == mine.read_bytes(), (runner.kind, mine.name)
    # each shard was a Prefect task run (what the UI lists)
    assert _completed_shard_runs("encode:tiny ") == sorted([f"encode:tiny {i}/4" for i in range(1, 5)] * 2)


def test_onnx_encoding_gives_the_single_process_bytes_on_dask(prefect_harness, tmp_path, tiny_checkpoint):
    """ONNX Runtime sessions take torch's pinned intra-op thread count, so Dask's workers (which
    would compute with 1) write the bytes this process writes."""
    local, local_files = _encode(tmp_path, tiny_checkpoint, RunnerConfig(), runtime="onnx")
    assert local.manifest["stats"]["runtime"] == "onnx" and local.manifest["stats"]["reference"]["min_cosine"] > 0.9999
    other, files = _encode(tmp_path, tiny_checkpoint, RunnerConfig(kind="dask", workers=2), runtime="onnx")
    assert other.version == local.version
    for mine, theirs in zip(local_files, files, strict=True):
        assert theirs.read_bytes() == mine.read_bytes(), mine.name


CALLS: list[int] = []


def _shard_table(i: int) -> pa.Table:
    CALLS.append(i)
    return pa.table({"shard": [i] * 3, "pid": [os.getpid()] * 3})


def test_a_runner_computes_only_the_missing_shards(prefect_harness, tmp_path):
    from prefect import flow

    pq.write_table(pa.table({"shard": [-1], "pid": [0]}), shard_path(tmp_path, 1))  # left by a killed build
    (tmp_path / PLAN).write_text(plan_fingerprint(4, {"intra_op_threads": 3}))  # ... of the same four shards
    before = shard_path(tmp_path, 1).read_bytes()
    seen = []

    @flow(name="resume-test")
    def resume():
        return run_shards(RunnerConfig(kind="threads", workers=3, intra_op_threads=3), tmp_path, 4, _shard_table,
                          on_shard=lambda i, reused: seen.append((i, reused)))
    files = resume()
    assert sorted(CALLS) == [0, 2, 3] and sorted(seen) == [(0, False), (1, True), (2, False), (3, False)]
    assert files == [shard_path(tmp_path, i) for i in range(4)] and shard_path(tmp_path, 1).read_bytes() == before
    assert [pq.read_table(f).column("shard")[0].as_py() for f in files] == [0, -1, 2, 3]
    assert not list(tmp_path.glob(".*.part"))


def _threads_table(i: int) -> pa.Table:
    """A shard that reports the torch intra-op thread count it computed with."""
    import torch

    return pa.table({"shard": [i], "threads": [torch.get_num_threads()]})


def _threads_of(files) -> list[int]:
    return [pq.read_table(f).column("threads")[0].as_py() for f in files]


def test_every_worker_computes_with_the_pinned_thread_count(prefect_harness, tmp_path, monkeypatch):
    """Dask's nanny starts its workers with OMP_NUM_THREADS=1 and torch counts threads per OS
    thread: each shard pins the build's count itself, and this process gets its own back."""
    import torch
    from prefect import flow

    before = torch.get_num_threads()
    monkeypatch.setenv(THREADS_ENV, "3")  # the default when the config names no count

    @flow(name="threads-test")
    def shards(runner, folder):
        (tmp_path / folder).mkdir()
        return run_shards(runner, tmp_path / folder, 4, _threads_table)
    assert _threads_of(shards(RunnerConfig(kind="dask", workers=2), "dask")) == [3] * 4
    assert _threads_of(shards(RunnerConfig(kind="threads", workers=2, intra_op_threads=2), "threads")) == [2] * 4
    assert _threads_of(run_shards(RunnerConfig(intra_op_threads=1), tmp_path, 2, _threads_table)) == [1] * 2
    assert torch.get_num_threads() == before


def test_a_build_resumed_with_another_thread_count_recomputes_its_shards(tmp_path):
    """Another count gives other last bits: its shards are not mixed with the earlier ones'."""
    CALLS.clear()
    for threads, computed in ((1, [0, 1]), (2, [0, 1]), (2, [])):
        files = run_shards(RunnerConfig(intra_op_threads=threads), tmp_path, 2, _shard_table)
        assert sorted(CALLS) == computed and len(files) == 2, threads
        CALLS.clear()


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_bad_thread_count_in_the_environment_is_one_clear_error(monkeypatch, value):
    monkeypatch.setenv(THREADS_ENV, value)
    with pytest.raises(ValueError, match=rf"^\${THREADS_ENV}='{value}': expected a whole number of torch threads"):
        resolve_threads()
    assert resolve_threads(2) == 2  # a configured count needs no default


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
    ("{kind: dask, intra_op_threads: 0}", "runner.intra_op_threads: Input should be greater than or equal to 1"),
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


def _toy_text(i: int, stride: int, n: int) -> str:
    """Words the tiny checkpoint's vocabulary knows (a cross-encoder tells these texts apart)."""
    from tests.tiny_models import WORDS as VOCAB_WORDS

    return " ".join(VOCAB_WORDS[(i * stride + k) % len(VOCAB_WORDS)] for k in range(n))


def _mining_store(root):
    """What dense mining reads, as artifacts: questions (two splits), passages, gold links, the
    miner's passage vectors (three files) and its question vectors."""
    from storage.parquet import write_table
    from storage.shards import move_shards_into, write_shard
    from tasks.compute.embeddings import embeddings_table, query_vectors_table
    from tasks.compute.search import QUERY_VECTORS

    rng = np.random.default_rng(5)
    pids = [f"p{i}" for i in range(41)]
    qids = [f"q{i}" for i in range(23)]
    passage_vectors = rng.standard_normal((41, 8)).astype(np.float32)
    store = ArtifactStore(root)

    def made(name, write):
        def build(params, inputs, out):
            write(out)
        return run_stage(store, Stage(name, name.split(":")[0], "1", (), NoParams(), build), {})

    def encoded(out):
        parts = [write_shard(out / f"part{k}.parquet", embeddings_table(pids[a:b], passage_vectors[a:b]))
                 for k, (a, b) in enumerate(((0, 15), (15, 30), (30, 41)))]
        move_shards_into(parts, out)
        for p in parts:
            p.unlink()
    return {
        "ingest_questions": made("ingest_questions", lambda out: write_table(out, pa.table({
            "qid": qids, "question": [_toy_text(i, 3, 3) for i in range(23)], "answers": [[] for _ in qids],
            "split": ["train"] * 19 + ["test"] * 4}), name="questions")),
        "chunk": made("chunk", lambda out: write_table(out, pa.table({"pid": pids, "text": [_toy_text(j, 5, 4) for j in range(41)]}))),
        "link_gold": made("link_gold", lambda out: write_table(out, pa.table({"qid": qids, "pid": pids[:23]}))),
        "encode:fine": made("encode:fine", encoded),
        "search:fine": made("search:fine", lambda out: write_table(
            out, query_vectors_table(qids, rng.standard_normal((23, 8)).astype(np.float32)), name=QUERY_VECTORS)),
    }, store


def test_dense_mining_in_question_shards_on_dask_gives_the_single_pass_bytes(prefect_harness, tmp_path, monkeypatch):
    from tasks.compute.embeddings import vectors_from_table
    from tasks.negatives import stages
    from tasks.negatives.mining import dense_candidates
    from tasks.negatives.stages import MineParams, build_mined_negatives

    monkeypatch.setattr(stages, "QUERY_BLOCK", 4)  # the job carries it to the workers: shards of 4 and 8 questions

    results = {}
    for name, runner, per_shard in (("local", RunnerConfig(), 16384), ("threads", RunnerConfig(kind="threads"), 9),
                                    ("dask", RunnerConfig(kind="dask", workers=2), 4)):
        inputs, store = _mining_store(tmp_path / name)
        params = MineParams(strategy="fine", source="search:fine", depth=6, filter_answers=True, splits=["train"],
                            match_type="string", shard_size=10, questions_per_shard=per_shard, runner=runner)
        stage = Stage("negatives:fine", "negatives", "3", tuple(inputs), params, build_mined_negatives,
                      variant={"strategy": "fine"}, resumable=True)
        results[name] = _in_a_flow(store, stage, inputs)
    local = results["local"]
    mined = local.read_table()
    # the single pass over all passage vectors, gold dropped: what the shards together must give
    qids, queries = vectors_from_table(inputs["search:fine"].read_table("query_vectors"))
    pids, passages = vectors_from_table(inputs["encode:fine"].read_table())
    expected = [(q, p, r) for q, p, r, _ in dense_candidates(qids[:19], queries[:19], [(pids, passages)], 6)
                if p != f"p{q[1:]}"]
    assert list(zip(*(mined.column(c).to_pylist() for c in ("qid", "pid", "rank")))) == expected
    assert 19 * 5 <= len(expected) < 19 * 6  # some questions' gold passage was among their top 6
    for name in ("threads", "dask"):
        assert results[name].version == local.version, name
        assert results[name].read_table().equals(mined), name  # scores too, to the bit
        assert [f.read_bytes() for f in results[name].table_files()] == [f.read_bytes() for f in local.table_files()]
    assert local.manifest["stats"]["filtering"]["candidates"] == 19 * 6
    assert {results[name].manifest["stats"]["intra_op_threads"] for name in results} == {resolve_threads()}
    # 19 questions: threads in shards of 8 (9 rounded down to the block), dask in shards of 4
    assert _completed_shard_runs("negatives:fine ") == sorted([f"negatives:fine {i}/3" for i in range(1, 4)] + [f"negatives:fine {i}/5" for i in range(1, 6)])


def test_the_cross_encoder_judge_of_mined_negatives_scores_in_shards_on_dask(prefect_harness, tmp_path, checkpoint):
    from models.cross_encoder import CrossEncoderModel
    from tasks.negatives.stages import MineParams, build_mined_negatives

    model = CrossEncoderModel.from_base(str(checkpoint), max_length=24)
    folder = tmp_path / "cross_encoder"
    model.save_pretrained(folder)
    # a threshold at the median p of every candidate the judge could see: about half are dropped
    p = model.score([(_toy_text(i, 3, 3), _toy_text(j, 5, 4)) for i in range(19) for j in range(41)])
    threshold = float(np.median(p))
    results = {}
    for name, runner, per_shard in (("local", RunnerConfig(), 20000), ("dask", RunnerConfig(kind="dask", workers=2), 7)):
        inputs, store = _mining_store(tmp_path / name)

        def classifier(params, inputs, out):
            CrossEncoderModel.from_pretrained(folder).save_pretrained(out / "model")
        inputs["cross_encoder"] = run_stage(store, Stage("cross_encoder", "cross_encoder", "1", (), NoParams(), classifier), {})
        params = MineParams(strategy="fine", source="search:fine", depth=6, filter_answers=True, splits=["train"],
                            match_type="string", drop_relevant_above=threshold, judge_shard_size=per_shard, runner=runner)
        stage = Stage("negatives:fine", "negatives", "3", tuple(inputs), params, build_mined_negatives,
                      variant={"strategy": "fine"}, resumable=True)
        results[name] = _in_a_flow(store, stage, inputs)
    local, dask = results["local"], results["dask"]
    dropped = local.manifest["stats"]["filtering"]["dropped_relevant"]
    judged = local.manifest["stats"]["filtering"]["candidates"] - local.manifest["stats"]["filtering"]["dropped_gold"]
    shards = -(-judged // 7)
    assert _completed_shard_runs("negatives:fine: judge ") == sorted(f"negatives:fine: judge {i}/{shards}"
                                                                      for i in range(1, shards + 1))
    assert 20 < dropped < 90 and dask.manifest["stats"]["filtering"] == local.manifest["stats"]["filtering"]
    assert dask.version == local.version and dask.read_table().equals(local.read_table())


def test_the_refresh_reencodes_changed_passages_in_shards_on_dask(prefect_harness, tmp_path, tiny_checkpoint):
    from storage.parquet import write_table
    from tasks.compute.embeddings import embeddings_table, vectors_from_table
    from tasks.refresh.stages import build_vectors

    old = _passages(23)
    new = pa.concat_tables([old.filter(pa.compute.not_equal(old.column("pid"), "p5")), _passages(32).slice(30)])
    new = new.set_column(3, "text", pa.array([t + (" seine" if p == "p3" else "")
                                              for p, t in zip(new.column("pid").to_pylist(), new.column("text").to_pylist())]))
    model = {"base": str(tiny_checkpoint), "shared": True, "pooling": "mean", "projection_dim": None,
             "normalize": True, "scale": 1.0}
    results = {}
    for runner in (RunnerConfig(), RunnerConfig(kind="dask", workers=2)):
        store = ArtifactStore(tmp_path / runner.kind)

        def made(name, table):
            def build(params, inputs, out):
                write_table(out, table)
            return run_stage(store, Stage(name, name, "1", (), NoParams(), build), {})
        inputs = {"previous": made("embeddings", embeddings_table(old.column("pid").to_pylist(), np.zeros((23, 32), np.float32))),
                  "previous_passages": made("passages_old", old), "passages": made("passages", new)}
        params = EncodeParams(system="tiny", origin=Origin(model=model), device="cpu", shard_size=1, runner=runner,
                              settings=EncodeSettings(batch_size=4, passage_max_len=32, query_max_len=16, dtype="float32",
                                                      bf16=False))
        stage = Stage("refresh:embeddings", "embeddings", "refresh-1", tuple(inputs), params, build_vectors, resumable=True)
        results[runner.kind] = _in_a_flow(store, stage, inputs)
    local, dask = results["local"], results["dask"]
    assert local.manifest["stats"]["reencoded"] == 3 and local.manifest["stats"]["carried_over"] == 21
    assert dask.version == local.version and dask.read_table().equals(local.read_table())
    assert dask.manifest["stats"]["intra_op_threads"] == local.manifest["stats"]["intra_op_threads"] == resolve_threads()
    assert dask.manifest["stats"]["runner"] == "dask"
    pids, vectors = vectors_from_table(local.read_table())
    fresh = [i for i, p in enumerate(pids) if p in ("p3", "p30", "p31")]
    assert np.count_nonzero(np.abs(vectors).sum(axis=1)) == 3 and np.abs(vectors[fresh]).sum(axis=1).min() > 0
    assert _completed_shard_runs("refresh:embeddings:tiny ") == [f"refresh:embeddings:tiny {i}/3" for i in range(1, 4)]
