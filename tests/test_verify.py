"""File digests in the manifest (and the manifest's and the catalog's beside them), `pforge verify`
and `--repair`, and the cache hit that refuses a damaged version. A tiny store built straight
through `ArtifactStore.materialize` (no flows)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pyarrow as pa
import pytest

from flows.cli import main
from storage import ArtifactStore, ParquetTableWriter, write_table
from storage.manifest import MANIFEST, MANIFEST_DIGEST, read_manifest, write_manifest
from storage.paths import DAMAGED_PREFIX
from storage.promotions import PROMOTIONS_FILE
from storage.verify import DamagedArtifactError, verify_artifact

SCHEMA = pa.schema([("pid", pa.int64()), ("text", pa.string())])


def passages_build(n: int, calls: list):
    def build(out: Path):
        calls.append(n)
        with ParquetTableWriter(out, SCHEMA, rows_per_file=3) as writer:  # several parts
            writer.write_batch([{"pid": i, "text": f"passage {i}"} for i in range(n)])
        return {"stats": {"n": n}}
    return build


def index_build(calls: list):
    def build(out: Path):
        calls.append("index")
        (out / "index").mkdir()
        (out / "index" / "vectors.bin").write_bytes(bytes(range(256)) * 4)  # binary
        (out / "index" / "config.json").write_text('{"dim": 4}\n', encoding="utf-8")
        write_table(out, pa.table({"metric": ["size"], "value": [1024.0]}), name="metrics")
        return None
    return build


def build_tiny_store(root: Path, calls: list | None = None) -> dict:
    """Two passages versions (one read by an index with a binary and a text file)."""
    calls = [] if calls is None else calls
    store = ArtifactStore(root)
    small = store.materialize("passages", "1", {"n": 4}, {}, passages_build(4, calls))
    large = store.materialize("passages", "1", {"n": 7}, {}, passages_build(7, calls))
    index = store.materialize("index", "1", {}, {"passages": small}, index_build(calls))
    return {"small": small, "large": large, "index": index}


@pytest.fixture
def tiny(tmp_path) -> tuple[Path, dict]:
    root = tmp_path / "root"
    return root, build_tiny_store(root)


def verify(root: Path, capsys, *args: str) -> tuple[int, list[str]]:
    code = main(["--root", str(root), "verify", *args])
    return code, capsys.readouterr().out.strip().splitlines()


def data_files(artifact) -> list[Path]:
    return sorted(p for p in artifact.path.rglob("*") if p.is_file() and p.name not in (MANIFEST, MANIFEST_DIGEST))


def flip_byte(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_every_file_but_the_manifest_is_recorded_with_its_size_and_sha256(tiny):
    _, arts = tiny
    for artifact in arts.values():
        files = artifact.manifest["files"]
        assert sorted(files) == sorted(p.relative_to(artifact.path).as_posix() for p in data_files(artifact))
        for relative, record in files.items():
            raw = (artifact.path / relative).read_bytes()
            assert record == {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest(),
                              "mtime_ns": (artifact.path / relative).stat().st_mtime_ns}
        assert read_manifest(artifact.path)["files"] == files  # written to disk, not only returned
    assert {"index/vectors.bin", "index/config.json", "data/metrics/part-00000.parquet"} <= set(arts["index"].manifest["files"])
    assert len([f for f in arts["large"].manifest["files"] if f.endswith(".parquet")]) == 3  # 7 rows, 3 per part


def test_the_record_does_not_change_a_version(tiny):
    root, arts = tiny
    store = ArtifactStore(root)
    assert arts["small"].version == store.version_for("passages", "1", {"n": 4}, {})
    assert arts["index"].version == store.version_for("index", "1", {}, {"passages": arts["small"].version})


def test_a_clean_store_verifies_and_exits_0(tiny, capsys):
    root, _ = tiny
    code, out = verify(root, capsys)
    files = sum(len(a.manifest["files"]) + 1 for a in tiny[1].values())  # and each manifest
    assert code == 0 and out == [f"verified 3 artifacts, {files} files and the catalog: 0 damaged"]


def test_one_flipped_byte_in_any_file_is_named_and_exits_1(tiny, capsys):
    root, arts = tiny
    checked = 0
    for artifact in arts.values():
        for path in data_files(artifact):
            for offset in (0, path.stat().st_size // 2):  # a parquet's magic bytes and its middle
                flip_byte(path, offset)
                code, out = verify(root, capsys)
                relative = path.relative_to(artifact.path).as_posix()
                assert code == 1, (relative, out)
                assert out[:-1] == [f"{artifact.stage} {artifact.version} {relative}: SHA-256 differs from the recorded one"]
                assert out[-1].endswith(": 1 damaged")
                flip_byte(path, offset)  # put it back: the next file is checked alone
                checked += 1
    assert checked == 2 * sum(len(a.manifest["files"]) for a in arts.values()) >= 14
    assert verify(root, capsys)[0] == 0


def test_one_artifact_alone_by_stage_and_version(tiny, capsys):
    root, arts = tiny
    flip_byte(data_files(arts["large"])[0], 4)
    code, out = verify(root, capsys, f"passages:{arts['small'].version}")
    assert code == 0 and out[-1].startswith("verified 1 artifacts")
    code, out = verify(root, capsys, f"passages:{arts['large'].version[:6]}")
    assert code == 1 and out[0].startswith(f"passages {arts['large'].version} data/part-00000.parquet")


def test_a_config_verifies_the_versions_it_plans_that_are_built(tiny, capsys, monkeypatch):
    root, arts = tiny

    class Planned:
        def __init__(self, name, artifact):
            self.name, self.artifact = name, artifact

    class Plan(list):
        versions = {"chunk": arts["small"].version, "index": "0123456789abcdef"}  # the second is not built

        def planned_version(self, name):
            return self.versions[name]

    monkeypatch.setattr("flows.registry.plan_for", lambda cfg: Plan([Planned("chunk", "passages"),
                                                                      Planned("index", "index")]))
    config = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"
    flip_byte(data_files(arts["large"])[0], 4)  # not planned: not checked
    code, out = verify(root, capsys, "--config", str(config))
    assert code == 0 and out == [f"verified 1 artifacts, {len(arts['small'].manifest['files']) + 1} files: 0 damaged"]


def test_missing_and_resized_files_are_damage(tiny):
    _, arts = tiny
    parts = data_files(arts["large"])
    parts[0].unlink()
    with open(parts[1], "ab") as f:
        f.write(b"x")
    what = {d.path: d.what for d in verify_artifact(arts["large"])}
    size = parts[1].stat().st_size
    assert what == {"data/part-00000.parquet": "missing",
                    "data/part-00001.parquet": f"{size:,} bytes, {size - 1:,} recorded"}


def test_repair_moves_the_damaged_version_aside_and_the_next_build_makes_exactly_it(tmp_path, capsys):
    root, calls = tmp_path / "root", []
    arts = build_tiny_store(root, calls)
    small = arts["small"]
    flip_byte(data_files(small)[1], 10)
    code, out = verify(root, capsys, "--repair")
    assert code == 1
    assert out[0] == f"passages {small.version} data/part-00001.parquet: SHA-256 differs from the recorded one"
    assert out[-1].startswith(f"moved passages {small.version} aside to ") and "rebuilds it" in out[-1]

    aside = [p for p in (root / "passages").iterdir() if p.name.startswith(DAMAGED_PREFIX)]
    assert len(aside) == 1 and aside[0].name.startswith(f"{DAMAGED_PREFIX}{small.version}-")
    assert (aside[0] / MANIFEST).exists() and not small.path.exists()  # kept for a look

    store = ArtifactStore(root)
    assert aside[0].exists()  # opening the store does not delete it
    listed = {(r["stage"], r["version"]) for r in store.sql("SELECT stage, version FROM artifacts").to_pylist()}
    assert listed == {("passages", arts["large"].version), ("index", arts["index"].version)}
    assert store.get("passages", small.version) is None

    calls.clear()
    rebuilt = store.materialize("passages", "1", {"n": 4}, {}, passages_build(4, calls))
    again = [store.materialize("passages", "1", {"n": 7}, {}, passages_build(7, calls)),
             store.materialize("index", "1", {}, {"passages": rebuilt}, index_build(calls))]
    assert calls == [4] and not rebuilt.cache_hit and rebuilt.version == small.version
    assert all(a.cache_hit for a in again)
    assert verify(root, capsys)[0] == 0


def test_a_truncated_file_refuses_the_cache_hit_in_one_line(tiny):
    root, arts = tiny
    part = data_files(arts["large"])[2]
    os.truncate(part, 10)
    calls: list = []
    for store in (ArtifactStore(root), ArtifactStore(root)):  # a fresh open, and one that has seen it
        with pytest.raises(DamagedArtifactError) as caught:
            store.materialize("passages", "1", {"n": 7}, {}, passages_build(7, calls))
        message = str(caught.value)
        assert "\n" not in message and message.startswith(f"{part}: 10 bytes, ")
        assert "pforge verify --repair" in message
    assert calls == [] and part.stat().st_size == 10  # not rebuilt over
    assert ArtifactStore(root).materialize("passages", "1", {"n": 4}, {}, passages_build(4, calls)).cache_hit


def test_a_rewritten_file_of_the_same_size_refuses_the_cache_hit_and_a_touched_one_does_not(tiny):
    root, arts = tiny
    flipped, touched = data_files(arts["large"])[1], data_files(arts["small"])[0]
    flip_byte(flipped, 5)   # same size, written since the commit
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 10**9))  # same bytes
    calls: list = []
    with pytest.raises(DamagedArtifactError, match="SHA-256 differs from the recorded one"):
        ArtifactStore(root).materialize("passages", "1", {"n": 7}, {}, passages_build(7, calls))
    assert ArtifactStore(root).materialize("passages", "1", {"n": 4}, {}, passages_build(4, calls)).cache_hit
    assert calls == []


def test_a_manifest_without_digests_is_reported_unchecked_not_damaged(tiny, capsys):
    root, arts = tiny
    old = arts["index"]
    manifest = read_manifest(old.path)
    del manifest["files"]  # as written before digests were recorded
    write_manifest(old.path, manifest)
    flip_byte(old.path / "index" / "vectors.bin", 0)  # not noticed: nothing to compare with
    code, out = verify(root, capsys)
    assert code == 0
    assert f"index {old.version}: no digests recorded (committed before they were): not checked" in out
    assert out[-1].startswith("verified 2 artifacts, ") and out[-1].endswith(": 0 damaged; 1 without digests, not checked")
    assert ArtifactStore(root).materialize("index", "1", {}, {"passages": arts["small"]}, index_build([])).cache_hit


# -- what guards the manifest and the catalog -------------------------------------------------------
def pristine(path: Path):
    """Puts `path` and its sidecar back as they are now (an open that cannot read a catalog rebuilds it)."""
    saved = {p: p.read_bytes() for p in (path, path.with_name(path.name + ".sha256"))}
    return lambda: [p.write_bytes(raw) for p, raw in saved.items()]


def test_the_manifest_and_the_catalog_have_their_digests_beside_them_as_sha256sum_writes_them(tiny):
    root, arts = tiny
    for folder, name in [(a.path, MANIFEST) for a in arts.values()] + [(root, "catalog.duckdb")]:
        digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
        assert (folder / f"{name}.sha256").read_text() == f"{digest}  {name}\n"
    if shutil.which("sha256sum"):
        checked = subprocess.run(["sha256sum", "-c", MANIFEST_DIGEST], cwd=arts["index"].path, capture_output=True, text=True)
        assert checked.returncode == 0 and checked.stdout == f"{MANIFEST}: OK\n"
    assert MANIFEST_DIGEST not in arts["index"].manifest["files"]


def _rows_flipped(manifest: Path) -> None:
    """One bit of the manifest's row count: JSON still, and naming its own version."""
    raw = manifest.read_bytes()
    at = raw.index(b'"rows": ') + len(b'"rows": ')
    data = bytearray(raw)
    data[at] ^= 0x01
    manifest.write_bytes(bytes(data))


