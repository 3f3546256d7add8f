"""ArtifactStore: versioned, immutable, atomically committed stage outputs.

Commit protocol (a crash at any point leaves the whole artifact or nothing visible):
  1. lock <stage>/.locks/<version>.lock (flock; a concurrent writer of the same version waits,
     then finds the manifest and reuses the result)
  2. build into <stage>/.tmp-<version>-<pid>-<random>/
  3. write manifest.json, fsync every file and dir, rename to <stage>/<version>, fsync <stage>
  4. rebuild the DuckDB catalog from the manifests and swap it in (storage/catalog.py)
A crash before 3 leaves a tmp dir whose lock nobody holds: the next open deletes it.
A crash between 3 and 4 leaves a committed folder the catalog lacks: the next open rebuilds it.

The store keeps an index of the committed manifests, scanned once when it opens: open one store
per flow run and pass it around, rather than reopening it per stage.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import pyarrow as pa

from . import paths
from .artifact import Artifact
from .catalog import Catalog, fingerprint, parse_json_columns, row_from_manifest
from .fsutil import fsync_dir, fsync_tree, remove_tree
from .hashing import normalize, version_for
from .locks import file_lock
from .manifest import MANIFEST, build_manifest, parse_created_at, read_manifest, write_manifest

BuildFn = Callable[[Path], "dict | None"]
Progress = Callable[[str], Any]


class ArtifactStore:
    def __init__(self, root: Path | str):
        self.root = Path(root).expanduser().resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.catalog = Catalog(self.root)
        self._index: dict[tuple[str, str], tuple[dict, Path]] = {}
        self.cleanup()
        self.reconcile()

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
        """Delete tmp dirs of dead builds (their version lock is free) and gc leftovers."""
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
        return removed

    def reconcile(self, force: bool = False) -> bool:
        """Rescan the committed folders; rebuild the catalog if it was built from something else
        (a crash between rename and catalog, another process's commit, gc). True if rebuilt."""
        with self.catalog.rebuilding():
            self.catalog.remove_leftovers()
            self._index = self._committed_on_disk()
            if not force and self.catalog.built_from() == fingerprint(self._index):
                return False
            self.catalog.rebuild(self._index)
            return True

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
        vdir = paths.version_dir(self.root, stage, version)
        manifest = read_manifest(vdir)
        if manifest is None:
            return None
        return Artifact(stage=stage, version=version, path=vdir, manifest=manifest, cache_hit=cache_hit)

    def get(self, stage: str, version: str) -> Artifact | None:
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

    def stages_of(self, version: str) -> list[str]:
        return sorted(s for s, v in self._index if v == version)

    def list_artifacts(self, stage: str | None = None) -> list[dict]:
        """Catalog rows (from the manifests, rescanned), oldest first; parameters and inputs parsed from JSON."""
        self._index = self._committed_on_disk()
        rows = [parse_json_columns(row_from_manifest(m, p)) for (s, _), (m, p) in self._index.items()
                if stage is None or s == stage]
        return sorted(rows, key=lambda r: (r["created_at"], r["stage"], r["version"]))

    def sql(self, query: str, params: list | None = None) -> pa.Table:
        """Run read-only SQL over the catalog; values go in `params`, bound by DuckDB."""
        return self.catalog.query(query, params)

    def lineage(self, stage: str, version: str) -> list[dict]:
        """The artifact and every transitive input, breadth-first, each once at its smallest depth."""
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

        `progress`, if given, is called with short status strings (cache hit, building, committed).
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

        with file_lock(paths.lock_file(self.root, stage, version)):
            if (final / MANIFEST).exists():  # another writer finished while we waited
                return self._cache_hit(stage, version, say)
            if final.exists():  # not ours and not committed: cannot happen via rename; clear it
                remove_tree(final)
            say(f"building {stage}/{version}")
            tmp = paths.new_tmp_dir(self.root, stage, version)
            tmp.mkdir(parents=True)
            try:
                t0 = time.perf_counter()
                extra = build(tmp)
                build_s = time.perf_counter() - t0
                manifest = build_manifest(tmp, stage=stage, version=version, code_version=str(code_version),
                                          parameters=params_n, inputs=input_recs, build_s=build_s,
                                          extra=normalize(extra) if extra else None)
                write_manifest(tmp, manifest)
                fsync_tree(tmp)
                os.rename(tmp, final)
            except BaseException:
                remove_tree(tmp)
                raise
            fsync_dir(final.parent)
            # Still under the version lock: a waiting writer sees the catalog row when it wakes.
            self.register(manifest, final)
            remove_tree(paths.work_dir(self.root, stage, version))  # a resumable build's scratch
        say(f"committed {stage}/{version} ({manifest['rows']} rows, {build_s:.2f}s)")
        return Artifact(stage=stage, version=version, path=final, manifest=manifest, cache_hit=False)

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
        art = self._load(stage, version, cache_hit=True)
        # Heal a commit whose catalog rebuild was lost (crash after rename) without a reopen.
        if (stage, version) not in self._index:
            self.register(art.manifest, art.path)
        say(f"cache hit {stage}/{version}")
        return art

    # -- garbage collection -------------------------------------------------------------
    def gc(self, keep_latest: int = 1) -> list[Path]:
        """Delete all but the `keep_latest` newest versions of each stage, sparing any promoted
        version (`pforge promote`) and any version that a kept one (transitively) uses as input.
        Returns removed paths."""
        if keep_latest < 1:
            raise ValueError("keep_latest must be >= 1")
        rows = self.list_artifacts()
        by_stage: dict[str, list[dict]] = {}
        for r in rows:
            by_stage.setdefault(r["stage"], []).append(r)
        keep: set[tuple[str, str]] = set()
        promoted = {(p["stage"], p["version"]) for p in self.catalog.promotions()}
        for stage_rows in by_stage.values():
            stage_rows.sort(key=lambda r: (r["created_at"], r["version"]), reverse=True)
            spared = stage_rows[:keep_latest] + [r for r in stage_rows[keep_latest:] if (r["stage"], r["version"]) in promoted]
            for r in spared:
                for item in self.lineage(r["stage"], r["version"]):
                    keep.add((item["stage"], item["version"]))
        doomed = [(r["stage"], r["version"]) for r in rows if (r["stage"], r["version"]) not in keep]
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
                    trash = vdir.parent / f"{paths.TRASH_PREFIX}{version}-{os.getpid()}"
                    os.rename(vdir, trash)  # atomic disappearance; the slow delete comes after
                    remove_tree(trash)
                    removed.append(vdir)
        return removed
