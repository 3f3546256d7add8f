"""What probing the command line as a user would found (issue 22): user SQL stays inside the store,
an empty or doubled query is one clear line, a mistyped --root makes no new store, --lineage finds
a stage's latest artifact, `pforge gc` lists before it deletes, and promote takes only this store's
dense_model versions. Each failure: one `pforge: error:` line, exit 2, nothing registered."""
import time

import pyarrow as pa
import pytest

from flows.cli import main
from storage import ArtifactStore, write_table
from storage.promotions import PROMOTIONS_FILE


def _rows(n: int):
    return lambda out: {"stats": {"rows": write_table(out, pa.table({"pid": [f"p{i}" for i in range(n)]}))}}


@pytest.fixture()
def root(tmp_path):
    root = tmp_path / "store"
    store = ArtifactStore(root)
    docs = store.materialize("documents", "1", {"v": 1}, {}, _rows(2))
    store.materialize("passages", "1", {}, {"documents": docs}, _rows(3))
    return root


def _one_error(capsys, *needles: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pforge: error: "), err
    for needle in needles:
        assert needle in err[0], err
    return err[0]


def _listing(root) -> list[str]:
    return sorted(p.name for p in root.iterdir())


# -------------------------------------------------------------------------- user SQL sandbox
@pytest.mark.parametrize("query,needle", [
    ("COPY (SELECT 1) TO 'x.csv'", "COPY statements are refused"),
    ("COPY (SELECT 1) TO '{root}/x.csv'", "COPY statements are refused"),  # not inside the store either
    ("COPY passages TO '{outside}/p.parquet' (FORMAT parquet)", "COPY statements are refused"),
    ("SELECT * FROM read_csv('/etc/passwd')", "Permission Error"),
    ("SELECT * FROM read_text('{root}/../secret.txt')", "Permission Error"),  # .. leaves the root
    ("SELECT * FROM read_text('{outside}/secret.txt')", "Permission Error"),
    ("SELECT * FROM glob('/*')", "Permission Error"),
    ("ATTACH '{outside}/other.duckdb' AS other", "ATTACH statements are refused"),
    ("INSTALL httpfs", "INSTALL statements are refused"),
    ("LOAD httpfs", "LOAD statements are refused"),
    ("SET enable_external_access = true", "SET statements are refused"),
    ("PRAGMA threads = 1", "SET statements are refused"),
    ("CREATE TABLE t AS SELECT 1", "CREATE statements are refused"),
    ("EXPORT DATABASE '{outside}/dump'", "EXPORT statements are refused"),
])
def test_user_sql_cannot_reach_outside_the_store_or_write(root, tmp_path, capsys, query, needle):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "secret.txt").write_text("secret")
    (outside / "secret.txt").write_text("secret")
    before = _listing(root)
    assert main(["--root", str(root), "sql", query.format(root=root, outside=outside)]) == 2
    _one_error(capsys, "catalog query failed", needle)
    assert _listing(root) == before and sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert not (tmp_path / "x.csv").exists()


def test_the_sandbox_still_reads_the_stores_own_files(root, capsys):
    assert main(["--root", str(root), "sql", "SELECT count(*) AS n FROM passages"]) == 0
    assert capsys.readouterr().out.split() == ["n", "3"]
    glob = str(root / "passages" / "*" / "data" / "*.parquet")
    assert main(["--root", str(root), "sql", f"SELECT count(*) AS n FROM read_parquet('{glob}')"]) == 0
    assert capsys.readouterr().out.split() == ["n", "3"]
    for query in ("SHOW TABLES", "DESCRIBE passages", "EXPLAIN SELECT * FROM passages", "SELECT 1 AS a -- note"):
        assert main(["--root", str(root), "sql", query]) == 0, query
    capsys.readouterr()


