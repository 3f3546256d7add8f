"""`pforge promote`: promotions are recorded beside the manifests (promotions.jsonl) and indexed in
the catalog's `promotions` table, which every rebuild fills again, so they survive new commits,
a crash between the record and the rebuild, and catalogs of an older format."""
import os

import duckdb
import pyarrow as pa
import pytest

from flows.cli import main
from flows.promotion import latest_promotion, promote, promotions
from storage import ArtifactStore, write_table
from storage.promotions import PROMOTIONS_FILE


def _model(store: ArtifactStore, name: str, with_folder: bool = True) -> str:
    def build(out):
        if with_folder:
            (out / "model").mkdir()
            (out / "model" / "weights.bin").write_bytes(name.encode())
        write_table(out, pa.table({"step": [1]}))
        return {"stats": {"steps": 1}}

    return store.materialize("dense_model", "1", {"system": name}, {}, build).version


def _promoted(store: ArtifactStore) -> list[tuple[int, str]]:
    return [(r["seq"], r["version"]) for r in promotions(store)]


@pytest.fixture()
def store(tmp_path) -> ArtifactStore:
    return ArtifactStore(tmp_path)


def test_a_fresh_catalog_has_an_empty_promotions_table(store):
    assert promotions(store) == [] and latest_promotion(store) is None
    assert store.reconcile(force=True)  # rebuilt again: the table is created once more, not twice
    assert store.sql("SELECT count(*) FROM promotions").column(0)[0].as_py() == 0


def test_promotions_are_kept_in_order_and_survive_rebuilds_and_reopens(store, tmp_path):
    first, second = _model(store, "a"), _model(store, "b")
    record = promote(first, store=store, note="best dev top-20")
    assert (record["seq"], record["stage"], record["version"], record["system"]) == (1, "dense_model", first, "a")
    promote(second[:6], store=store)  # a unique prefix is enough
    promote(first, store=store)       # promoting again is a new record: the last one serves
    assert _promoted(store) == [(1, first), (2, second), (3, first)]
    assert latest_promotion(store) == first
    assert promotions(store)[0]["note"] == "best dev top-20"

    _model(store, "c")  # a commit rebuilds the catalog from the manifests: promotions stay
    assert _promoted(store) == [(1, first), (2, second), (3, first)]
    assert _promoted(ArtifactStore(tmp_path)) == [(1, first), (2, second), (3, first)]


def test_a_promotion_recorded_before_a_crash_reaches_the_catalog_on_the_next_open(store, tmp_path):
    version = _model(store, "a")
    store.catalog.record_promotion("dense_model", version)  # the process dies before the rebuild
    assert latest_promotion(store) is None                  # the old catalog file is still in place
    assert latest_promotion(ArtifactStore(tmp_path)) == version  # stale catalog detected and rebuilt


def test_a_torn_record_line_is_skipped_and_the_next_promotion_is_read(store, tmp_path):
    version = _model(store, "a")
    (tmp_path / PROMOTIONS_FILE).write_text('{"stage": "dense_model", "vers')  # a crash mid-append
    promote(version, store=store)
    assert _promoted(ArtifactStore(tmp_path)) == [(1, version)]


def test_an_older_catalog_without_the_table_is_rebuilt_with_it(store, tmp_path):
    version = _model(store, "a")
    promote(version, store=store)
    con = duckdb.connect(str(tmp_path / "catalog.duckdb"))  # what a format-2 catalog looked like
    con.execute("DROP TABLE promotions")
    con.execute("ALTER TABLE catalog_meta DROP COLUMN promotions")
    con.execute("UPDATE catalog_meta SET format = 2")
    con.close()
    assert latest_promotion(ArtifactStore(tmp_path)) == version


def test_only_existing_trained_encoders_are_promoted(store, tmp_path):
    first, second = _model(store, "a"), _model(store, "b")
    with pytest.raises(ValueError, match=rf"{tmp_path}: no dense_model version 'nope'; known: .*{first}"):
        promote("nope", store=store)
    # An ambiguous prefix needs two versions that share one: add encoders until two share their
    # first digit (at most 17 versions for 16 hex digits; the hashes, so the count, are fixed).
    by_first = {first[0]: first, second[0]: second} if first[0] != second[0] else {}
    twins = (first, second) if not by_first else None
    while twins is None:
        version = _model(store, f"extra-{len(by_first)}")
        twins = (by_first[version[0]], version) if version[0] in by_first else None
        by_first.setdefault(version[0], version)
    common = os.path.commonprefix(twins)
    assert common and len(common) < len(twins[0])
    with pytest.raises(ValueError, match="matches several dense_model versions: " + ", ".join(sorted(twins))):
        promote(common, store=store)
    with pytest.raises(ValueError, match="not a dense_model version"):
        promote(f"passages:{first}", store=store)
    empty = _model(store, "no-folder", with_folder=False)
    with pytest.raises(RuntimeError, match="has no model/ folder"):
        promote(empty, store=store)
    assert promote(f"dense_model:{second}", store=store)["version"] == second
    assert _promoted(store) == [(1, second)]
    assert not list(tmp_path.glob(".catalog-*"))


def test_the_command_line_promotes_lists_and_refuses_in_one_line(store, tmp_path, capsys):
    version = _model(store, "a")
    assert main(["--root", str(tmp_path), "promote"]) == 0
    assert capsys.readouterr().out.strip() == "(no promotions)"
    assert main(["--root", str(tmp_path), "promote", version, "--note", "first"]) == 0
    assert capsys.readouterr().out.strip() == f"promoted dense_model {version} (system a): `pforge search` serves it"
    assert main(["promote", "--root", str(tmp_path)]) == 0
    line, = capsys.readouterr().out.strip().splitlines()
    assert line.split()[0] == "1" and line.endswith(f"dense_model {version}  first")
    assert main(["--root", str(tmp_path), "promote", "0000dead"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"pforge: error: {tmp_path}: no dense_model version '0000dead'"), err
