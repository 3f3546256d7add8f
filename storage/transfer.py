"""One artifact carried from one store to another: `export_artifact` writes it as an archive with a
small JSON beside it (its stage, version, SHA-256, manifest and lineage); `import_artifact` checks
the archive against that digest and commits it through the store's own atomic commit, under the
version its recorded code version, parameters and inputs give, which must be the version it
names. So an imported artifact is exactly what the planner would have built there, and the stages
that read it find it as a cache hit.

    exported = export_artifact(store, store.find("synthetic_queries"), Path("shared"))
    import_artifact(other_store, exported)
"""
from __future__ import annotations

import json
import shutil
import tarfile
import tempfile
from pathlib import Path

from .artifact import Artifact
from .atomic import atomic_write, atomic_write_text
from .hashing import file_sha256 as sha256_of  # the archive's digest, as the description records it
from .hashing import normalize
from .locks import file_lock
from .manifest import MANIFEST, MANIFEST_DIGEST, RESERVED_KEYS, read_manifest
from .paths import IMPORT_LOCK, IMPORT_PREFIX
from .store import ArtifactStore

ARCHIVE_SUFFIX = ".tar.gz"
DESCRIPTION_SUFFIX = ".json"


class TransferError(ValueError):
    """An export that cannot be imported (names the file and what is wrong with it)."""


def export_name(stage: str, version: str) -> str:
    return f"{stage}-{version}"


def export_artifact(store: ArtifactStore, artifact: Artifact, folder: Path) -> Path:
    """Writes `folder/STAGE-VERSION.tar.gz` and its description `folder/STAGE-VERSION.json`
    (returned); each appears whole or not at all."""
    folder.mkdir(parents=True, exist_ok=True)
    name = export_name(artifact.stage, artifact.version)
    archive = folder / f"{name}{ARCHIVE_SUFFIX}"
    part = folder / f".{name}{ARCHIVE_SUFFIX}.part"  # gzip records this name in the archive's header
    with atomic_write(archive, tmp=part) as out:
        with tarfile.open(part, "w:gz", fileobj=out) as tar:
            for path in sorted(artifact.path.rglob("*")):
                if path.is_file():   # a fixed order and no owner or time: the same artifact gives the same bytes
                    info = tar.gettarinfo(str(path), arcname=str(path.relative_to(artifact.path)))
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    info.mtime = 0
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
    lineage = [{k: v for k, v in row.items() if k != "path"} for row in store.lineage(artifact.stage, artifact.version)]
    description = {"stage": artifact.stage, "version": artifact.version, "archive": archive.name,
                   "sha256": sha256_of(archive), "bytes": archive.stat().st_size,
                   "rows": artifact.manifest.get("rows"), "lineage": lineage}
    path = folder / f"{name}{DESCRIPTION_SUFFIX}"
    atomic_write_text(path, json.dumps(description, indent=1, sort_keys=True, default=str) + "\n")
    return path


def read_description(path: Path) -> dict:
    try:
        description = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TransferError(f"{path}: no such export") from None
    except json.JSONDecodeError as exc:
        raise TransferError(f"{path}: not an export's description (line {exc.lineno}: {exc.msg})") from None
    missing = [k for k in ("stage", "version", "archive", "sha256") if k not in description]
    if missing:
        raise TransferError(f"{path}: not an export's description (no {', '.join(missing)})")
    return description


def _plain_members(tar: tarfile.TarFile, archive: Path) -> list[tarfile.TarInfo]:
    """The archive's files and folders, refused whole if one is a link, a device, absolute or
    reaches out of the folder with '..' (the 'data' filter of newer Pythons, on every 3.11)."""
    members = tar.getmembers()
    for member in members:
        parts = Path(member.name).parts
        if not (member.isfile() or member.isdir()) or member.name.startswith("/") or ".." in parts:
            raise TransferError(f"{archive}: member {member.name!r} is not a plain file inside the artifact")
    return members


def import_artifact(store: ArtifactStore, description_path: Path) -> Artifact:
    """The artifact an export describes, committed into `store` (a cache hit where it is there)."""
    description = read_description(description_path)
    stage, version = description["stage"], description["version"]
    existing = store.get(stage, version)
    if existing is not None:
        existing.cache_hit = True
        return existing
    archive = description_path.parent / description["archive"]
    if not archive.is_file():
        raise TransferError(f"{description_path}: its archive {archive.name} is missing")
    actual = sha256_of(archive)
    if actual != description["sha256"]:
        raise TransferError(f"{archive}: SHA-256 {actual[:16]}... differs from {description['sha256'][:16]}... that "
                            f"{description_path.name} records: the archive is damaged or was changed")
    store.require_writable()
    # Held while the archive is unpacked under the root: a store that opens meanwhile keeps the
    # folder (one it finds with the lock free is a killed import's, and goes: ArtifactStore.cleanup).
    with file_lock(store.root / IMPORT_LOCK), tempfile.TemporaryDirectory(dir=store.root, prefix=IMPORT_PREFIX) as tmp:
        unpacked = Path(tmp) / "artifact"
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(unpacked, members=_plain_members(tar, archive))
        manifest = read_manifest(unpacked)
        if manifest is None or (manifest.get("stage"), manifest.get("version")) != (stage, version):
            raise TransferError(f"{archive}: holds no manifest of {stage} {version}")
        inputs = {name: {"stage": rec.get("stage"), "version": rec["version"]}
                  for name, rec in (manifest.get("inputs") or {}).items()}
        expected = store.version_for(stage, manifest["code_version"], normalize(manifest.get("parameters") or {}),
                                     {k: r["version"] for k, r in inputs.items()})
        if expected != version:
            raise TransferError(f"{archive}: its manifest's parameters and inputs give version {expected}, not the "
                                f"{version} it names")
        # The commit writes the reserved fields anew; the build's own timings ride along as extras.
        extras = {k: v for k, v in manifest.items() if k not in RESERVED_KEYS - {"timings"}}
        extras["imported"] = {"from": description_path.name, "sha256": actual,
                              "created_at": manifest.get("created_at")}

        def copy(out: Path) -> dict:
            for item in unpacked.iterdir():
                if item.name not in (MANIFEST, MANIFEST_DIGEST):  # the commit writes both anew
                    (shutil.copytree if item.is_dir() else shutil.copy2)(item, out / item.name)
            return extras   # its own timings (the build that made it) and stats travel with it

        return store.materialize(stage, manifest["code_version"], manifest.get("parameters") or {}, inputs, copy)
