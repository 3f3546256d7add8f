"""Artifact store: versions, cache, atomic commit, crash recovery, concurrency, catalog views."""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pyarrow as pa
import pytest

from storage import Artifact, ArtifactStore, ParquetTableWriter, resolve_root, write_table
from tests.test_storage_helpers import spawn

SCHEMA = pa.schema([("pid", pa.int64()), ("text", pa.string())])


def rows_build(n: int, calls: list | None = None, name: str | None = None):
    def build(tmp: Path):
        if calls is not None:
            calls.append(tmp)
        write_table(tmp, pa.table({"pid": pa.array(range(n), pa.int64()),
                                   "text": [f"t{i}" for i in range(n)]}, schema=SCHEMA), name=name)
        return {"stats": {"n": n}}
    return build


@pytest.fixture
def store(tmp_path):
    return ArtifactStore(tmp_path / "root")


# -- versions ------------------------------------------------------------------------------
def test_version_deterministic_and_sensitive(store):
    base = store.version_for("passages", "1", {"words": 100, "lang": "en"}, {"docs": "abc"})
    assert len(base) == 16 and int(base, 16) >= 0
    # Key order does not matter; the same inputs give the same version.
    assert store.version_for("passages", "1", {"lang": "en", "words": 100}, {"docs": "abc"}) == base
    assert store.version_for("passages", "1", {"words": 101, "lang": "en"}, {"docs": "abc"}) != base
    assert store.version_for("passages", "1", {"words": 100, "lang": "en"}, {"docs": "abd"}) != base
    assert store.version_for("passages", "2", {"words": 100, "lang": "en"}, {"docs": "abc"}) != base
    assert store.version_for("other", "1", {"words": 100, "lang": "en"}, {"docs": "abc"}) != base


def test_version_stable_across_store_instances(tmp_path):
    a = ArtifactStore(tmp_path / "a").version_for("s", "1", {"k": [1, 2]}, {})
    b = ArtifactStore(tmp_path / "b").version_for("s", "1", {"k": (1, 2)}, {})
    assert a == b


# -- materialize / cache -------------------------------------------------------------------------
def test_materialize_then_cache_hit_skips_build(store):
    calls: list = []
    art = store.materialize("passages", "1", {"n": 5}, {}, rows_build(5, calls))
    assert not art.cache_hit and len(calls) == 1
    m = art.manifest
    assert m["stage"] == "passages" and m["version"] == art.version and m["code_version"] == "1"
    assert m["tables"]["passages"]["rows"] == 5 and m["tables"]["passages"]["default"]
    assert m["stats"] == {"n": 5} and m["bytes"] > 0 and "build_s" in m["timings"]
    assert m["created_at"].endswith("+00:00")
    assert (art.path / "manifest.json").exists()
    assert art.read_table().num_rows == 5
    assert art.read_table(columns=["pid"]).column_names == ["pid"]

    again = store.materialize("passages", "1", {"n": 5}, {}, rows_build(5, calls))
    assert again.cache_hit and len(calls) == 1 and again.path == art.path
    assert ArtifactStore(store.root).materialize("passages", "1", {"n": 5}, {}, rows_build(5, calls)).cache_hit
    assert len(calls) == 1


def test_failing_build_registers_nothing(store):
    seen = []

    def bad(tmp):
        seen.append(tmp)
        write_table(tmp, pa.table({"pid": pa.array([1], pa.int64()), "text": ["a"]}))
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        store.materialize("passages", "1", {}, {}, bad)
    assert seen and not seen[0].exists()
    assert store.list_artifacts() == [] and store.latest("passages") is None
    assert [p for p in (store.root / "passages").iterdir() if not p.name.startswith(".locks")] == []
    # And a good build of the same version then works.
    assert store.materialize("passages", "1", {}, {}, rows_build(2)).manifest["rows"] == 2