def test_one_flipped_byte_in_a_manifest_or_its_digest_is_named_and_exits_1(tiny, capsys):
    root, arts = tiny
    for artifact in arts.values():
        manifest, sidecar = artifact.path / MANIFEST, artifact.path / MANIFEST_DIGEST
        name = f"{artifact.stage} {artifact.version}"
        cases = [(lambda: flip_byte(manifest, 0), f"{name} {MANIFEST}: SHA-256 differs from the one {MANIFEST_DIGEST} records"),
                 (lambda: flip_byte(manifest, manifest.stat().st_size // 2), f"{name} {MANIFEST}: SHA-256 differs"),
                 (lambda: _rows_flipped(manifest), f"{name} {MANIFEST}: SHA-256 differs"),
                 (lambda: flip_byte(sidecar, 10), f"{name} {MANIFEST_DIGEST}: not a record of the SHA-256 of {MANIFEST}"),
                 (lambda: flip_byte(sidecar, sidecar.stat().st_size - 1), f"{name} {MANIFEST_DIGEST}: not a record")]
        for damage, expected in cases:
            restore = pristine(manifest)
            damage()
            code, out = verify(root, capsys)
            assert code == 1 and len(out) == 2 and out[0].startswith(expected), out
            assert out[-1].endswith(": 1 damaged")
            restore()
    assert verify(root, capsys)[0] == 0


def test_a_damaged_manifest_refuses_the_cache_hit_in_one_line(tiny):
    root, arts = tiny
    manifest = arts["large"].path / MANIFEST
    for damage in (lambda: flip_byte(manifest, 0), lambda: _rows_flipped(manifest)):  # unreadable; readable
        restore = pristine(manifest)
        damage()
        calls: list = []
        with pytest.raises(DamagedArtifactError) as caught:
            ArtifactStore(root).materialize("passages", "1", {"n": 7}, {}, passages_build(7, calls))
        message = str(caught.value)
        assert "\n" not in message and message.startswith(f"{manifest}: SHA-256 differs from the one {MANIFEST_DIGEST}")
        assert "pforge verify --repair" in message and calls == []
        restore()
    assert ArtifactStore(root).materialize("passages", "1", {"n": 7}, {}, passages_build(7, [])).cache_hit


def test_repair_of_a_damaged_manifest_leads_the_next_build_to_make_exactly_that_version(tmp_path, capsys):
    root, calls = tmp_path / "root", []
    arts = build_tiny_store(root, calls)
    flip_byte(arts["large"].path / MANIFEST, 3)
    code, out = verify(root, capsys, "--repair")
    assert code == 1 and out[0].startswith(f"passages {arts['large'].version} {MANIFEST}: ")
    assert out[-1].startswith(f"moved passages {arts['large'].version} aside to ")
    calls.clear()
    store = ArtifactStore(root)
    again = [store.materialize("passages", "1", {"n": n}, {}, passages_build(n, calls)) for n in (4, 7)]
    assert calls == [7] and [a.cache_hit for a in again] == [True, False]
    assert again[1].version == arts["large"].version
    assert verify(root, capsys)[0] == 0


def test_a_manifest_without_its_digest_beside_it_is_not_checked_itself(tiny, capsys):
    root, arts = tiny
    (arts["small"].path / MANIFEST_DIGEST).unlink()  # as committed before the manifest's digest was kept
    code, out = verify(root, capsys)
    files = sum(len(a.manifest["files"]) + 1 for a in arts.values()) - 1
    assert code == 0 and out == [f"verified 3 artifacts, {files} files and the catalog: 0 damaged"]
    assert ArtifactStore(root).materialize("passages", "1", {"n": 4}, {}, passages_build(4, [])).cache_hit


def test_one_flipped_byte_in_the_catalog_or_its_digest_is_named_and_repair_rebuilds_it(tiny, capsys):
    root, _ = tiny
    catalog = root / "catalog.duckdb"
    size = catalog.stat().st_size
    cases = [(catalog, offset, "catalog.duckdb: SHA-256 differs from the one catalog.duckdb.sha256 records")
             for offset in (0, 9, 4096 + 100, size // 2, size - 1)]   # magic, headers, blocks, the end
    cases.append((root / "catalog.duckdb.sha256", 5, "catalog.duckdb.sha256: not a record of the SHA-256"))
    for path, offset, expected in cases:
        restore = pristine(catalog)
        flip_byte(path, offset)
        code, out = verify(root, capsys)
        assert code == 1 and len(out) == 2 and out[0].startswith(expected), (offset, out)
        restore()
    flip_byte(catalog, size // 2)
    code, out = verify(root, capsys, "--repair")
    assert code == 1 and out[-1] == f"rebuilt {catalog} from the manifests"
    assert verify(root, capsys) == (0, [out[1].replace(": 1 damaged", ": 0 damaged")])
    assert ArtifactStore(root).sql("SELECT count(*) FROM artifacts").column(0)[0].as_py() == 3


def test_either_catalog_a_rebuild_recorded_verifies(tiny, capsys):
    """A rebuild records the digests of the catalog in place and of its replacement before the
    rename, then the replacement's alone: a crash between them leaves no false alarm."""
    root, _ = tiny
    catalog, sidecar = root / "catalog.duckdb", root / "catalog.duckdb.sha256"
    old_digest, old_bytes = hashlib.sha256(catalog.read_bytes()).hexdigest(), catalog.read_bytes()
    ArtifactStore(root).reconcile(force=True)
    assert sidecar.read_text().count("\n") == 1 and old_digest not in sidecar.read_text()
    sidecar.write_text(f"{old_digest}  catalog.duckdb\n{sidecar.read_text()}")  # as the crash leaves it
    assert verify(root, capsys)[0] == 0
    catalog.write_bytes(old_bytes)  # or the other moment: the new one not yet renamed in
    assert verify(root, capsys)[0] == 0


# -- the promotions record ----------------------------------------------------------------------------
def flip_bit(path: Path, offset: int) -> None:
    """One bit of one byte: the text stays ASCII (a flipped byte, 0xFF, would not be UTF-8)."""
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))


def promoted(root: Path, arts: dict) -> Path:
    """Three promotions recorded (the last in force): the record's path."""
    store = ArtifactStore(root)
    for name in ("small", "large", "small"):
        store.catalog.record_promotion("passages", arts[name].version, note=f"{name} serves")
    store.reconcile(force=True)
    return root / PROMOTIONS_FILE


def in_force(root: Path) -> list[tuple[int, str]]:
    return [(p["seq"], p["version"]) for p in ArtifactStore(root).catalog.promotions()]


def test_each_promotion_line_records_the_sha256_of_its_fields_and_a_clean_record_verifies(tiny, capsys):
    root, arts = tiny
    ledger = promoted(root, arts)
    for line in ledger.read_text().splitlines():
        record = json.loads(line)
        digest = record.pop("sha256")
        assert digest == hashlib.sha256(json.dumps(record, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    code, out = verify(root, capsys)
    assert code == 0 and out[-1].endswith(", the catalog and the promotions record: 0 damaged"), out


@pytest.mark.parametrize("where", ["version", "note", "sha256", "brace"])
def test_a_flipped_byte_in_a_promotion_line_is_named_with_its_line_and_exits_1(tiny, capsys, where):
    root, arts = tiny
    ledger = promoted(root, arts)
    lines = ledger.read_bytes().split(b"\n")
    target = {"version": f'"{arts["large"].version}"'.encode(), "note": b'"large serves"', "sha256": b'"sha256": "',
              "brace": b"}"}[where]
    offset = sum(len(line) + 1 for line in lines[:1]) + lines[1].index(target) + (len(target) if where == "sha256" else 1)
    before = ledger.read_bytes()
    flip_bit(ledger, offset)
    code, out = verify(root, capsys)
    assert code == 1, out
    what = "not a promotion record (it does not parse)" if where == "brace" else \
        "SHA-256 differs from the one the line records"
    assert out[0] == f"promotions.jsonl: line 2: {what}" and out[-1].endswith(": 1 damaged"), out
    ledger.write_bytes(before)
    assert verify(root, capsys)[0] == 0


def test_a_record_cut_short_is_named_and_repair_keeps_every_intact_line_and_the_damaged_file(tiny, capsys):
    root, arts = tiny
    ledger = promoted(root, arts)
    lines = ledger.read_bytes().split(b"\n")
    flip_bit(ledger, len(lines[0]) + 1 + lines[1].index(b"large"))  # line 2's note changed
    os.truncate(ledger, ledger.stat().st_size - 20)  # and line 3 cut short: the file ends inside it
    damaged = ledger.read_bytes()
    code, out = verify(root, capsys, "--repair")
    assert code == 1
    assert out[:2] == ["promotions.jsonl: line 2: SHA-256 differs from the one the line records",
                       "promotions.jsonl: line 3: cut short: the file ends inside it"]
    aside = [p for p in root.iterdir() if p.name.startswith(f"{DAMAGED_PREFIX}{PROMOTIONS_FILE}-")]
    assert len(aside) == 1 and aside[0].read_bytes() == damaged  # kept for a look
    assert out[-1] == (f"kept 1 promotion(s) in {ledger} and dropped 2 damaged line(s), whose promotions no longer "
                       f"count (promote again what should serve); the damaged file is kept as {aside[0]}")
    assert ledger.read_bytes() == lines[0] + b"\n"
    assert in_force(root) == [(1, arts["small"].version)]
    assert ArtifactStore(root).sql("SELECT version FROM promotions").column(0).to_pylist() == [arts["small"].version]
    code, out = verify(root, capsys)
    assert code == 0 and out[-1].endswith("the promotions record: 0 damaged")
    ArtifactStore(root).catalog.record_promotion("passages", arts["large"].version)  # appends go on as before
    assert in_force(root) == [(1, arts["small"].version), (2, arts["large"].version)]
    assert verify(root, capsys)[0] == 0


def test_promotions_recorded_before_lines_carried_digests_are_read_and_reported_unchecked(tiny, capsys):
    root, arts = tiny
    ledger = promoted(root, arts)
    old = [json.loads(line) for line in ledger.read_text().splitlines()]
    for record in old[:2]:
        del record["sha256"]
    ledger.write_text("".join(json.dumps(record, sort_keys=True) + "\n" for record in old))
    code, out = verify(root, capsys)
    assert code == 0, out
    assert f"{ledger}: 2 promotion(s) without digests (recorded before they were): not checked" in out
    assert in_force(root) == [(1, arts["small"].version), (2, arts["large"].version), (3, arts["small"].version)]
    assert verify(root, capsys, "--repair")[0] == 0 and ledger.read_text().count("\n") == 3  # nothing to repair


def test_one_artifact_or_a_config_leaves_the_promotions_record_unchecked(tiny, capsys):
    root, arts = tiny
    ledger = promoted(root, arts)
    flip_byte(ledger, 5)
    code, out = verify(root, capsys, f"passages:{arts['small'].version}")
    assert code == 0 and "promotions" not in out[-1]
