"""Checking committed artifacts against the files their manifests record (`pforge verify`).

At commit, the manifest records under `files` every file of the version folder but the manifest
itself: its size and SHA-256 (storage/manifest.py `describe_files`). `verify_artifact` reads each
recorded file again and names every one that is missing, has another size or another digest. A
file the record does not name is not damage (nothing finds it through the manifest). A manifest
written before digests were recorded has no `files`: its artifact is reported as unchecked, never
as damaged.

`refuse_damaged` is the cheap half, which the store runs on every cache hit: one stat per file, and
the digest only of a file written since its commit (its modification time differs from the one
recorded), so a truncated, deleted or rewritten file is never served as a built artifact while an
untouched store costs no reading. (A copy that does not keep modification times pays one digest
per file on each cache hit; `cp -p` and `rsync -a` keep them.)

`repair` moves each damaged version folder aside to `<stage>/.damaged-<version>-<stamp>/`, which is
kept for inspection (the store never deletes it: remove it by hand once looked at), and rebuilds
the catalog from the manifests. The version is then no longer built, so the next run that needs it
builds it again, under the same version.
"""
from __future__ import annotations

import os
import time
from stat import S_ISREG
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from . import paths
from .artifact import Artifact
from .fsutil import fsync_dir
from .hashing import file_sha256
from .locks import file_lock

if TYPE_CHECKING:  # the store imports this module; only its type is needed here
    from .store import ArtifactStore

REPAIR_HINT = "run `pforge verify --repair`, then rerun to rebuild it"


class DamagedArtifactError(RuntimeError):
    """A committed artifact whose files no longer match its manifest (one line naming the file)."""


@dataclass(frozen=True)
class Damage:
    """One recorded file of a committed version that does not match its record."""
    stage: str
    version: str
    path: str   # relative to the version folder, as the manifest records it
    what: str   # "missing", "12 bytes, 40 recorded", "SHA-256 differs from the recorded one"

    def __str__(self) -> str:
        return f"{self.stage} {self.version} {self.path}: {self.what}"


@dataclass
class StoreReport:
    """What `verify_store` found."""
    artifacts: int = 0  # artifacts checked (those with digests recorded)
    files: int = 0      # files checked
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


def check_files_quickly(artifact: Artifact) -> list[Damage]:
    """The recorded files that are missing, have another size, or were written since the commit
    and have another digest: a stat per file, a read only of a file modified since."""
    damaged = []
    for relative, record in (recorded_files(artifact) or {}).items():
        stat = _stat_of_file(artifact.path / relative)
        damage = _size_damage(artifact, relative, record, stat)
        written_since = record.get("mtime_ns") is not None and stat is not None and stat.st_mtime_ns != record["mtime_ns"]
        if damage is None and written_since:
            damage = _digest_damage(artifact, relative, record)
        if damage is not None:
            damaged.append(damage)
    return damaged


def verify_artifact(artifact: Artifact) -> list[Damage]:
    """Every recorded file that is missing, has another size or another SHA-256 (each read whole)."""
    damaged = []
    for relative, record in (recorded_files(artifact) or {}).items():
        stat = _stat_of_file(artifact.path / relative)
        damage = _size_damage(artifact, relative, record, stat) or _digest_damage(artifact, relative, record)
        if damage is not None:
            damaged.append(damage)
    return damaged


def refuse_damaged(artifact: Artifact) -> None:
    """Raise DamagedArtifactError, naming the first bad file, when a recorded file is missing, has
    another size, or was rewritten with other bytes (check_files_quickly: cache hits stay fast)."""
    damaged = check_files_quickly(artifact)
    if damaged:
        first = damaged[0]
        raise DamagedArtifactError(f"{artifact.path / first.path}: {first.what}; {artifact.stage} {artifact.version} "
                                   f"is damaged: {REPAIR_HINT}")


def committed_artifacts(store: ArtifactStore) -> list[Artifact]:
    """Every committed version of the store, oldest first."""
    found = (store.get(row["stage"], row["version"]) for row in store.list_artifacts())
    return [artifact for artifact in found if artifact is not None]


def verify_store(store: ArtifactStore, artifacts: Iterable[Artifact] | None = None,
                 progress: Callable[[int, int, Artifact], None] | None = None) -> StoreReport:
    """Verify `artifacts` (default: every committed version of `store`), reading every recorded file;
    `progress(i, n, artifact)` is told before each (reading a large store takes a while)."""
    report = StoreReport()
    todo = committed_artifacts(store) if artifacts is None else list(artifacts)
    for i, artifact in enumerate(todo, 1):
        if progress is not None:
            progress(i, len(todo), artifact)
        files = recorded_files(artifact)
        if files is None:
            report.unrecorded.append(artifact)
            continue
        report.artifacts += 1
        report.files += len(files)
        report.damaged += verify_artifact(artifact)
    return report


def repair(store: ArtifactStore, damaged: Iterable[Damage]) -> list[MovedAside]:
    """Move each version named in `damaged` aside to a `.damaged-` folder beside it (kept, for
    inspection), then rebuild the catalog from the manifests: the version is no longer built, and
    the next run that plans it rebuilds it (tasks.engine.not_needed never leaves it out)."""
    stamp = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}"
    moved = []
    for stage, version in sorted({(d.stage, d.version) for d in damaged}):
        folder = paths.version_dir(store.root, stage, version)
        aside = paths.damaged_dir(store.root, stage, version, stamp)
        with file_lock(paths.lock_file(store.root, stage, version)):  # not under a writer that holds it
            if folder.is_dir():
                os.rename(folder, aside)
                fsync_dir(folder.parent)
                moved.append(MovedAside(stage, version, aside))
    store.reconcile(force=True)
    return moved
