"""A full disk (issue 22: a 3 MB tmpfs as the root): `pforge run` ends in one line naming the root
and the disk, the stage reported failed is not in the store (and every stage in it is complete),
`artifacts` and `sql` still answer, and once space is freed the next run completes.

Needs `mount -t tmpfs` (root in a container that allows it); skipped with the reason otherwise.
ENOSPC at each point of a commit (building, writing the catalog) is also tested without a mount,
by a filesystem stand-in."""
import errno
import subprocess
import uuid

import pyarrow as pa
import pytest

from flows.cli import main
from storage import ArtifactStore, write_table
from storage.catalog import Catalog
from storage.errors import StoreWriteError
from tasks.config import PROJECT_ROOT, load_config

TINY = PROJECT_ROOT / "configs" / "tiny.yaml"


def _rows(n: int):
    return lambda out: {"stats": {"rows": write_table(out, pa.table({"pid": [f"p{i}" for i in range(n)]}))}}


@pytest.fixture()
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", f"pforge-{uuid.uuid4().hex[:8]}", str(disk)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode}): needs root and CAP_SYS_ADMIN")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _one_error(capsys, *needles):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pforge: error: "), err
    for needle in needles:
        assert needle in err[0], err
    return err[0]


def _consistent(root):
    """Every committed folder is listed and every listed one is complete; no leftovers of a build."""
    store = ArtifactStore(root)
    listed = {(r["stage"], r["version"]) for r in store.list_artifacts()}
    in_catalog = {(r["stage"], r["version"]) for r in store.sql("SELECT stage, version FROM artifacts").to_pylist()}
    assert listed == in_catalog
    for stage_dir in (p for p in root.iterdir() if p.is_dir()):
        leftovers = [c.name for c in stage_dir.iterdir() if c.name.startswith((".tmp-", ".trash-"))]
        assert not leftovers, leftovers
    return listed


def test_a_full_disk_ends_a_run_in_one_line_and_the_next_run_on_a_freed_disk_works(prefect_harness, shared_data,
                                                                                   small_disk, capsys):
    from flows.pipeline import pipeline

    root = small_disk / "store"
    cfg = load_config(TINY)
    with pytest.raises(OSError) as info:
        pipeline(config=cfg, root=str(root))
    message = str(info.value)
    assert f"{root}: no space left on device while " in message and "\n" not in message, message
    failed = message.split(" while ", 1)[1].split(":", 1)[0].split()[-1]  # "committing passages" -> passages
    listed = _consistent(root)
    assert failed not in {stage for stage, _ in listed}, (failed, listed)
    # What reads the store still answers on the full disk.
    assert main(["--root", str(root), "artifacts"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 + len(listed)
    assert main(["--root", str(root), "sql", "SELECT count(*) AS n FROM artifacts"]) == 0
    assert capsys.readouterr().out.split() == ["n", str(len(listed))]
    # Space freed: the stage that failed runs again on what was committed (the whole tiny run
    # after it is what every other pipeline test does; rerunning one stage keeps this test short).
    subprocess.run(["mount", "-o", "remount,size=200m", str(small_disk)], check=True)
    from flows.registry import plan_for

    stage = next(s.name for s in plan_for(cfg) if s.artifact == failed)
    pipeline(config=cfg, stage=stage, root=str(root))
    now = _consistent(root)
    assert listed < now and failed in {s for s, _ in now}


def test_a_full_disk_while_the_catalog_is_written_withdraws_the_stage(tmp_path, monkeypatch, capsys):
    """The artifact's folder is renamed in before the catalog is rebuilt: when the rebuild fails
    for lack of space (DuckDB: a FatalException), the folder is withdrawn, so the store never
    lists a stage its run reported failed."""
    import duckdb

    store = ArtifactStore(tmp_path)
    kept = store.materialize("documents", "1", {}, {}, _rows(2))
    real_write = Catalog._write

    def full(self, tmp, committed):
        tmp.write_bytes(b"partial")
        raise duckdb.FatalException(f'FATAL Error: Failed to create checkpoint because of error: Could not write file '
                                    f'"{tmp}": No space left on device')

    monkeypatch.setattr(Catalog, "_write", full)
    with pytest.raises(StoreWriteError) as info:
        store.materialize("passages", "1", {}, {"documents": kept}, _rows(3))
    assert info.value.errno == errno.ENOSPC
    assert str(info.value) == (f"{tmp_path}: no space left on device while committing passages: free space on that "
                               "disk (or `pforge gc`) and rerun")
    assert not [p for p in (tmp_path / "passages").iterdir() if not p.name.startswith(".locks")]
    assert not list(tmp_path.glob(".catalog-*"))
    # Reopening with a stale catalog on a full disk: the same one line through the CLI, exit 2.
    (tmp_path / "promotions.jsonl").write_text('{"stage": "documents", "version": "x", "promoted_at": '
                                               '"2026-01-01T00:00:00+00:00", "note": null}\n')  # makes it stale
    assert main(["--root", str(tmp_path), "artifacts"]) == 2
    _one_error(capsys, f"{tmp_path}: no space left on device while writing the catalog")
    monkeypatch.setattr(Catalog, "_write", real_write)
    again = ArtifactStore(tmp_path).materialize("passages", "1", {}, {"documents": kept}, _rows(3))
    assert not again.cache_hit and [r["stage"] for r in ArtifactStore(tmp_path).list_artifacts()] == ["documents", "passages"]


def test_a_full_disk_while_building_is_one_line_and_leaves_nothing(tmp_path):
    store = ArtifactStore(tmp_path)

    def build(out):
        (out / "data").mkdir()
        (out / "data" / "part.parquet").write_bytes(b"x" * 10)
        raise OSError("IOError: error writing bytes to file. Detail: [errno 28] No space left on device")

    with pytest.raises(StoreWriteError, match=rf"^{tmp_path}: no space left on device while building passages: "):
        store.materialize("passages", "1", {}, {}, build)
    assert [p.name for p in (tmp_path / "passages").iterdir()] == [".locks"]
    assert store.list_artifacts() == []


def test_a_store_error_survives_pickling():
    """Prefect may carry a task's exception across processes: it must arrive as the same line."""
    import pickle

    exc = StoreWriteError(errno.ENOSPC, "/r: no space left on device while building x: free space")
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is StoreWriteError and back.errno == errno.ENOSPC and str(back) == str(exc)
