"""The DuckDB catalog: an `artifacts` table plus views over each stage's latest version
(storage/catalog_views.py), and the `promotions` table (storage/promotions.py).

The manifests on disk are the record; `catalog.duckdb` is a read-only index rebuilt from them.
A rebuild writes a new database beside the old one and renames it into place, so a writer never
opens the file readers use: a notebook or the DuckDB CLI can hold `catalog.duckdb` open for as long
as it likes (it keeps the snapshot it opened; reopen to see newer artifacts). Rebuilds are
serialised across processes by a flock on <root>/.catalog.lock, which readers never take.

User SQL (`pforge sql`, `ArtifactStore.sql`) runs in a sandbox (storage/sql_sandbox.py).

A rebuild that cannot write (a full disk: DuckDB raises a FatalException) leaves the catalog in
place and raises StoreWriteError, one line naming the root and the cause.

On a root this process cannot write (a read-only mount: a container, a shared volume), readers
use the file on disk when it is current; when it is stale or missing they read a private catalog
built in a temporary folder outside the root (`serve_read_only`), and nothing is written to the root.

A catalog built before the promotions record last changed counts as stale, so the next open
rebuilds it with the record's promotions.
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import tempfile
import weakref
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterator

import duckdb
import pyarrow as pa

from .atomic import atomic_path
from .catalog_views import VIEWS_SCHEMA, VIEWS_TABLE, Committed, create_views
from .digests import write_sidecar
from .errors import write_error
from .hashing import canonical_json, file_sha256
from .locks import file_lock
from .manifest import parse_created_at
from .paths import CATALOG_FILE, CATALOG_LOCK
from .promotions import PROMOTIONS_TABLE, append_promotion, fill_promotions_table, parse_promotions, read_ledger
from .sql_sandbox import sandboxed_query

META_TABLE = "catalog_meta"
RESERVED = {"artifacts", VIEWS_TABLE, META_TABLE, PROMOTIONS_TABLE}  # no view takes these names
FORMAT = 3  # bump when the catalog's tables change: older files are rebuilt on open

SCHEMA = f"""
CREATE TABLE artifacts (
    stage VARCHAR NOT NULL,
    version VARCHAR NOT NULL,
    status VARCHAR NOT NULL,
    created_at TIMESTAMP NOT NULL,
    code_version VARCHAR,
    parameters JSON,
    inputs JSON,
    rows BIGINT,
    bytes BIGINT,
    path VARCHAR NOT NULL,
    stats JSON,
    variant JSON,
    PRIMARY KEY (stage, version)
);
{VIEWS_SCHEMA}
CREATE TABLE {META_TABLE} (format INTEGER, fingerprint VARCHAR, promotions VARCHAR);
"""
COLUMNS = ["stage", "version", "status", "created_at", "code_version", "parameters", "inputs",
           "rows", "bytes", "path", "stats", "variant"]

# The rows' Arrow types (JSON columns travel as text and are cast by the INSERT).
ARROW_ROW = pa.schema([("stage", pa.string()), ("version", pa.string()), ("status", pa.string()),
                       ("created_at", pa.timestamp("us")), ("code_version", pa.string()), ("parameters", pa.string()),
                       ("inputs", pa.string()), ("rows", pa.int64()), ("bytes", pa.int64()), ("path", pa.string()),
                       ("stats", pa.string()), ("variant", pa.string())])


def fingerprint(committed: Committed) -> str:
    """What the catalog was built from: every committed (stage, version, path)."""
    keys = sorted(f"{s}\0{v}\0{p}" for (s, v), (_, p) in committed.items())
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()


def row_from_manifest(manifest: dict, path: Path) -> dict:
    def js(key):
        return canonical_json(manifest[key]) if manifest.get(key) is not None else None

    return {"stage": manifest["stage"], "version": manifest["version"], "status": "committed",
            "created_at": parse_created_at(manifest["created_at"]), "code_version": manifest.get("code_version"),
            "parameters": canonical_json(manifest.get("parameters", {})),
            "inputs": canonical_json(manifest.get("inputs", {})),
            "rows": int(manifest.get("rows", 0)), "bytes": int(manifest.get("bytes", 0)), "path": str(path),
            "stats": js("stats"), "variant": js("variant")}


def parse_json_columns(row: dict) -> dict:
    for key in ("parameters", "inputs", "stats", "variant"):
        if isinstance(row.get(key), str):
            row[key] = json.loads(row[key])
    return row


class Catalog:
    """`<root>/catalog.duckdb`, the index of the store's manifests (see the module's notes).

    `ArtifactStore` owns one (`store.catalog`) and rebuilds it after every commit; readers use
    `query` (or `ArtifactStore.sql`), or open the file read-only with DuckDB themselves.
    """

    def __init__(self, root: Path):
        self.root = Path(root)
        self.disk_path = self.root / CATALOG_FILE  # what rebuilds write
        self.path = self.disk_path  # what readers read: a private file instead on a read-only root
        self.lock_path = self.root / CATALOG_LOCK
        self._private_dir: Path | None = None

    # -- reading ----------------------------------------------------------------------
    @contextmanager
    def read(self, path: Path | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-only DuckDB connection to the catalog file (`path`, else the one readers read) as
        it is now, closed on exit. Trusted callers only: user SQL goes through `query`, which
        sandboxes it."""
        # A fresh read-only connection per call: it sees the file as renamed in at that moment.
        con = duckdb.connect(str(path or self.path), read_only=True)
        try:
            yield con
        finally:
            con.close()

    def built_from(self) -> str | None:
        """The fingerprint the current file was built from; None if absent, of an older format, or
        built before the promotions record last changed (so the next reconcile rebuilds it)."""
        return self._built_from(self.path)

    def _built_from(self, path: Path) -> str | None:
        if not path.exists():
            return None
        try:
            with self.read(path) as con:
                row = con.execute(f"SELECT format, fingerprint, promotions FROM {META_TABLE}").fetchone()
        except duckdb.Error:
            return None
        if not row or row[0] != FORMAT or row[2] != _digest(read_ledger(self.root)):
            return None
        return row[1]

    def query(self, sql: str, params: list | None = None) -> pa.Table:
        """One read-only statement (SELECT, SHOW, DESCRIBE, EXPLAIN, PRAGMA, CALL) in the sandbox.

        Args:
            sql: the statement; `$1`, `$2`, ... stand for `params`.
            params: values DuckDB binds to the placeholders.

        Returns:
            The result as an Arrow table (empty for a statement without rows).

        Raises:
            CatalogError: several statements, a write, bad SQL, an unknown view or a missing
                parameter (one line: DuckDB's first).
        """
        return sandboxed_query(self.read, self.root, sql, params)

    # -- rebuilding -------------------------------------------------------------------------
    def rebuild(self, committed: Committed) -> None:
        """Write a new catalog for `committed` (as scanned from disk) and swap it in atomically."""
        tmp = self.root / f".catalog-{os.getpid()}-{secrets.token_hex(4)}.duckdb"  # what remove_leftovers finds
        try:
            try:
                with atomic_path(self.disk_path, tmp=tmp):
                    self._write(tmp, committed)
                    # `pforge verify` checks the file against its sidecar: while the new one is
                    # renamed in, either may be in place (its temporary is one remove_leftovers finds)
                    new = file_sha256(tmp)
                    old = [file_sha256(self.disk_path)] if self.disk_path.is_file() else []
                    write_sidecar(self.disk_path, [*old, new], tmp=tmp.with_name(tmp.name + ".sha256.part"))
            except (duckdb.Error, OSError) as exc:
                # A full disk surfaces as a DuckDB FatalException (which invalidates that database:
                # it was a temporary one, dropped below) or IOException: the catalog in place stays.
                raise write_error(self.root, "writing the catalog", exc) from exc
        finally:
            _remove_database(tmp)  # and its WAL
        Path(f"{self.disk_path}.wal").unlink(missing_ok=True)  # a WAL of a replaced file would be replayed onto the new one
        with suppress(OSError):  # the catalog is in place: the sidecar above still holds its digest
            write_sidecar(self.disk_path, [new], tmp=tmp.with_name(tmp.name + ".sha256.part"))

    def _write(self, tmp: Path, committed: Committed) -> None:
        con = duckdb.connect(str(tmp))
        try:
            con.execute(SCHEMA)
            promotions_raw = read_ledger(self.root)
            fill_promotions_table(con, parse_promotions(promotions_raw))
            rows = [row_from_manifest(m, p) for m, p in committed.values()]
            if rows:
                # One Arrow scan, not executemany: DuckDB binds parameters row by row (~3 ms a
                # row), which made every commit into a root of 700 artifacts cost 2 s.
                con.register("incoming_rows", pa.Table.from_pylist(rows, schema=ARROW_ROW))
                con.execute(f"INSERT INTO artifacts ({', '.join(COLUMNS)}) SELECT {', '.join(COLUMNS)} FROM incoming_rows")
                con.unregister("incoming_rows")
            create_views(con, committed, RESERVED)
            con.execute(f"INSERT INTO {META_TABLE} VALUES (?, ?, ?)",
                        [FORMAT, fingerprint(committed), _digest(promotions_raw)])
            con.execute("CHECKPOINT")
        finally:
            try:
                con.close()
            except duckdb.Error:  # closing a connection a FatalException invalidated
                pass

    # -- a read-only root ------------------------------------------------------------------
    def serve_read_only(self, committed: Committed) -> bool:
        """Point readers at a catalog of `committed` without writing to the root: the file on disk
        when it is current, else a private one built now in a temporary folder outside the root
        (removed with this catalog, or when the process exits). True when one was built."""
        wanted = fingerprint(committed)
        for path in (self.disk_path, self._private_path()):
            if path is not None and self._built_from(path) == wanted:
                self.path = path
                return False
        self.path = self._build_private(committed)
        return True

    def _private_path(self) -> Path | None:
        return self._private_dir / CATALOG_FILE if self._private_dir is not None else None

    def _build_private(self, committed: Committed) -> Path:
        if self._private_dir is None:
            self._private_dir = Path(tempfile.mkdtemp(prefix="pforge-catalog-"))
            weakref.finalize(self, shutil.rmtree, self._private_dir, True)  # also runs at exit
        target = self._private_dir / CATALOG_FILE
        tmp = self._private_dir / f".catalog-{secrets.token_hex(4)}.duckdb"
        try:
            try:
                with atomic_path(target, tmp=tmp):  # a reader's connection keeps the file it opened
                    self._write(tmp, committed)
            except (duckdb.Error, OSError) as exc:
                raise write_error(self._private_dir, f"writing a private catalog for the read-only root {self.root}",
                                  exc) from exc
        finally:
            _remove_database(tmp)
        return target

    @contextmanager
    def rebuilding(self) -> Iterator[None]:
        """Hold the cross-process rebuild lock (writers only; readers never wait on it)."""
        with file_lock(self.lock_path):
            yield

    # -- promotions -------------------------------------------------------------------------
    def promotions(self) -> list[dict]:
        """Every promotion recorded, oldest first (from the record, not the catalog file)."""
        return parse_promotions(read_ledger(self.root))

    def record_promotion(self, stage: str, version: str, note: str | None = None) -> dict:
        """Append a promotion to the record (fsynced, under the rebuild lock). The caller then
        rebuilds the catalog (`ArtifactStore.reconcile(force=True)`); until it does, the stale
        catalog reports itself stale (`built_from`), so the next store open rebuilds it."""
        return append_promotion(self.root, stage, version, note)

    def remove_leftovers(self) -> None:
        """Temporary catalogs of rebuilds that died (called under the rebuild lock)."""
        for leftover in self.root.glob(".catalog-*.duckdb*"):
            leftover.unlink(missing_ok=True)


def _remove_database(path: Path) -> None:
    for leftover in (path, Path(f"{path}.wal")):
        leftover.unlink(missing_ok=True)


def _digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()