def test_named_tables_and_views(store):
    def build(tmp):
        write_table(tmp, pa.table({"metric": ["mrr"], "value": [0.5]}), name="metrics")
        with ParquetTableWriter(tmp, pa.schema([("qid", pa.string()), ("hit", pa.bool_())]),
                                name="question_results", rows_per_file=2) as w:
            w.write_batch([{"qid": "q1", "hit": True}, {"qid": "q2", "hit": False}])
            w.write_batch([{"qid": "q3", "hit": True}])
        return None

    art = store.materialize("evaluation", "1", {}, {}, build)
    assert sorted(art.tables) == ["metrics", "question_results"]
    assert len(art.table_files("question_results")) == 2  # rows_per_file=2 split it
    assert art.read_table("question_results").num_rows == 3
    assert art.manifest["tables"]["question_results"]["rows"] == 3
    with pytest.raises(KeyError):
        art.read_table()  # two named tables, no default
    assert store.sql("SELECT count(*) FROM question_results WHERE hit = ?", [True]).column(0)[0].as_py() == 2
    assert store.sql("SELECT value FROM metrics").column(0)[0].as_py() == 0.5

    # A later stage defining "metrics" too gets <stage>_<table>.
    store.materialize("other_eval", "1", {}, {},
                      lambda tmp: write_table(tmp, pa.table({"m": [1, 2]}), name="metrics") and None)
    assert store.sql("SELECT count(*) FROM other_eval_metrics").column(0)[0].as_py() == 2
    assert store.sql("SELECT count(*) FROM metrics").column(0)[0].as_py() == 1
    views = dict((r["view_name"], r["stage"]) for r in store.sql("SELECT * FROM catalog_views").to_pylist())
    assert views["other_eval_metrics"] == "other_eval" and views["metrics"] == "evaluation"


def test_single_named_table_is_default(store):
    art = store.materialize("s", "1", {}, {}, rows_build(3, name="only"))
    assert art.tables == ["only"] and art.read_table().num_rows == 3


def test_view_counts_and_follows_latest(store):
    a = store.materialize("passages", "1", {"n": 4}, {}, rows_build(4))
    assert store.sql("SELECT count(*) FROM passages").column(0)[0].as_py() == a.manifest["rows"] == 4
    time.sleep(0.002)
    b = store.materialize("passages", "1", {"n": 7}, {}, rows_build(7))
    assert b.version != a.version
    assert store.latest("passages").version == b.version
    assert store.sql("SELECT count(*) FROM passages").column(0)[0].as_py() == 7
    # A cache hit on the older version does not make it latest.
    assert store.materialize("passages", "1", {"n": 4}, {}, rows_build(4)).cache_hit
    assert store.latest("passages").version == b.version
    rows = store.list_artifacts("passages")
    assert [r["version"] for r in rows] == [a.version, b.version]
    assert rows[0]["parameters"] == {"n": 4} and rows[0]["status"] == "committed"


def test_empty_table_still_has_schema(store):
    def build(tmp):
        ParquetTableWriter(tmp, SCHEMA).close()

    art = store.materialize("empty", "1", {}, {}, build)
    assert art.read_table().schema == SCHEMA and art.manifest["rows"] == 0
    assert store.sql("SELECT count(*) FROM empty").column(0)[0].as_py() == 0


def test_writer_streams_in_parts(tmp_path):
    w = ParquetTableWriter(tmp_path, SCHEMA, rows_per_file=10)
    for i in range(5):
        w.write_batch(pa.record_batch({"pid": pa.array(range(i * 7, i * 7 + 7), pa.int64()),
                                       "text": ["x"] * 7}, schema=SCHEMA))
    assert w.close() == 35
    files = sorted((tmp_path / "data").glob("*.parquet"))
    assert [f.name for f in files] == [f"part-0000{i}.parquet" for i in range(4)]
    import pyarrow.parquet as pq
    assert [pq.read_metadata(f).num_rows for f in files] == [10, 10, 10, 5]
    assert pq.read_metadata(files[0]).row_group(0).column(0).compression == "ZSTD"
    assert pq.read_table(files).column("pid").to_pylist() == list(range(35))


def test_sql_binds_parameters_and_is_read_only(store):
    store.materialize("passages", "1", {"n": 3}, {}, rows_build(3))
    t = store.sql("SELECT stage FROM artifacts WHERE stage = ?", ["passages"])
    assert t.column("stage").to_pylist() == ["passages"]
    # An injection attempt is just a string that matches nothing.
    assert store.sql("SELECT stage FROM artifacts WHERE stage = ?", ["x' OR '1'='1"]).num_rows == 0
    assert store.sql("SELECT text FROM passages WHERE pid = $1", [2]).column(0)[0].as_py() == "t2"
    with pytest.raises(Exception):
        store.sql("DELETE FROM artifacts")
    assert len(store.list_artifacts()) == 1


