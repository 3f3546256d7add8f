"""A store on a root this process cannot write (a read-only mount: a container, a shared volume)
serves its readers (`pforge artifacts`, `sql`, `search`, `plan`, `verify`) without writing a byte
there, through the catalog on disk when it is current and a private one when it is stale; its
writers (`run`, `refresh`, `promote`, `gc`, `import`, and `serve`, whose every deployment builds into
the root) refuse it in one line, exit 2. A promoted dense model serves `pforge search` from it, as
users deploy one from a read-only volume.

As root (these machines) the root is made read-only by a read-only bind mount over itself (root
ignores permission bits); as another user, by chmod -R a-w."""
from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
import types
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pytest

from flows.cli import COMMANDS, main
from storage import ArtifactStore, ReadOnlyStoreError, require_writable_root, write_table
from tasks.config import PROJECT_ROOT
from tests.test_search_cli import QUESTION, _stored_run, _test_question, built  # noqa: F401  (fixture: a tiny dense run)

TINY = PROJECT_ROOT / "configs" / "tiny.yaml"
PASSAGES = pa.table({"pid": ["p1", "p2", "p3"], "doc_id": ["d1", "d2", "d3"],
                     "title": ["Paris", "Berlin", "Volcano"],
                     "text": ["Paris is the capital and largest city of France.",
                              "Berlin is the capital of Germany and its largest city.",
                              "A volcano is a rupture in the crust through which lava escapes."]})


# -- making a root read-only --------------------------------------------------------------------
def _run_quietly(*argv: str) -> bool:
    return subprocess.run(list(argv), capture_output=True).returncode == 0


@contextmanager
def read_only(root: Path):
    """`root`, read-only in place for the block (the same path, so its catalog stays current)."""
    root = root.resolve()
    if os.geteuid() == 0:
        if not _run_quietly("mount", "--bind", str(root), str(root)):
            pytest.skip("running as root (which ignores permission bits) and `mount --bind` is not permitted here: "
                        "no way to make a folder read-only")
        try:
            if not _run_quietly("mount", "-o", "remount,bind,ro", str(root)):
                pytest.skip("running as root and a bind mount cannot be remounted read-only here")
            yield root
        finally:
            # Lazily when busy: a search keeps its encoder's weights mapped for the next question.
            if not _run_quietly("umount", str(root)):
                subprocess.run(["umount", "--lazy", str(root)], check=True)
    else:
        subprocess.run(["chmod", "-R", "a-w", str(root)], check=True)
        try:
            yield root
        finally:
            subprocess.run(["chmod", "-R", "u+w", str(root)], check=True)


def _tree(root: Path) -> dict[str, tuple]:
    """Every entry under `root` with its size and mtime: equal before and after means nothing was written."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.relpath(os.path.join(dirpath, name), root)] = (st.st_size, st.st_mtime_ns)
    return out


# -- a small store ------------------------------------------------------------------------------
def _rows(n: int):
    def build(out: Path):
        write_table(out, pa.table({"pid": [f"p{i}" for i in range(n)], "n": list(range(n))}))
        return {"stats": {"n": n}}
    return build


def _small_store(root: Path) -> dict:
    store = ArtifactStore(root)
    first = store.materialize("numbers", "1", {"n": 2}, {}, _rows(2))
    second = store.materialize("numbers", "1", {"n": 5}, {}, _rows(5))
    return {"store": store, "first": first, "second": second}


def _make_stale(root: Path, how: str) -> str:
    """Leave `root`'s catalog behind its folders; returns the version the catalog lacks."""
    if how == "missing":
        (root / "catalog.duckdb").unlink()
        return ""
    before = (root / "catalog.duckdb").read_bytes()  # as a crash between rename and catalog leaves it
    late = ArtifactStore(root).materialize("numbers", "1", {"n": 7}, {}, _rows(7))
    (root / "catalog.duckdb").write_bytes(before)
    return late.version


