"""Checking committed artifacts against the files their manifests record (`pforge verify`).

At commit, the manifest records under `files` every file of the version folder but the manifest
itself: its size and SHA-256 (storage/manifest.py `describe_files`); the manifest's own SHA-256 is
in `manifest.json.sha256` beside it, and the catalog's in `catalog.duckdb.sha256`
(storage/digests.py). `verify_artifact` reads the manifest and each recorded file again and names
every one that is missing, has another size or another digest; a manifest that differs from its
digest is named alone (the records it holds are not to be trusted), and so is one that does not
parse. A file the record does not name is not damage (nothing finds it through the manifest). A
manifest written before digests were recorded has no `files`: its artifact is reported as
unchecked, never as damaged; one without its sidecar is not checked itself.

`refuse_damaged` is the cheap half, which the store runs on every cache hit: the manifest's digest
(a small file), one stat per recorded file, and the digest only of a file written since its commit
(its modification time differs from the one recorded), so a truncated, deleted or rewritten file
is never served as a built artifact while an untouched store costs no reading. (A copy that does
not keep modification times pays one digest per file on each cache hit; `cp -p` and `rsync -a`
keep them.)

`repair` moves each damaged version folder aside to `<stage>/.damaged-<version>-<stamp>/`, which is
kept for inspection (the store never deletes it: remove it by hand once looked at), and rebuilds
the catalog from the manifests (a damaged catalog is replaced so). The version is then no longer
built, so the next run that needs it builds it again, under the same version.

The promotions record (storage/promotions.py) vouches for itself line by line: `verify_promotions`
names each damaged line, and `repair_promotions` keeps the lines that are records and moves the
damaged file aside (kept too).
"""
from __future__ import annotations

import os
import time
from contextlib import nullcontext
from stat import S_ISREG
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from . import paths
from .artifact import Artifact
from .digests import digest_damage, sidecar_of
from .fsutil import fsync_dir, read_only_reason
from .hashing import file_sha256
from .locks import file_lock
from .manifest import MANIFEST
from .promotions import (PROMOTIONS_FILE, LedgerCheck, LedgerRepair, check_ledger, checking_lock, ledger_path,
                         read_ledger, repair_ledger)

if TYPE_CHECKING:  # the store imports this module; only its type is needed here
    from .store import ArtifactStore

REPAIR_HINT = "run `pforge verify --repair`, then rerun to rebuild it"
UNREADABLE = "not a manifest of this version (it does not parse, or names another)"


class DamagedArtifactError(RuntimeError):
    """A committed artifact whose files no longer match its manifest (one line naming the file)."""


@dataclass(frozen=True)
class Damage:
    """One file of a committed version (or of the root: the catalog) that does not match its record."""
    stage: str | None     # None: a file of the root itself
    version: str | None
    path: str   # relative to the version folder (or the root), as the manifest records it
    what: str   # "missing", "12 bytes, 40 recorded", "SHA-256 differs from the recorded one"

    def __str__(self) -> str:
        where = f"{self.stage} {self.version} " if self.stage is not None else ""
        return f"{where}{self.path}: {self.what}"


@dataclass
class StoreReport:
    """What `verify_store` found."""
    artifacts: int = 0  # artifacts checked (those with digests recorded)
    files: int = 0      # files checked (their manifests among them)
    damaged: list[Damage] = field(default_factory=list)
    unrecorded: list[Artifact] = field(default_factory=list)  # committed before digests were recorded


@dataclass(frozen=True)
class MovedAside:
    """A damaged version `repair` took out of the store, and where its folder now is."""
    stage: str
    version: str
    folder: Path


def recorded_files(artifact: Artifact) -> dict | None:
    """The manifest's {relative path: {bytes, sha256}}, or None for a manifest without digests."""
    return artifact.manifest.get("files")