def test_stats_are_queryable_and_backfilled_into_an_older_catalog(tmp_path):
    import duckdb

    root = tmp_path / "root"
    store = ArtifactStore(root)
    art = store.materialize("passages", "1", {"n": 4}, {}, rows_build(4))
    query = "SELECT CAST(stats->>'$.n' AS INTEGER) AS n FROM artifacts WHERE stage = 'passages'"
    assert store.sql(query).column("n").to_pylist() == [4]
    assert store.get("passages", art.version).manifest["stats"] == {"n": 4}
    # A catalog of an older format (an artifacts table without stats, no format record): opening
    # the store rebuilds it from the manifests.
    (root / "catalog.duckdb").unlink()
    con = duckdb.connect(str(root / "catalog.duckdb"))
    con.execute("CREATE TABLE artifacts (stage VARCHAR, version VARCHAR)")
    con.close()
    assert ArtifactStore(root).sql(query).column("n").to_pylist() == [4]


def test_lineage_three_stage_chain(store):
    docs = store.materialize("documents", "1", {"src": "wiki"}, {}, rows_build(2))
    psg = store.materialize("passages", "1", {"words": 100}, {"documents": docs}, rows_build(3))
    # Inputs may be given as bare version strings too.
    idx = store.materialize("bm25", "1", {"k1": 0.9}, {"passages": psg.version, "docs": docs}, rows_build(1))
    assert idx.manifest["inputs"] == {"passages": {"stage": "passages", "version": psg.version},
                                      "docs": {"stage": "documents", "version": docs.version}}
    lin = store.lineage("bm25", idx.version)
    got = [(d["stage"], d["version"], d["depth"]) for d in lin]
    assert got[0] == ("bm25", idx.version, 0)
    assert ("passages", psg.version, 1) in got and ("documents", docs.version, 1) in got
    assert len(got) == 3  # documents appears once (at its smallest depth)
    assert next(d for d in lin if d["stage"] == "passages")["parameters"] == {"words": 100}
    assert store.version_for("bm25", "1", {"k1": 0.9}, {"passages": psg, "docs": docs.version}) == idx.version


def test_gc_keeps_latest_and_their_inputs(store):
    d1 = store.materialize("documents", "1", {"v": 1}, {}, rows_build(1))
    p1 = store.materialize("passages", "1", {}, {"d": d1}, rows_build(1))
    time.sleep(0.002)
    d2 = store.materialize("documents", "1", {"v": 2}, {}, rows_build(1))
    time.sleep(0.002)
    d3 = store.materialize("documents", "1", {"v": 3}, {}, rows_build(1))
    removed = store.gc(keep_latest=1)
    assert removed == [d2.path]  # d1 survives: the kept passages use it
    assert store.get("documents", d2.version) is None and store.get("documents", d1.version)
    assert {r["version"] for r in store.list_artifacts("documents")} == {d1.version, d3.version}
    assert p1.path.exists()


def test_gc_spares_a_promoted_version(store):
    old = store.materialize("documents", "1", {"v": 1}, {}, rows_build(1))
    time.sleep(0.002)
    store.materialize("documents", "1", {"v": 2}, {}, rows_build(1))
    store.catalog.record_promotion("documents", old.version)
    assert store.gc(keep_latest=1) == []  # the promoted old version serves searches: it stays
    assert store.get("documents", old.version) is not None


def test_resolve_root_precedence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PFORGE_HOME", raising=False)
    assert resolve_root(None) == tmp_path.resolve() / "artifacts"
    monkeypatch.setenv("PFORGE_HOME", "envhome")
    assert resolve_root(None) == tmp_path.resolve() / "envhome"
    assert resolve_root("cli") == tmp_path.resolve() / "cli"
    assert resolve_root(str(tmp_path / "abs")).is_absolute()


def test_bad_stage_name_rejected(store):
    with pytest.raises(ValueError):
        store.materialize("../evil", "1", {}, {}, rows_build(1))


# -- crashes and concurrency (subprocesses) ------------------------------------------------------
def _wait_for(path: Path, proc, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"child exited early: {proc.communicate()}")
        assert time.monotonic() < deadline, "child never got ready"
        time.sleep(0.02)