def test_a_store_whose_name_prefixes_another_does_not_open_it(root, tmp_path, capsys):
    """allowed_directories is a prefix: the root is given with its trailing separator."""
    sibling = tmp_path / (root.name + "2")
    sibling.mkdir()
    (sibling / "x.csv").write_text("a\n1\n")
    assert main(["--root", str(root), "sql", f"SELECT * FROM read_csv('{sibling}/x.csv')"]) == 2
    _one_error(capsys, "Permission Error")


@pytest.mark.parametrize("query", ["", "   ", ";", " ; ;", "-- only a comment", "/* a block */"])
def test_an_empty_query_is_one_line(root, capsys, query):
    assert main(["--root", str(root), "sql", query]) == 2
    _one_error(capsys, "no SQL statement in the query")


def test_two_statements_are_refused_rather_than_half_shown(root, capsys):
    assert main(["--root", str(root), "sql", "SELECT 1 AS a; SELECT 2 AS b"]) == 2
    _one_error(capsys, "2 statements in one query; give one statement per query")
    assert main(["--root", str(root), "sql", "SELECT 1 AS a;"]) == 0  # a trailing semicolon is one statement
    assert capsys.readouterr().out.split() == ["a", "1"]


# ------------------------------------------------------------------------------ missing root
@pytest.mark.parametrize("argv", [["artifacts"], ["artifacts", "--lineage", "passages"], ["sql", "SELECT 1"],
                                  ["search", "who?"], ["promote"], ["promote", "abc"], ["gc"], ["gc", "--dry-run"]])
def test_commands_that_read_refuse_a_missing_root_and_create_nothing(tmp_path, capsys, argv):
    typo = tmp_path / "artifcats"
    assert main(["--root", str(typo), *argv]) == 2
    _one_error(capsys, f"{typo}: no artifact store there (the folder does not exist)")
    assert not typo.exists()