def _size_damage(artifact: Artifact, relative: str, record: dict, stat: os.stat_result | None) -> Damage | None:
    if stat is None:
        return Damage(artifact.stage, artifact.version, relative, "missing")
    if stat.st_size != record["bytes"]:
        return Damage(artifact.stage, artifact.version, relative, f"{stat.st_size:,} bytes, {record['bytes']:,} recorded")
    return None


def _stat_of_file(path: Path) -> os.stat_result | None:
    """The file's stat, or None when it is missing or not a regular file (one system call)."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat if S_ISREG(stat.st_mode) else None


def _digest_damage(artifact: Artifact, relative: str, record: dict) -> Damage | None:
    if file_sha256(artifact.path / relative) != record["sha256"]:
        return Damage(artifact.stage, artifact.version, relative, "SHA-256 differs from the recorded one")
    return None


def _manifest_damage(stage: str, version: str, folder: Path) -> Damage | None:
    """The manifest (or its sidecar) when it differs from the digest its sidecar records."""
    found = digest_damage(folder / MANIFEST)
    return Damage(stage, version, *found) if found is not None else None


def _checked(artifact: Artifact, quick: bool) -> list[Damage]:
    manifest = _manifest_damage(artifact.stage, artifact.version, artifact.path)
    if manifest is not None:
        return [manifest]  # what it records of the other files is not to be trusted
    damaged = []
    for relative, record in (recorded_files(artifact) or {}).items():
        stat = _stat_of_file(artifact.path / relative)
        damage = _size_damage(artifact, relative, record, stat)
        written_since = record.get("mtime_ns") is not None and stat is not None and stat.st_mtime_ns != record["mtime_ns"]
        if damage is None and (written_since or not quick):
            damage = _digest_damage(artifact, relative, record)
        if damage is not None:
            damaged.append(damage)
    return damaged


def check_files_quickly(artifact: Artifact) -> list[Damage]:
    """The manifest when it differs from its digest; else the recorded files that are missing, have
    another size, or were written since the commit and have another digest: a stat per file, a
    read only of a file modified since."""
    return _checked(artifact, quick=True)


def verify_artifact(artifact: Artifact) -> list[Damage]:
    """The manifest when it differs from its digest; else every recorded file that is missing, has
    another size or another SHA-256 (each read whole)."""
    return _checked(artifact, quick=False)


def _refusal(folder: Path, damage: Damage) -> DamagedArtifactError:
    return DamagedArtifactError(f"{folder / damage.path}: {damage.what}; {damage.stage} {damage.version} "
                                f"is damaged: {REPAIR_HINT}")


def refuse_damaged(artifact: Artifact) -> None:
    """Raise DamagedArtifactError, naming the first bad file, when the manifest differs from its
    digest or a recorded file is missing, has another size, or was rewritten with other bytes
    (check_files_quickly: cache hits stay fast)."""
    damaged = check_files_quickly(artifact)
    if damaged:
        raise _refusal(artifact.path, damaged[0])


def _unreadable(stage: str, version: str, folder: Path) -> Damage:
    return _manifest_damage(stage, version, folder) or Damage(stage, version, MANIFEST, UNREADABLE)


def unreadable_manifest(stage: str, version: str, folder: Path) -> DamagedArtifactError:
    """The refusal of a version whose manifest.json is there but is not one of it (a cache hit's)."""
    return _refusal(folder, _unreadable(stage, version, folder))


def version_keys(store: ArtifactStore) -> list[tuple[str, str]]:
    """(stage, version) of every committed version, oldest first, then of every version folder
    whose manifest.json does not parse or names another version (damaged: the store skips it)."""
    committed = [(row["stage"], row["version"]) for row in store.list_artifacts()]
    known = set(committed)
    unreadable = []
    for stage in sorted(p for p in store.root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for folder in sorted(stage.iterdir()):
            key = (stage.name, folder.name)
            if not folder.name.startswith(".") and key not in known and (folder / MANIFEST).is_file():
                unreadable.append(key)
    return committed + unreadable


def verify_store(store: ArtifactStore, versions: Iterable[tuple[str, str]] | None = None,
                 progress: Callable[[int, int, Artifact], None] | None = None) -> StoreReport:
    """Verify the (stage, version) pairs of `versions` that are built (default: every version of
    `store`, `version_keys`), reading every recorded file; `progress(i, n, artifact)` is told before
    each (reading a large store takes a while). A folder whose manifest does not parse is damage."""
    report = StoreReport()
    todo = version_keys(store) if versions is None else list(versions)
    for i, (stage, version) in enumerate(todo, 1):
        artifact = store.get(stage, version)
        folder = paths.version_dir(store.root, stage, version)
        if artifact is None:
            if paths.is_plain_name(stage) and paths.is_plain_name(version) and (folder / MANIFEST).is_file():
                report.damaged.append(_unreadable(stage, version, folder))
            continue  # else not built
        if progress is not None:
            progress(i, len(todo), artifact)
        damaged, files = verify_artifact(artifact), recorded_files(artifact)
        if files is None and not damaged:
            report.unrecorded.append(artifact)
            continue
        report.artifacts += 1
        report.files += len(files or {}) + sidecar_of(folder / MANIFEST).exists()
        report.damaged += damaged
    return report


def verify_catalog(root: Path) -> tuple[bool, list[Damage]]:
    """Whether the root's catalog has a digest recorded (one from before digests were, or a root
    without a catalog yet, has none), and its damage. Run it before the store opens: an open that
    cannot read the catalog rebuilds it. Rebuilds wait meanwhile (they replace file and digest)."""
    catalog = root / paths.CATALOG_FILE
    if not catalog.is_file():
        return False, []
    writable = read_only_reason(root) is None  # nothing rebuilds a read-only root's
    with file_lock(root / paths.CATALOG_LOCK) if writable else nullcontext():
        found = digest_damage(catalog)
        recorded = sidecar_of(catalog).exists()
    return recorded, [Damage(None, None, *found)] if found is not None else []


def verify_promotions(root: Path) -> tuple[LedgerCheck | None, list[Damage]]:
    """The promotions record's lines (None: nothing was ever promoted) and its damage, one Damage
    per damaged line, naming the file and the line. Appends wait meanwhile."""
    if not ledger_path(root).is_file():
        return None, []
    with checking_lock(root, writable=read_only_reason(root) is None):
        check = check_ledger(read_ledger(root))
    return check, [Damage(None, None, PROMOTIONS_FILE, f"line {line}: {what}") for line, what in check.damaged]


def _repair_stamp() -> str:
    """What tells apart the folders and files one repair moves aside from another's."""
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}"


def repair_promotions(store: ArtifactStore) -> LedgerRepair | None:
    """The promotions record without its damaged lines, the damaged file kept aside (None when
    no line is damaged); run before `repair`, whose catalog rebuild then indexes what is kept."""
    return repair_ledger(store.root, _repair_stamp())


def repair(store: ArtifactStore, damaged: Iterable[Damage]) -> list[MovedAside]:
    """Move each version named in `damaged` aside to a `.damaged-` folder beside it (kept, for
    inspection), then rebuild the catalog from the manifests: the version is no longer built, and
    the next run that plans it rebuilds it (tasks.engine.not_needed never leaves it out); a damaged
    catalog is replaced too."""
    stamp = _repair_stamp()
    moved = []
    for stage, version in sorted({(d.stage, d.version) for d in damaged if d.stage is not None}):
        folder = paths.version_dir(store.root, stage, version)
        aside = paths.damaged_dir(store.root, stage, version, stamp)
        with file_lock(paths.lock_file(store.root, stage, version)):  # not under a writer that holds it
            if folder.is_dir():
                os.rename(folder, aside)
                fsync_dir(folder.parent)
                moved.append(MovedAside(stage, version, aside))
    store.reconcile(force=True)
    return moved