def _cli(capsys, root: Path, *argv: str) -> tuple[int, str, str]:
    rc = main(["--root", str(root), *argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


# -- readers ------------------------------------------------------------------------------------
def test_a_current_catalog_serves_artifacts_and_sql_from_the_read_only_root(tmp_path, capsys, caplog):
    built = _small_store(tmp_path / "store")
    with read_only(tmp_path / "store") as root:
        before = _tree(root)
        store = ArtifactStore(root)
        assert store.read_only and store.read_only_reason
        assert store.catalog.path == root / "catalog.duckdb"  # the file on disk, read in place

        rc, out, _ = _cli(capsys, root, "artifacts")
        assert rc == 0
        assert [line.split()[:3] for line in out.splitlines()[1:]] == [
            ["numbers", built["first"].version, "2"], ["numbers", built["second"].version, "5"]]
        rc, out, _ = _cli(capsys, root, "sql", "SELECT count(*) AS n, max(n) AS top FROM numbers")
        assert rc == 0 and out.split() == ["n", "top", "5", "4"]  # the latest version's view
        rc, out, _ = _cli(capsys, root, "promote")  # the listing reads
        assert (rc, out) == (0, "(no promotions)\n")
        rc, out, _ = _cli(capsys, root, "gc", "--dry-run")  # a dry run deletes nothing: it may read
        assert rc == 0 and "would remove 1 artifact(s)" in out and built["first"].version in out
        assert _tree(root) == before
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("how", ["older", "missing"])
def test_a_stale_catalog_is_built_privately_outside_the_root(tmp_path, capsys, caplog, how):
    built = _small_store(tmp_path / "store")
    late = _make_stale(tmp_path / "store", how)
    with read_only(tmp_path / "store") as root:
        before = _tree(root)
        caplog.clear()
        rc, out, err = _cli(capsys, root, "sql", "SELECT count(*) AS n FROM numbers")
        assert rc == 0 and out.split() == ["n", "7" if late else "5"], err
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and str(root) in warnings[0]
        assert "read-only" in warnings[0] and "stale" in warnings[0]

        store = ArtifactStore(root)
        private = store.catalog.path
        assert private.is_file() and root not in private.parents
        assert [r["version"] for r in store.list_artifacts()] == [built["first"].version, built["second"].version,
                                                                  *([late] if late else [])]
        assert store.sql("SELECT count(*) FROM artifacts").column(0)[0].as_py() == (3 if late else 2)
        rc, out, _ = _cli(capsys, root, "artifacts", "--stage", "numbers")
        assert rc == 0 and len(out.splitlines()) == (4 if late else 3)
        assert not store.reconcile()  # still current: not built again
        del store
        gc.collect()
        assert not private.exists()  # removed with its store (and at exit)
        assert _tree(root) == before


def test_plan_shows_what_is_built_in_a_read_only_root(shared_data, tmp_path, capsys):
    from flows.registry import plan_for
    from tasks.config import load_config
    from tasks.engine import run_stage

    plan = plan_for(load_config(TINY))
    run_stage(ArtifactStore(tmp_path / "store"), plan["ingest_documents"], {})
    with read_only(tmp_path / "store") as root:
        rc, out, _ = _cli(capsys, root, "plan", str(TINY))
        assert rc == 0 and f"7 stages, 1 built, 6 to build, in {root}\n" in out
        if "verify" in COMMANDS:  # digests are read, nothing repaired
            rc, out, err = _cli(capsys, root, "verify")
            assert rc == 0 and "0 damaged" in out, err


def test_a_root_repaired_then_mounted_read_only_serves_what_is_left(tmp_path, capsys):
    """`pforge verify --repair` moved a damaged version aside (into a hidden folder it keeps), then
    the root went read-only: readers see the rest, verify passes, and the moved version is no cache hit."""
    built = _small_store(tmp_path / "store")
    part = next((built["first"].path / "data").glob("*.parquet"))
    part.write_bytes(part.read_bytes()[:-1] + bytes([part.read_bytes()[-1] ^ 0xFF]))
    rc, out, _ = _cli(capsys, tmp_path / "store", "verify", "--repair")
    assert rc == 1 and "moved numbers " in out
    with read_only(tmp_path / "store") as root:
        before = _tree(root)
        rc, out, _ = _cli(capsys, root, "artifacts")
        assert rc == 0 and [line.split()[1] for line in out.splitlines()[1:]] == [built["second"].version]
        rc, out, _ = _cli(capsys, root, "sql", "SELECT count(*) AS n FROM numbers")
        assert rc == 0 and out.split() == ["n", "5"]
        rc, out, _ = _cli(capsys, root, "verify")
        assert rc == 0 and out.startswith("verified 1 artifacts") and out.rstrip().endswith(": 0 damaged")
        with pytest.raises(ReadOnlyStoreError):  # moved aside: not built, and nothing builds here
            ArtifactStore(root).materialize("numbers", "1", {"n": 2}, {}, _rows(2))
        assert _tree(root) == before


def test_verify_reads_the_promotions_record_of_a_read_only_root(tmp_path, capsys):
    built = _small_store(tmp_path / "store")
    built["store"].catalog.record_promotion("numbers", built["second"].version)
    built["store"].reconcile(force=True)
    with read_only(tmp_path / "store") as root:
        before = _tree(root)
        rc, out, err = _cli(capsys, root, "verify")  # no lock taken: nothing appends to a read-only record
        assert rc == 0 and out.rstrip().endswith(", the catalog and the promotions record: 0 damaged"), out + err
        assert _tree(root) == before


# -- writers ------------------------------------------------------------------------------------
def _refusal(root: Path) -> str:
    return f"pforge: error: {root}: the artifact store is read-only ("


@pytest.fixture
def no_flows(monkeypatch):
    """The flows `run` and `refresh` start (with a Prefect server) fail the test if they are reached."""
    def reached(*_a, **_k):
        raise AssertionError("the flow started: the read-only root was not refused first")
    for module, name in (("flows.pipeline", "pipeline"), ("flows.refresh", "corpus_refresh")):
        monkeypatch.setitem(sys.modules, module, types.SimpleNamespace(**{name: reached}))


@pytest.mark.parametrize("argv", [["run", str(TINY)], ["run", str(TINY), "--stage", "chunk"], ["refresh", str(TINY)],
                                  ["promote", "0123abcd"], ["gc"], ["gc", "--keep", "1"],
                                  ["import", "numbers-0123.json"], ["verify", "--repair"], ["serve", str(TINY)]],
                         ids=lambda argv: " ".join(Path(a).name for a in argv))
def test_writers_refuse_a_read_only_root_in_one_line(shared_data, tmp_path, capsys, no_flows, argv):
    _small_store(tmp_path / "store")
    with read_only(tmp_path / "store") as root:
        before = _tree(root)
        rc, out, err = _cli(capsys, root, *argv)
        assert rc == 2 and out == ""
        assert err.count("\n") == 1 and err.startswith(_refusal(root)), err
        assert err.endswith("); writers need a writable root\n")
        assert _tree(root) == before


def test_the_library_refuses_writes_and_serves_cache_hits(tmp_path):
    built = _small_store(tmp_path / "store")
    with read_only(tmp_path / "store") as root:
        store = ArtifactStore(root)
        hit = store.materialize("numbers", "1", {"n": 5}, {}, _rows(5))  # built already: read, not written
        assert hit.cache_hit and hit.version == built["second"].version
        with pytest.raises(ReadOnlyStoreError, match="the artifact store is read-only"):
            store.materialize("numbers", "1", {"n": 9}, {}, _rows(9))
        with pytest.raises(ReadOnlyStoreError):
            store.gc()
        with pytest.raises(ReadOnlyStoreError, match=f"^{root}: "):
            ArtifactStore(root, writable=True)
        with pytest.raises(ReadOnlyStoreError):  # a missing root that cannot be made
            ArtifactStore(root / "elsewhere")
        with pytest.raises(ReadOnlyStoreError, match="writers need a writable root$"):
            require_writable_root(root)
        assert store.cleanup() == []


# -- search -------------------------------------------------------------------------------------
def _bm25_store(root: Path) -> None:
    from tasks.bm25.index import build_bm25_index

    store = ArtifactStore(root)

    def passage_table(out: Path):
        write_table(out, PASSAGES)
    passages = store.materialize("passages", "1", {}, {}, passage_table)

    def index(out: Path):
        build_bm25_index(PASSAGES, out / "index", threads=1)
    bm25_index = store.materialize("bm25_index", "1", {}, {"passages": passages}, index)

    def runs(out: Path):
        write_table(out, pa.table({"qid": ["q"], "pid": ["p1"], "rank": [1], "score": [1.0]}))
        return {"variant": {"system": "bm25"}}
    store.materialize("bm25_runs", "1", {"k1": 0.9, "b": 0.4, "k": 10}, {"bm25_index": bm25_index}, runs)


@pytest.mark.parametrize("how", ["current", "missing"])
def test_bm25_search_serves_from_a_read_only_root(tmp_path, capsys, caplog, how):
    _bm25_store(tmp_path / "store")
    if how == "missing":
        _make_stale(tmp_path / "store", how)
    with read_only(tmp_path / "store") as root:
        before = _tree(root)
        caplog.clear()
        rc, out, err = _cli(capsys, root, "search", "volcano lava", "--system", "bm25", "-k", "2")
        assert rc == 0, err
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == (1 if how == "missing" else 0), warnings  # the private catalog's, once
        lines = out.splitlines()
        assert lines[0].startswith("bm25 (bm25_runs ") and "top 1 for 'volcano lava'" in lines[0]
        assert lines[1].split()[0] == "1" and lines[1].endswith("Volcano  [p3]")
        assert _tree(root) == before


def _printed_hits(out: str) -> list[tuple[int, str, str]]:
    """(rank, title, pid) of each hit `pforge search` printed (a line of rank, score, title, [pid],
    then a line of text)."""
    hits = []
    for line in out.splitlines()[1::2]:
        rank, _score, rest = line.split(maxsplit=2)
        title, _, pid = rest.rpartition("  [")
        hits.append((int(rank), title, pid.rstrip("]")))
    return hits


def test_a_promoted_dense_model_serves_search_from_a_read_only_root(built, capsys, caplog):
    """Promoted on a writable root, then mounted read-only: `search --promoted` (and plain `search`,
    which serves the promotion) loads the encoder and the FAISS index from the root, ranks as the
    pipeline ranked its own questions, and writes nothing there."""
    from flows import rankers

    root, store = built["root"], built["store"]
    assert main(["--root", str(root), "promote", built["encoder"][:8]]) == 0
    capsys.readouterr()
    qid, question = _test_question(store)
    expected = [pid for pid, _ in _stored_run(store, "dense_runs", "served", qid, 3)]
    header = (f"served (dense_runs {built['versions']['search:served']}, encoder dense_model {built['encoder']}): "
              f"top 3 for ")
    rankers._LOADED.clear()  # the encoder and the index are loaded from the read-only root, not kept from before
    with read_only(root) as root:
        before = _tree(root)
        caplog.clear()
        for which in (["--promoted"], []):  # --promoted, and the default once something is promoted
            rc, out, err = _cli(capsys, root, "search", question, *which, "-k", "3")
            assert rc == 0, err
            assert out.splitlines()[0] == header + repr(question) and len(out.splitlines()) == 7
            hits = _printed_hits(out)
            assert [rank for rank, _, _ in hits] == [1, 2, 3] and all(title for _, title, _ in hits)
            assert [pid for _, _, pid in hits] == expected  # the pipeline's own run for this question
        rc, out, err = _cli(capsys, root, "search", QUESTION, "--promoted", "-k", "2")
        assert rc == 0 and "Normans" in [title for _, title, _ in _printed_hits(out)], err
        assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert _tree(root) == before