def test_pforge_home_typo_is_refused_too(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PFORGE_HOME", str(tmp_path / "nope"))
    assert main(["sql", "SELECT 1"]) == 2
    _one_error(capsys, "nope: no artifact store there")
    assert not (tmp_path / "nope").exists()


def test_a_file_is_no_store(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert main(["--root", str(tmp_path / "f"), "artifacts"]) == 2
    _one_error(capsys, "no artifact store there (it is a file, not a folder)")


# --------------------------------------------------------------------------------- lineage
def test_lineage_of_a_stage_name_is_its_latest_artifact(root, capsys):
    store = ArtifactStore(root)
    passages = store.latest("passages")
    for spec in ("passages", f"passages:{passages.version}", f"passages:{passages.version[:6]}", passages.version[:8]):
        assert main(["--root", str(root), "artifacts", "--lineage", spec]) == 0, spec
        out = capsys.readouterr().out.splitlines()
        assert out[0].startswith(f"passages {passages.version} ") and out[1].startswith("  documents "), (spec, out)


@pytest.mark.parametrize("spec,needle", [
    ("nosuch", "no artifact 'nosuch'; give a stage (documents, passages)"),
    ("nosuch:abc", "no artifact of stage 'nosuch'; stages: documents, passages"),
    ("passages:ffffffff", "no artifact 'passages:ffffffff'"),
    ("../store/passages", "no artifact '../store/passages'"),
])
def test_lineage_of_nothing_is_one_line_and_exit_2(root, capsys, spec, needle):
    assert main(["--root", str(root), "artifacts", "--lineage", spec]) == 2
    _one_error(capsys, str(root), needle)


# -------------------------------------------------------------------------------------- gc
def test_gc_dry_run_lists_what_it_would_remove_then_gc_removes_it(root, capsys):
    store = ArtifactStore(root)
    time.sleep(0.002)
    old = store.materialize("documents", "1", {"v": 2}, {}, _rows(5))  # neither newest nor an input of a kept one
    time.sleep(0.002)
    newest = store.materialize("documents", "1", {"v": 3}, {}, _rows(1))
    assert main(["--root", str(root), "gc", "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    size = sum(f.stat().st_size for f in old.path.rglob("*") if f.is_file())
    assert len(out) == 2 and out[0].split()[:3] == ["documents", old.version, f"{size:,}"], out
    assert out[1] == f"would remove 1 artifact(s), {size:,} bytes, from {root} (dry run: nothing deleted)"
    assert old.path.is_dir()
    assert main(["--root", str(root), "gc"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"removed 1 artifact(s), {size:,} bytes, from {root}"
    assert not old.path.exists() and newest.path.is_dir()
    assert {r["version"] for r in ArtifactStore(root).list_artifacts("documents")} == {newest.version} | {
        r["inputs"]["documents"]["version"] for r in ArtifactStore(root).list_artifacts("passages")}
    assert main(["--root", str(root), "gc", "--keep", "0"]) == 2
    _one_error(capsys, "keep_latest must be >= 1")


def test_gc_keeps_the_newest_of_each_variant(tmp_path):
    """Systems write parallel artifacts of one stage (a variant each): the newest of each stays."""
    store = ArtifactStore(tmp_path)

    def runs(system):
        return lambda out: {**_rows(1)(out), "variant": {"system": system}}

    a_old = store.materialize("dense_runs", "1", {"s": "a", "n": 1}, {}, runs("a"))
    time.sleep(0.002)
    a_new = store.materialize("dense_runs", "1", {"s": "a", "n": 2}, {}, runs("a"))
    time.sleep(0.002)
    b_new = store.materialize("dense_runs", "1", {"s": "b", "n": 1}, {}, runs("b"))
    assert store.gc() == [a_old.path]
    assert a_new.path.is_dir() and b_new.path.is_dir()


# --------------------------------------------------------------------------------- promote
@pytest.mark.parametrize("make_spec", [
    lambda other, v: f"../../{other.parent.name}/{other.name}/qgen_model/{v}",
    lambda other, v: f"{other}/qgen_model/{v}",
    lambda other, v: f"../qgen_model/{v}",
    lambda other, v: f"dense_model:../qgen_model/{v}",
    lambda other, v: "qgen_model",
])
def test_promote_takes_only_this_stores_dense_model_versions(root, tmp_path, capsys, make_spec):
    other = tmp_path / "other-store"
    qgen = ArtifactStore(other).materialize("qgen_model", "1", {}, {}, _rows(1))
    (qgen.path / "model").mkdir()
    ArtifactStore(root).materialize("qgen_model", "1", {"here": True}, {}, _rows(1))
    ArtifactStore(root).materialize("dense_model", "1", {}, {}, _rows(1))  # so dense_model/.. resolves on disk
    spec = make_spec(other, ArtifactStore(root).latest("qgen_model").version if "other" not in make_spec(other, "")
                     else qgen.version)
    assert main(["--root", str(root), "promote", spec]) == 2
    _one_error(capsys, "dense_model")
    assert not (root / PROMOTIONS_FILE).exists()
    assert main(["--root", str(root), "promote"]) == 0 and capsys.readouterr().out.strip() == "(no promotions)"


# -------------------------------------------------------------------------- numbers and names
@pytest.mark.parametrize("argv, needle", [
    (["run", "configs/tiny.yaml", "--nproc", "0"], "--nproc: 0 is below 1"),
    (["search", "what", "--chars", "-5"], "--chars: -5 is below 0"),
    (["compare", "a", "b", "-k", "0"], "-k: 0 is below 1"),
    (["compare", "a", "b", "-k", "x"], "-k: 'x' is not a whole number"),
])
def test_counts_below_their_floor_are_refused_before_anything_runs(tmp_path, capsys, argv, needle):
    with pytest.raises(SystemExit) as exit_:
        main(["--root", str(tmp_path / "none"), *argv])
    assert exit_.value.code == 2 and needle in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


def test_artifacts_of_a_stage_the_store_lacks_is_an_error_naming_the_stages(root, capsys):
    assert main(["--root", str(root), "artifacts", "--stage", "nosuch"]) == 2
    _one_error(capsys, "no artifact of stage 'nosuch'", "stages: documents, passages")
    assert main(["--root", str(root), "artifacts", "--stage", "passages"]) == 0


# ------------------------------------------------------------------- refused before any server
@pytest.mark.parametrize("flags, needle", [
    (["--stage", "nosuch"], "--stage: unknown stage 'nosuch'"),
    (["--upto", "nosuch"], "--upto: unknown stage 'nosuch'"),
    (["--upto", "chunk,nosuch"], "--upto: unknown stage 'nosuch'"),
])
def test_an_unknown_stage_is_refused_naming_the_config_before_the_run_starts(tmp_path, capsys, flags, needle):
    root = tmp_path / "store"
    assert main(["--root", str(root), "run", "configs/tiny.yaml", *flags]) == 2
    _one_error(capsys, "configs/tiny.yaml", needle, "stages: ")
    assert not root.exists()  # the flow (which opens the store and starts Prefect) never ran


@pytest.mark.parametrize("dump, needle", [
    ("broken.xml.bz2", "cannot decompress"),
    ("notxml.xml", "malformed XML"),
    ("nothing-*.xml.bz2", "no file matches"),
    ("missing.xml.bz2", "Wikipedia dump not found"),
])
def test_a_bad_refresh_dump_is_refused_before_the_refresh_starts(tmp_path, capsys, dump, needle):
    import os

    (tmp_path / "broken.xml.bz2").write_bytes(b"BZh91AY&SY" + os.urandom(64))
    (tmp_path / "notxml.xml").write_text("this is <not xml\n")
    root = tmp_path / "store"
    assert main(["--root", str(root), "refresh", "configs/tiny.yaml", "--dump", str(tmp_path / dump)]) == 2
    _one_error(capsys, needle, dump.split("*")[0])
    assert not root.exists()


def test_a_refresh_of_a_config_without_a_dump_asks_for_one(tmp_path, capsys):
    root = tmp_path / "store"
    assert main(["--root", str(root), "refresh", "configs/nfcorpus.yaml"]) == 2
    _one_error(capsys, "no dump to refresh from", "--dump")
    assert not root.exists()


@pytest.mark.parametrize("argv", [["run", "configs/tiny.yaml"], ["refresh", "configs/tiny.yaml"], ["plan", "configs/tiny.yaml"],
                                  ["import", "numbers-0123.json"], ["verify"], ["verify", "--repair"]])
def test_a_file_is_no_store_for_writers_and_plan_either(tmp_path, capsys, argv):
    (tmp_path / "f").write_text("x")
    assert main(["--root", str(tmp_path / "f"), *argv]) == 2
    _one_error(capsys, f"{tmp_path / 'f'}: no artifact store there (it is a file, not a folder)")
    assert (tmp_path / "f").read_text() == "x"


@pytest.mark.parametrize("command, module, flow", [("run", "flows.pipeline", "pipeline"),
                                                   ("refresh", "flows.refresh", "corpus_refresh")])
def test_the_flows_that_start_a_prefect_server_run_under_its_watchdog(tmp_path, capsys, monkeypatch, command, module, flow):
    """A dead server stops them in one line (flows/server_watchdog.py; tests/test_server_death.py runs it)."""
    import contextlib
    import sys
    import types

    watched = []

    @contextlib.contextmanager
    def watchdog(*_a, **_k):
        watched.append("on")
        yield
        watched.append("off")

    def started(**_kwargs):
        watched.append("flow")
        return {} if command == "run" else {"up_to_date": True, "dump": "d"}

    monkeypatch.setattr("flows.server_watchdog.stopping_if_the_server_dies", watchdog)
    monkeypatch.setitem(sys.modules, module, types.SimpleNamespace(**{flow: started}))
    dump = ["--dump", "https://example.invalid/enwiki-{date}.xml.bz2"] if command == "refresh" else []
    assert main(["--root", str(tmp_path / "store"), command, "configs/tiny.yaml", *dump]) == 0, capsys.readouterr().err
    assert watched == ["on", "flow", "off"]
