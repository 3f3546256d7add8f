"""Artifacts carried between stores (storage/transfer.py, `pforge export` / `pforge import`): the
imported version is the one the planner computes, with its build's own timings; a damaged or
mislabelled export is refused and registers nothing; and a run on the receiving store leaves out
what only the imported artifact needed (there: BM25's index, behind its imported runs)."""
import json
import tarfile

import pytest

from flows.pipeline import pipeline
from storage import ArtifactStore
from storage.transfer import TransferError, export_artifact, import_artifact
from tasks.config import PROJECT_ROOT, load_config

TINY = PROJECT_ROOT / "configs" / "tiny.yaml"


@pytest.fixture(scope="module")
def exported(prefect_harness, shared_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("source")
    versions = pipeline(config=load_config(TINY), root=str(root))
    store = ArtifactStore(root)
    runs = store.get("bm25_runs", versions["bm25_search"])
    description = export_artifact(store, runs, tmp_path_factory.mktemp("shared"))
    return versions, store, runs, description


def test_an_import_is_the_planned_version_with_its_own_build_time(exported, tmp_path):
    versions, _, runs, description = exported
    assert json.loads(description.read_text())["lineage"][0]["stage"] == "bm25_runs"
    target = ArtifactStore(tmp_path)
    imported = import_artifact(target, description)
    assert (imported.stage, imported.version, imported.cache_hit) == ("bm25_runs", versions["bm25_search"], False)
    assert imported.manifest["timings"]["build_s"] == runs.manifest["timings"]["build_s"]
    assert imported.manifest["imported"]["from"] == description.name
    assert imported.read_table().equals(runs.read_table())
    assert import_artifact(target, description).cache_hit   # a second import finds it
    assert target.sql("SELECT count(*) AS n FROM bm25_runs").column("n")[0].as_py() == runs.rows


def test_a_run_leaves_out_what_only_an_imported_artifact_needed(exported, tmp_path):
    versions, source, _, description = exported
    import_artifact(ArtifactStore(tmp_path), description)
    again = pipeline(config=load_config(TINY), root=str(tmp_path))
    assert "bm25_index" not in again and again["bm25_search"] == versions["bm25_search"]
    assert again["evaluate"] == versions["evaluate"]   # the same evaluation as the machine that built everything
    target = ArtifactStore(tmp_path)
    assert target.get("bm25_index", versions["bm25_index"]) is None
    assert target.get("evaluation", versions["evaluate"]).read_table("metrics").equals(
        source.get("evaluation", versions["evaluate"]).read_table("metrics"))


def test_a_damaged_or_mislabelled_export_is_refused_and_nothing_registered(exported, tmp_path):
    _, _, runs, description = exported
    folder = tmp_path / "copy"
    folder.mkdir()
    meta = json.loads(description.read_text())
    archive = description.parent / meta["archive"]
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / meta["archive"]).write_bytes(bytes(data))
    (folder / description.name).write_text(description.read_text())
    target = ArtifactStore(tmp_path / "store")
    with pytest.raises(TransferError, match=r"tar\.gz: SHA-256 .* differs"):
        import_artifact(target, folder / description.name)
    (folder / meta["archive"]).write_bytes(archive.read_bytes())
    (folder / description.name).write_text(json.dumps({**meta, "version": "0" * 16}))
    with pytest.raises(TransferError, match="holds no manifest of bm25_runs 0000000000000000"):
        import_artifact(target, folder / description.name)
    assert target.list_artifacts() == []


def test_an_archive_with_a_link_out_of_the_artifact_is_refused(exported, tmp_path):
    from storage.transfer import sha256_of

    _, _, _, description = exported
    meta = json.loads(description.read_text())
    evil = tmp_path / meta["archive"]
    with tarfile.open(evil, "w:gz") as tar:
        link = tarfile.TarInfo("data/escape")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    (tmp_path / description.name).write_text(json.dumps({**meta, "sha256": sha256_of(evil)}))
    with pytest.raises(TransferError, match="'data/escape' is not a plain file"):
        import_artifact(ArtifactStore(tmp_path / "store"), tmp_path / description.name)


def _small_export(tmp_path):
    import pyarrow as pa

    from storage import write_table

    def build(out):
        write_table(out, pa.table({"n": [1, 2, 3]}))

    source = ArtifactStore(tmp_path / "source")
    numbers = source.materialize("numbers", "1", {"n": 3}, {}, build)
    return numbers, export_artifact(source, numbers, tmp_path / "shared")


def test_a_killed_imports_unpacked_folder_goes_on_the_next_open_and_nothing_lists_it(tmp_path, capsys):
    from flows.cli import main
    from storage.locks import file_lock
    from storage.paths import IMPORT_LOCK

    numbers, description = _small_export(tmp_path)
    root = tmp_path / "store"
    imported = import_artifact(ArtifactStore(root), description)
    assert not list(root.glob(".import-*"))   # a clean import leaves none
    assert main(["--root", str(root), "verify"]) == 0 and ": 0 damaged" in capsys.readouterr().out
    assert imported.version == numbers.version and (imported.path / "manifest.json.sha256").is_file()

    # What a SIGKILL during the unpacking leaves: its folder under the root, a manifest inside.
    left = root / ".import-k1ll3d0"
    (left / "artifact").mkdir(parents=True)
    (left / "artifact" / "manifest.json").write_text('{"stage": "numbers", "version": "x"}')
    with file_lock(root / IMPORT_LOCK):   # as while an import runs in another process: its folder stays
        assert main(["--root", str(root), "artifacts"]) == 0 and ".import" not in capsys.readouterr().out
        assert main(["--root", str(root), "verify"]) == 0 and "1 artifacts" in capsys.readouterr().out
        assert left.is_dir()
    ArtifactStore(root)   # the next open (a run's, an import's) finds it a leftover
    assert not left.exists()
