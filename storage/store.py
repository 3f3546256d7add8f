"""ArtifactStore: versioned, immutable, atomically committed stage outputs.

Commit protocol (a crash at any point leaves the whole artifact or nothing visible):
  1. lock <stage>/.locks/<version>.lock (flock; a concurrent writer of the same version waits,
     then finds the manifest and reuses the result)
  2. build into <stage>/.tmp-<version>-<pid>-<random>/
  3. write manifest.json, fsync every file and dir, rename to <stage>/<version>, fsync <stage>
  4. rebuild the DuckDB catalog from the manifests and swap it in (storage/catalog.py)
A crash before 3 leaves a tmp dir whose lock nobody holds: the next open deletes it.
A crash between 3 and 4 leaves a committed folder the catalog lacks: the next open rebuilds it.
An error in 4 (a full disk) withdraws the folder: a stage reported failed is never in the store.

The store keeps an index of the committed manifests, scanned once when it opens: open one store
per flow run and pass it around, rather than reopening it per stage.

A root this process cannot write (a read-only mount, no write permission) opens read-only
(`store.read_only`): no cleanup, no lock, nothing written; readers read the catalog on disk when it
is current, else a private one (storage/catalog.py); writers refuse it (`require_writable`).
"""
from __future__ import annotations

import errno
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import pyarrow as pa

from . import paths
from .artifact import Artifact
from .catalog import Catalog, fingerprint, parse_json_columns, row_from_manifest
from .atomic import atomic_dir
from .errors import StoreWriteError, is_disk_full, write_error
from .fsutil import read_only_reason, remove_tree
from .hashing import canonical_json, normalize, version_for
from .locks import file_lock
from .manifest import MANIFEST, build_manifest, parse_created_at, read_manifest, write_manifest
from .verify import refuse_damaged, unreadable_manifest

BuildFn = Callable[[Path], "dict | None"]
Progress = Callable[[str], Any]
logger = logging.getLogger("passage_forge")


class MissingStoreError(FileNotFoundError):
    """A read-only command named a root that does not exist (a typo must not make a new store)."""


class ReadOnlyStoreError(StoreWriteError):
    """A writer (a run, gc, a promotion, an import) was given a root this process cannot write."""

    def __init__(self, root: Path, reason: str):
        super().__init__(errno.EROFS, f"{root}: the artifact store is read-only ({reason}); writers need a writable root")


def require_writable_root(root: Path) -> None:
    """Refuse a root this process cannot write (or cannot make, when it is missing) with
    ReadOnlyStoreError, before a writer touches it; opens nothing and creates nothing."""
    if root.exists() and not root.is_dir():
        raise not_a_store(root)
    reason = read_only_reason(root)
    if reason is not None:
        raise ReadOnlyStoreError(root, reason)


def not_a_store(root: Path) -> MissingStoreError:
    what = "it is a file, not a folder" if root.exists() else "the folder does not exist"
    return MissingStoreError(f"{root}: no artifact store there ({what}); check --root or "
                             f"${paths.ENV_HOME}, or build one with `pforge run`")