def test_sigkill_mid_build_leaves_nothing_and_heals(tmp_path):
    root = tmp_path / "root"
    ArtifactStore(root)
    proc = spawn(root, "hang", tmp_path / "ready", tmp_path / "counter")
    _wait_for(tmp_path / "ready", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)

    stage = root / "numbers"
    tmps = [p for p in stage.iterdir() if p.name.startswith(".tmp-")]
    assert len(tmps) == 1 and list(tmps[0].glob("data/*.parquet"))  # it did write data
    assert [p for p in stage.iterdir() if not p.name.startswith(".")] == []  # no version dir

    store = ArtifactStore(root)  # open cleans the leftover
    assert not tmps[0].exists()
    assert store.latest("numbers") is None and store.list_artifacts() == []
    proc = spawn(root, "finish", tmp_path / "ready2", tmp_path / "counter")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    res = json.loads(out)
    assert not res["cache_hit"] and store.latest("numbers").version == res["version"]
    assert store.sql("SELECT count(*) FROM numbers").column(0)[0].as_py() == 100


def test_tmp_dir_of_live_builder_is_not_cleaned(tmp_path):
    root = tmp_path / "root"
    proc = spawn(root, "hang", tmp_path / "ready", tmp_path / "counter")
    try:
        _wait_for(tmp_path / "ready", proc)
        ArtifactStore(root)
        assert [p for p in (root / "numbers").iterdir() if p.name.startswith(".tmp-")]
    finally:
        proc.kill()
        proc.wait(10)


def test_crash_after_rename_before_catalog_heals_on_open(tmp_path):
    root = tmp_path / "root"
    ArtifactStore(root)
    proc = spawn(root, "die_before_catalog", tmp_path / "ready", tmp_path / "counter")
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    committed = [p for p in (root / "numbers").iterdir() if not p.name.startswith(".")]
    assert len(committed) == 1 and (committed[0] / "manifest.json").exists()

    store = ArtifactStore(root)
    art = store.latest("numbers")
    assert art is not None and art.version == committed[0].name
    assert [r["version"] for r in store.list_artifacts()] == [art.version]
    assert store.sql("SELECT count(*) FROM numbers").column(0)[0].as_py() == 100


def test_two_concurrent_writers_build_once(tmp_path):
    """Writer A holds the version lock inside its build (until the test creates `go`) while
    writer B starts: B must block on the lock, not build, and reuse A's result once A commits."""
    root = tmp_path / "root"
    ArtifactStore(root)
    counter, go = tmp_path / "counter", tmp_path / "go"
    a = spawn(root, "gated", tmp_path / "a.started", counter, go, tmp_path / "a")
    b = None
    try:
        _wait_for(tmp_path / "a.started", a)  # A is inside build(), under the lock
        b = spawn(root, "gated", tmp_path / "b.started", counter, go, tmp_path / "b")
        _wait_for(tmp_path / "b.waiting", b)  # B asks for the same version's lock
        time.sleep(0.5)
        assert b.poll() is None, "B finished while A held the lock"
        assert not (tmp_path / "b.acquired").exists(), "B got the lock while A held it"
        assert not (tmp_path / "b.started").exists(), "B built while A was building"
        go.touch()
        results = []
        for p in (a, b):
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            results.append(json.loads(out))
    finally:
        go.touch()
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)
    assert (tmp_path / "b.acquired").exists()  # B did get the lock, after A released it ...
    assert not (tmp_path / "b.started").exists()  # ... and found A's commit instead of building
    assert len(counter.read_text().splitlines()) == 1  # build ran once
    assert results[0]["version"] == results[1]["version"] and results[0]["path"] == results[1]["path"]
    assert [r["cache_hit"] for r in results] == [False, True]
    assert len(ArtifactStore(root).list_artifacts()) == 1


def test_artifact_dataclass_fields(store):
    art = store.materialize("m", "1", {}, {}, lambda tmp: (tmp / "model").mkdir() or None)
    assert isinstance(art, Artifact) and art.subdir("model").is_dir() and art.tables == []
    assert art.data_dir == art.path / "data"
    assert store.get("m", art.version).manifest == art.manifest
    assert store.get("m", "0" * 16) is None
