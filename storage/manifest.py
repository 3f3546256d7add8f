"""manifest.json: the self-description of a committed artifact. Its presence inside
<stage>/<version>/ is what makes a version exist (the catalog can be rebuilt from manifests)."""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from .atomic import atomic_write
from .digests import sidecar_of, write_sidecar
from .fsutil import tree_bytes
from .hashing import file_sha256
from .parquet import parquet_columns, parquet_rows, table_dir, table_files

MANIFEST = "manifest.json"
MANIFEST_DIGEST = sidecar_of(Path(MANIFEST)).name  # what guards the manifest itself: `pforge verify`
RESERVED_KEYS = {"stage", "version", "code_version", "parameters", "inputs", "tables",
                 "bytes", "rows", "timings", "created_at", "files"}


def describe_tables(build_dir: Path, stage: str) -> dict:
    """{table: {rows, bytes, files}} from parquet footers. The default table (data/*.parquet)
    is recorded under the stage's name with "default": true."""
    tables: dict[str, dict] = {}
    data = build_dir / "data"
    if not data.is_dir():
        return tables

    def one(name: str | None) -> dict:
        files = table_files(build_dir, name)
        # the columns (from the first footer) spare the catalog a parquet read per view per rebuild
        return {"rows": sum(parquet_rows(f) for f in files),
                "bytes": sum(f.stat().st_size for f in files),
                "files": [str(f.relative_to(build_dir)) for f in files],
                "columns": parquet_columns(files[0]) if files else []}

    if table_files(build_dir, None):
        if (data / stage).is_dir():
            raise ValueError(f"stage {stage!r} has both a default table and a table named {stage!r}")
        tables[stage] = {**one(None), "default": True}
    for sub in sorted(p for p in data.iterdir() if p.is_dir()):
        if table_files(build_dir, sub.name):
            tables[sub.name] = one(sub.name)
    return tables


def describe_files(build_dir: Path) -> dict:
    """{relative path: {bytes, sha256}} for every regular file under `build_dir` but the manifest
    (it cannot hold its own digest): what `pforge verify` checks the folder against later. Links
    are left out, as fsync_tree leaves them: their target is not the artifact's to vouch for."""
    files = {}
    for path in sorted(build_dir.rglob("*")):
        relative = path.relative_to(build_dir).as_posix()
        if relative in (MANIFEST, MANIFEST + ".part", MANIFEST_DIGEST) or path.is_symlink() or not path.is_file():
            continue
        stat = path.stat()
        # mtime_ns: a cache hit re-reads a file only when it was written since (storage/verify.py)
        files[relative] = {"bytes": stat.st_size, "sha256": file_sha256(path), "mtime_ns": stat.st_mtime_ns}
    return files


def build_manifest(build_dir: Path, *, stage: str, version: str, code_version: str,
                   parameters: dict, inputs: dict, build_s: float, extra: dict | None) -> dict:
    tables = describe_tables(build_dir, stage)
    manifest = {
        "stage": stage,
        "version": version,
        "code_version": code_version,
        "parameters": parameters,
        "inputs": inputs,
        "tables": tables,
        "rows": sum(t["rows"] for t in tables.values()),
        "bytes": tree_bytes(build_dir),
        "timings": {"build_s": round(build_s, 6)},
        "created_at": datetime.now(timezone.utc).isoformat(),
        "files": describe_files(build_dir),
    }
    for key, value in (extra or {}).items():
        if key == "timings" and isinstance(value, dict):
            manifest["timings"].update(value)  # a build may report its own phase timings
        elif key in RESERVED_KEYS:
            raise ValueError(f"build returned reserved manifest field {key!r}")
        else:
            manifest[key] = value
    return manifest


def write_manifest(build_dir: Path, manifest: dict) -> None:
    # the temporary's name is one describe_files leaves out
    with atomic_write(build_dir / MANIFEST, "w", tmp=build_dir / (MANIFEST + ".part")) as f:
        json.dump(manifest, f, indent=2, sort_keys=True, default=str)
    # its own digest beside it (it cannot hold it): a flipped byte in it is found too
    write_sidecar(build_dir / MANIFEST, [file_sha256(build_dir / MANIFEST)])


def read_manifest(version_dir: Path) -> dict | None:
    try:
        with open(version_dir / MANIFEST, encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        return None
    except ValueError:  # a damaged one (not UTF-8 JSON) makes no version: `pforge verify` names it
        return None
    return manifest if isinstance(manifest, dict) else None


def parse_created_at(value: str) -> datetime:
    """ISO string -> naive UTC datetime (what DuckDB TIMESTAMP holds)."""
    dt = datetime.fromisoformat(value)
    if dt.tzinfo is not None:
        dt = dt.astimezone(timezone.utc).replace(tzinfo=None)
    return dt


__all__ = ["MANIFEST", "MANIFEST_DIGEST", "build_manifest", "describe_files", "describe_tables", "read_manifest", "write_manifest",
           "parse_created_at", "table_dir"]