class ArtifactStore:
    """The artifact store under one root folder: `<root>/<stage>/<version>/` holds an artifact's
    `data/*.parquet` (or `model/`, `index/`) and its `manifest.json`; `<root>/catalog.duckdb` is
    the DuckDB index of every manifest, with a view per table of each stage's latest version.

    Open one store per process (or flow run) and pass it around: opening scans the manifests,
    removes the leftovers of builds that died and rebuilds the catalog if it is stale.

    Examples:
        ```python
        from storage import ArtifactStore, resolve_root

        store = ArtifactStore(resolve_root(None), create=False)  # --root, $PFORGE_HOME, ./artifacts
        passages = store.latest("passages").read_table()
        store.sql("SELECT split, count(*) FROM questions GROUP BY 1")
        ```
    """

    def __init__(self, root: Path | str, create: bool = True, writable: bool = False):
        """Open the store at `root`.

        Args:
            root: the artifact root (`~` is expanded; kept absolute).
            create: make the folder when it is missing. `False` (commands that only read, promote
                or gc) refuses a missing root instead of making an empty store there.
            writable: refuse a root this process cannot write before touching anything: what the
                commands that write open the store with. Without it such a root opens read-only.

        Raises:
            MissingStoreError: `root` is a file, or `create=False` and it is not a folder.
            ReadOnlyStoreError: `writable` and the root is read-only, or it is missing and cannot be made.
        """
        self.root = Path(root).expanduser().resolve()
        if (not create or self.root.exists()) and not self.root.is_dir():  # a file is never one
            raise not_a_store(self.root)
        self.read_only_reason = read_only_reason(self.root)  # None: writable
        self.read_only = self.read_only_reason is not None
        if self.read_only and (writable or not self.root.is_dir()):
            self.require_writable()
        self.root.mkdir(parents=True, exist_ok=True)
        self.catalog = Catalog(self.root)
        self._index: dict[tuple[str, str], tuple[dict, Path]] = {}
        self.cleanup()
        self.reconcile()

    def require_writable(self) -> None:
        """Refuse, in one line naming the root, to write into a read-only one (ReadOnlyStoreError)."""
        if self.read_only:
            raise ReadOnlyStoreError(self.root, self.read_only_reason)

    # -- disk scanning ---------------------------------------------------------------
    def _stage_dirs(self) -> list[Path]:
        return sorted(p for p in self.root.iterdir()
                      if p.is_dir() and not p.name.startswith(".") and p.name != paths.CATALOG_FILE)

    @staticmethod
    def _committed_in(sdir: Path) -> dict[tuple[str, str], tuple[dict, Path]]:
        found = {}
        for vdir in sdir.iterdir() if sdir.is_dir() else ():
            if vdir.name.startswith(".") or not vdir.is_dir():
                continue
            manifest = read_manifest(vdir)
            # Only renamed-in folders whose manifest agrees with their place count.
            if manifest and manifest.get("stage") == sdir.name and manifest.get("version") == vdir.name:
                found[(sdir.name, vdir.name)] = (manifest, vdir)
        return found

    def _committed_on_disk(self) -> dict[tuple[str, str], tuple[dict, Path]]:
        found = {}
        for sdir in self._stage_dirs():
            found.update(self._committed_in(sdir))
        return found

    def cleanup(self) -> list[Path]:
        """Delete tmp dirs of dead builds (their version lock is free) and gc leftovers. A read-only
        root keeps them (nothing can be deleted there; readers never see them)."""
        if self.read_only:
            return []
        removed = []
        for sdir in self._stage_dirs():
            for child in sdir.iterdir():
                if child.name.startswith(paths.TRASH_PREFIX):
                    remove_tree(child)
                    removed.append(child)
                    continue
                version = paths.tmp_dir_version(child.name)
                if version is None:
                    continue
                with file_lock(paths.lock_file(self.root, sdir.name, version), blocking=False) as held:
                    if held:  # no live builder holds this version: the dir is a leftover
                        remove_tree(child)
                        removed.append(child)
        if any(self.root.glob(paths.IMPORT_PREFIX + "*")):  # a killed `pforge import`'s unpacked archive
            with file_lock(self.root / paths.IMPORT_LOCK, blocking=False) as held:
                for child in self.root.glob(paths.IMPORT_PREFIX + "*") if held else ():
                    remove_tree(child)
                    removed.append(child)
        return removed

    def reconcile(self, force: bool = False) -> bool:
        """Rescan the committed folders; rebuild the catalog if it was built from something else
        (a crash between rename and catalog, another process's commit, gc). True if rebuilt. On a
        read-only root the rebuilt catalog is a private one, outside the root."""
        if self.read_only:
            return self._reconcile_read_only()
        with self.catalog.rebuilding():
            self.catalog.remove_leftovers()
            self._index = self._committed_on_disk()
            if not force and self.catalog.built_from() == fingerprint(self._index):
                return False
            self.catalog.rebuild(self._index)
            return True

    def _reconcile_read_only(self) -> bool:
        self._index = self._committed_on_disk()
        rebuilt = self.catalog.serve_read_only(self._index)
        if rebuilt:
            logger.warning("%s: the artifact store is read-only (%s) and its catalog is stale or missing: reading a "
                           "private catalog built in %s", self.root, self.read_only_reason, self.catalog.path)
        return rebuilt

    # -- versions ---------------------------------------------------------------------
    def version_for(self, stage: str, code_version: str, params: dict, inputs: Mapping[str, str]) -> str:
        # Artifacts are accepted too: only their version enters the hash.
        return version_for(stage, code_version, params,
                           {k: getattr(v, "version", v) for k, v in (inputs or {}).items()})

    def _input_record(self, value: Any) -> dict:
        if isinstance(value, Artifact):
            return {"stage": value.stage, "version": value.version}
        if isinstance(value, Mapping) and "version" in value:
            return {"stage": value.get("stage"), "version": str(value["version"])}
        if isinstance(value, str):
            stages = self.stages_of(value)
            return {"stage": stages[0] if len(stages) == 1 else None, "version": value}
        raise TypeError(f"input must be an Artifact, a version string or {{stage, version}}, got {type(value).__name__}")

    # -- reading ---------------------------------------------------------------------
    def _load(self, stage: str, version: str, cache_hit: bool = False) -> Artifact | None:
        if not (paths.is_plain_name(stage) and paths.is_plain_name(version)):
            return None  # "../other-root/x" is no version of this store
        vdir = paths.version_dir(self.root, stage, version)
        manifest = read_manifest(vdir)
        if manifest is None or manifest.get("stage") != stage or manifest.get("version") != version:
            return None
        return Artifact(stage=stage, version=version, path=vdir, manifest=manifest, cache_hit=cache_hit)

    def moved_aside(self, stage: str, version: str) -> bool:
        """Whether `pforge verify --repair` moved this version aside as damaged (its folder kept)."""
        if not (paths.is_plain_name(stage) and paths.is_plain_name(version)):
            return False
        return any(paths.stage_dir(self.root, stage).glob(f"{paths.DAMAGED_PREFIX}{version}-*"))

    def get(self, stage: str, version: str) -> Artifact | None:
        """The committed artifact `stage`/`version`, or None when the store does not hold it.

        This is what "built" means (`pforge plan`, a cache hit in `pforge run`): the version's
        folder holds a manifest that names it. A name that is not a plain folder name (a path,
        `..`) is never found."""
        # The folder is the truth (a committed folder is complete even before its catalog row).
        return self._load(stage, version)

    def latest(self, stage: str, variant: Mapping[str, str] | None = None) -> Artifact | None:
        """Newest committed version by created_at (a later cache hit on an older one does not
        make it latest); with `variant`, the newest of that variant (e.g. one system's)."""
        # Rescan this stage's folder: another process may have committed since the store opened.
        self._index.update(self._committed_in(paths.stage_dir(self.root, stage)))
        mine = [(parse_created_at(m["created_at"]), v) for (s, v), (m, p) in self._index.items()
                if s == stage and p.is_dir() and (variant is None or (m.get("variant") or {}) == dict(variant))]
        return self._load(stage, max(mine)[1]) if mine else None

    def find(self, spec: str) -> Artifact:
        """The artifact `spec` names: `STAGE` (its latest version), `STAGE:VERSION` or a bare
        `VERSION` (as `pforge run` prints it), a version possibly shortened to a unique prefix.
        ValueError (one line, naming the root) when nothing or several match."""
        spec = spec.strip()
        self._index = self._committed_on_disk()
        stages = sorted({s for s, _ in self._index})
        stage, _, version = spec.rpartition(":") if ":" in spec else ("", "", spec)
        if not stage and version in stages:  # a stage name alone: its latest version
            return self.latest(version)
        if stage and stage not in stages:
            raise ValueError(f"{self.root}: no artifact of stage {stage!r}; stages: {', '.join(stages) or '(none)'}")
        matches = sorted((s, v) for s, v in self._index
                         if version and v.startswith(version) and (not stage or s == stage))
        if len(matches) == 1:
            return self._load(*matches[0])
        if matches:
            raise ValueError(f"{self.root}: {spec!r} matches several artifacts: "
                             + ", ".join(f"{s}:{v}" for s, v in matches[:10]))
        raise ValueError(f"{self.root}: no artifact {spec!r}; give a stage ({', '.join(stages) or 'none yet'}), "
                         "STAGE:VERSION or a version")

    def stages_of(self, version: str) -> list[str]:
        """The stages that hold an artifact of this exact version (as the store last scanned)."""
        return sorted(s for s, v in self._index if v == version)

    def list_artifacts(self, stage: str | None = None) -> list[dict]:
        """Catalog rows (from the manifests, rescanned), oldest first; parameters and inputs parsed from JSON."""
        self._index = self._committed_on_disk()
        rows = [parse_json_columns(row_from_manifest(m, p)) for (s, _), (m, p) in self._index.items()
                if stage is None or s == stage]
        return sorted(rows, key=lambda r: (r["created_at"], r["stage"], r["version"]))

    def sql(self, query: str, params: list | None = None) -> pa.Table:
        """Run one read-only statement over the catalog, as `pforge sql` does.

        Args:
            query: SELECT, SHOW, DESCRIBE, EXPLAIN, PRAGMA or CALL over the `artifacts` and
                `promotions` tables and the views (`passages`, `metrics`, `negatives`, ...).
            params: values for `$1`, `$2`, ... bound by DuckDB (never format values into `query`).

        Returns:
            The result as an Arrow table.

        Raises:
            CatalogError: bad SQL, an unknown view, a missing parameter, or a statement that writes.
        """
        return self.catalog.query(query, params)

    def lineage(self, stage: str, version: str) -> list[dict]:
        """The artifact and every transitive input, breadth-first, each once at its smallest depth
        (`pforge artifacts --lineage`).

        Returns:
            One dict per artifact, with stage, version, parameters, inputs, code_version,
            created_at, path and depth (0 for the artifact itself). An input no longer in the store
            (removed by gc) has `missing` set and no parameters.
        """
        out: list[dict] = []
        seen: set[tuple[str, str]] = set()
        frontier: list[tuple[str | None, str, int]] = [(stage, version, 0)]
        while frontier:
            s, v, depth = frontier.pop(0)
            if s is None:
                found = self.stages_of(v)
                s = found[0] if found else None
            if (s, v) in seen:
                continue
            seen.add((s, v))
            art = self._load(s, v) if s else None
            if art is None:
                out.append({"stage": s, "version": v, "parameters": None, "inputs": None,
                            "depth": depth, "missing": True})
                continue
            m = art.manifest
            out.append({"stage": s, "version": v, "parameters": m.get("parameters", {}),
                        "inputs": m.get("inputs", {}), "code_version": m.get("code_version"),
                        "created_at": m.get("created_at"), "path": str(art.path), "depth": depth})
            for rec in m.get("inputs", {}).values():
                frontier.append((rec.get("stage"), rec["version"], depth + 1))
        return out

    # -- writing ---------------------------------------------------------------------
    def materialize(self, stage: str, code_version: str, params: dict, inputs: Mapping[str, Any] | None,
                    build: BuildFn, progress: Progress | None = None) -> Artifact:
        """Return the artifact for (stage, code_version, params, inputs), building it if absent.

        The version is the content hash of the four; when it exists the call is a cache hit and
        `build` is not called. Otherwise `build(folder)` writes into a temporary folder, which is
        committed atomically (manifest, fsync, rename, catalog) under a lock, so concurrent writers
        of one version build it once.

        Args:
            stage: the artifact's stage name (a folder and a catalog view: letters, digits, `_`, `-`).
            code_version: bump it when the builder's output for the same inputs changes.
            params: the builder's parameters, as JSON values (recorded in the manifest).
            inputs: input name -> an `Artifact`, a version string or `{stage, version}`.
            build: writes the artifact into the folder it is given (Parquet through
                `write_table`); may return `{"stats": ...}` and other manifest extras.
            progress: called with short status strings (cache hit, building, committed).

        Returns:
            The committed artifact; `cache_hit` says whether it was already there.

        Raises:
            StoreWriteError: the disk filled while building or committing (nothing is registered).
            DamagedArtifactError: the version exists but a file its manifest records is missing or
                has another size (see `_cache_hit`).
        """
        paths.check_name("stage", stage)
        say = progress or (lambda _msg: None)
        params_n = normalize(params or {})
        input_recs = {name: self._input_record(v) for name, v in (inputs or {}).items()}
        version = self.version_for(stage, code_version, params_n,
                                   {k: r["version"] for k, r in input_recs.items()})
        final = paths.version_dir(self.root, stage, version)

        if (final / MANIFEST).exists():
            return self._cache_hit(stage, version, say)

        self.require_writable()  # a read-only root serves its cache hits, builds nothing
        with file_lock(paths.lock_file(self.root, stage, version)):
            if (final / MANIFEST).exists():  # another writer finished while we waited
                return self._cache_hit(stage, version, say)
            if final.exists():  # not ours and not committed: cannot happen via rename; clear it
                remove_tree(final)
            say(f"building {stage}/{version}")

            def build_into(tmp: Path) -> tuple[dict, float]:
                t0 = time.perf_counter()
                extra = build(tmp)
                build_s = time.perf_counter() - t0
                manifest = build_manifest(tmp, stage=stage, version=version, code_version=str(code_version),
                                          parameters=params_n, inputs=input_recs, build_s=build_s,
                                          extra=normalize(extra) if extra else None)
                write_manifest(tmp, manifest)
                return manifest, build_s

            try:
                # the temporary's name is the one cleanup() knows (paths.tmp_dir_version)
                manifest, build_s = atomic_dir(final, build_into, tmp=paths.new_tmp_dir(self.root, stage, version),
                                               replace=False)
            except BaseException as exc:
                # renamed in, only syncing its folder entry failed: withdrawn, as a failed registration is
                renamed = not isinstance(exc, FileExistsError) and final.exists()
                if renamed:
                    self._withdraw(final)
                if isinstance(exc, Exception) and is_disk_full(exc):
                    raise write_error(self.root, f"{'committing' if renamed else 'building'} {stage}", exc) from exc
                raise
            try:
                # Still under the version lock: a waiting writer sees the catalog row when it wakes.
                self.register(manifest, final)
            except Exception as exc:
                # The report must match the store: a stage that fails here (a full disk while the
                # catalog is written) is withdrawn, not left to appear once space is freed. The
                # catalog in place never listed it (it is swapped in last).
                self._index.pop((stage, version), None)
                self._withdraw(final)
                if isinstance(exc, OSError) and is_disk_full(exc):
                    raise write_error(self.root, f"committing {stage}", exc) from exc
                raise
            remove_tree(paths.work_dir(self.root, stage, version))  # a resumable build's scratch
        say(f"committed {stage}/{version} ({manifest['rows']} rows, {build_s:.2f}s)")
        return Artifact(stage=stage, version=version, path=final, manifest=manifest, cache_hit=False)

    def _withdraw(self, vdir: Path) -> None:
        """Make a version folder vanish at once (rename), then delete it; the caller holds its lock."""
        if vdir.exists():
            trash = vdir.parent / f"{paths.TRASH_PREFIX}{vdir.name}-{os.getpid()}"
            os.rename(vdir, trash)
            remove_tree(trash)

    def register(self, manifest: dict, path: Path) -> None:
        """Record a committed artifact: index it and rebuild the catalog (which rescans the disk,
        so other processes' commits appear too)."""
        self._index[(manifest["stage"], manifest["version"])] = (manifest, path)
        self.reconcile(force=True)

    def work_dir(self, stage: str, code_version: str, params: dict, inputs: Mapping[str, Any] | None) -> Path:
        """The scratch folder a resumable build of this version keeps its finished shards in."""
        version = self.version_for(stage, code_version, normalize(params or {}),
                                   {k: self._input_record(v)["version"] for k, v in (inputs or {}).items()})
        return paths.work_dir(self.root, stage, version)

    def _cache_hit(self, stage: str, version: str, say: Progress) -> Artifact:
        """The committed version, unless it is damaged: a recorded file missing or of another size
        raises DamagedArtifactError (one line naming the file, telling to run `pforge verify
        --repair`) rather than serving it or silently building over it, since the damage may be
        worth a look. Sizes only, one stat per file: a cache hit stays fast (digests are verify's)."""
        art = self._load(stage, version, cache_hit=True)
        if art is None:  # its manifest.json is there, but does not parse or names another version
            raise unreadable_manifest(stage, version, paths.version_dir(self.root, stage, version))
        refuse_damaged(art)
        # Heal a commit whose catalog rebuild was lost (crash after rename) without a reopen.
        if (stage, version) not in self._index:
            self.register(art.manifest, art.path)
        say(f"cache hit {stage}/{version}")
        return art

    # -- garbage collection -------------------------------------------------------------
    def gc_plan(self, keep_latest: int = 1) -> list[dict]:
        """What `gc(keep_latest)` would delete: catalog rows plus `disk_bytes` (measured on disk).

        Kept: the `keep_latest` newest versions of each stage and variant (one per system, say);
        every promoted version (`pforge promote`) and the newest `keep_latest` of each stage and
        variant among its direct consumers (a promoted encoder's embeddings and runs, which its
        index comes with), since those are what a promotion serves; and everything a kept
        artifact (transitively) uses as input."""
        if keep_latest < 1:
            raise ValueError(f"gc: keep_latest must be >= 1, got {keep_latest}")
        rows = self.list_artifacts()
        promoted = {(p["stage"], p["version"]) for p in self.catalog.promotions()}
        present = {(r["stage"], r["version"]) for r in rows}
        spared = set(_newest_per_variant(rows, keep_latest)) | (promoted & present)
        for stage, version in list(promoted):
            consumers = [r for r in rows if any(rec.get("stage") == stage and rec.get("version") == version
                                                for rec in (r["inputs"] or {}).values())]
            spared |= set(_newest_per_variant(consumers, keep_latest))
        keep: set[tuple[str, str]] = set()
        for stage, version in spared:
            for item in self.lineage(stage, version):
                keep.add((item["stage"], item["version"]))
        doomed = [r for r in rows if (r["stage"], r["version"]) not in keep]
        for r in doomed:
            r["disk_bytes"] = _disk_bytes(Path(r["path"]))
        return doomed

    def gc(self, keep_latest: int = 1, plan: list[dict] | None = None) -> list[Path]:
        """Delete what `gc_plan(keep_latest)` lists (or `plan`, a list it returned, so a caller that
        showed the plan does not compute it again). Returns the removed folders."""
        self.require_writable()
        doomed = [(r["stage"], r["version"]) for r in (self.gc_plan(keep_latest) if plan is None else plan)]
        if not doomed:
            return []
        # Catalog first, so nothing listed ever points at a half-deleted folder.
        with self.catalog.rebuilding():
            for key in doomed:
                self._index.pop(key, None)
            self.catalog.rebuild(self._index)
        removed = []
        for stage, version in doomed:
            vdir = paths.version_dir(self.root, stage, version)
            with file_lock(paths.lock_file(self.root, stage, version)):
                if vdir.exists():
                    self._withdraw(vdir)  # atomic disappearance; the slow delete comes after
                    removed.append(vdir)
        return removed


def _newest_per_variant(rows: list[dict], n: int) -> list[tuple[str, str]]:
    """(stage, version) of the `n` newest rows of each stage and variant."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["stage"], canonical_json(r.get("variant") or {})), []).append(r)
    out = []
    for group in groups.values():
        group.sort(key=lambda r: (r["created_at"], r["version"]), reverse=True)
        out += [(r["stage"], r["version"]) for r in group[:n]]
    return out


def _disk_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())
