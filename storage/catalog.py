"""The DuckDB catalog: an `artifacts` table plus one view per table of each stage's latest version.

DuckDB lets one process write a database file at a time (and a read-only opener blocks writers),
so every connection here is short-lived, catalog writes are serialised across processes with a
flock on <root>/.catalog.lock, and a connection that meets another process's lock retries briefly.
Inside one process a lock keeps read-only and read-write connections from overlapping, which
DuckDB refuses ("different configuration").

View naming: the default table of stage S is view "S"; a named table T is view "T". When that name
is already taken (by a stage registered earlier, i.e. with an older first artifact, or by the
catalog's own tables), the view is "S_T" instead.
"""
from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import duckdb
import pyarrow as pa

from .hashing import canonical_json
from .locks import file_lock
from .manifest import parse_created_at, read_manifest
from .paths import CATALOG_FILE, CATALOG_LOCK

_PROCESS_LOCK = threading.RLock()
RETRY_SECONDS = 30.0
VIEWS_TABLE = "catalog_views"
RESERVED = {"artifacts", VIEWS_TABLE}

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS artifacts (
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
    PRIMARY KEY (stage, version)
);
-- catalogs written before the stats column get it (NULL until reconciled from the manifests)
ALTER TABLE artifacts ADD COLUMN IF NOT EXISTS stats JSON;
CREATE TABLE IF NOT EXISTS {VIEWS_TABLE} (
    view_name VARCHAR PRIMARY KEY, stage VARCHAR, version VARCHAR, table_name VARCHAR
);
"""
COLUMNS = ["stage", "version", "status", "created_at", "code_version", "parameters", "inputs",
           "rows", "bytes", "path", "stats"]


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _is_lock_error(exc: Exception) -> bool:
    msg = str(exc).lower()
    return "lock" in msg or "different configuration" in msg


class Catalog:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.path = self.root / CATALOG_FILE
        self.lock_path = self.root / CATALOG_LOCK
        with self.write() as con:
            con.execute(SCHEMA)

    # -- connections -----------------------------------------------------------------
    def _connect(self, read_only: bool) -> duckdb.DuckDBPyConnection:
        deadline = time.monotonic() + RETRY_SECONDS
        delay = 0.02
        while True:
            try:
                return duckdb.connect(str(self.path), read_only=read_only)
            except (duckdb.IOException, duckdb.ConnectionException) as exc:
                if not _is_lock_error(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    @contextmanager
    def read(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with _PROCESS_LOCK:
            con = self._connect(read_only=True)
            try:
                yield con
            finally:
                con.close()

    @contextmanager
    def write(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-write connection inside one transaction, under the cross-process catalog lock."""
        with _PROCESS_LOCK, file_lock(self.lock_path):
            con = self._connect(read_only=False)
            try:
                con.execute("BEGIN TRANSACTION")
                try:
                    yield con
                except BaseException:
                    con.execute("ROLLBACK")
                    raise
                con.execute("COMMIT")
            finally:
                con.close()

    # -- rows -----------------------------------------------------------------------
    @staticmethod
    def _row_from_manifest(manifest: dict, path: Path) -> list:
        return [manifest["stage"], manifest["version"], "committed",
                parse_created_at(manifest["created_at"]), manifest.get("code_version"),
                canonical_json(manifest.get("parameters", {})),
                canonical_json(manifest.get("inputs", {})),
                int(manifest.get("rows", 0)), int(manifest.get("bytes", 0)), str(path),
                canonical_json(manifest["stats"]) if "stats" in manifest else None]

    def _upsert(self, con, manifest: dict, path: Path) -> None:
        con.execute(f"INSERT OR REPLACE INTO artifacts ({', '.join(COLUMNS)}) "
                    f"VALUES ({', '.join('?' * len(COLUMNS))})",
                    self._row_from_manifest(manifest, path))

    def register(self, manifest: dict, path: Path) -> None:
        with self.write() as con:
            self._upsert(con, manifest, path)
            self._refresh_views(con)

    @staticmethod
    def _dicts(cursor) -> list[dict]:
        names = [d[0] for d in cursor.description]
        out = []
        for values in cursor.fetchall():
            row = dict(zip(names, values))
            for key in ("parameters", "inputs", "stats"):
                if isinstance(row.get(key), str):
                    row[key] = json.loads(row[key])
            out.append(row)
        return out

    def rows(self, stage: str | None = None) -> list[dict]:
        query = f"SELECT {', '.join(COLUMNS)} FROM artifacts"
        params: list = []
        if stage is not None:
            query += " WHERE stage = ?"
            params.append(stage)
        query += " ORDER BY created_at, stage, version"
        with self.read() as con:
            return self._dicts(con.execute(query, params))

    def row(self, stage: str, version: str) -> dict | None:
        with self.read() as con:
            rows = self._dicts(con.execute(
                f"SELECT {', '.join(COLUMNS)} FROM artifacts WHERE stage = ? AND version = ?",
                [stage, version]))
        return rows[0] if rows else None

    def latest_row(self, stage: str) -> dict | None:
        with self.read() as con:
            rows = self._dicts(con.execute(
                f"SELECT {', '.join(COLUMNS)} FROM artifacts WHERE stage = ? AND status = 'committed' "
                "ORDER BY created_at DESC, version DESC LIMIT 1", [stage]))
        return rows[0] if rows else None

    def stages_of(self, version: str) -> list[str]:
        with self.read() as con:
            return [r[0] for r in con.execute(
                "SELECT stage FROM artifacts WHERE version = ? ORDER BY stage", [version]).fetchall()]

    def query(self, sql: str, params: list | None = None) -> pa.Table:
        with self.read() as con:
            return con.sql(sql, params=params or None).to_arrow_table()

    # -- reconcile / delete ---------------------------------------------------------------
    def reconcile(self, on_disk: dict[tuple[str, str], tuple[dict, Path]]) -> dict:
        """Make the table match the committed folders on disk. Writes only if something differs."""
        with self.read() as con:
            rows = con.execute("SELECT stage, version, path, stats IS NULL FROM artifacts").fetchall()
        known = {(s, v): p for s, v, p, _ in rows}
        no_stats = {(s, v) for s, v, _, null in rows if null}
        missing = [k for k in on_disk if k not in known]
        moved = [k for k in on_disk if k in known and known[k] != str(on_disk[k][1])]
        refill = [k for k in on_disk if k in no_stats and k not in moved and "stats" in on_disk[k][0]]
        gone = [k for k in known if k not in on_disk]
        if missing or moved or refill or gone:
            with self.write() as con:
                for key in missing + moved + refill:
                    manifest, path = on_disk[key]
                    self._upsert(con, manifest, path)
                for stage, version in gone:
                    con.execute("DELETE FROM artifacts WHERE stage = ? AND version = ?", [stage, version])
                self._refresh_views(con)
        return {"inserted": missing, "moved": moved, "stats_refilled": refill, "removed": gone}

    def delete(self, keys: list[tuple[str, str]]) -> None:
        with self.write() as con:
            for stage, version in keys:
                con.execute("DELETE FROM artifacts WHERE stage = ? AND version = ?", [stage, version])
            self._refresh_views(con)

    # -- views ----------------------------------------------------------------------------
    def refresh_views(self) -> dict[str, tuple[str, str]]:
        with self.write() as con:
            return self._refresh_views(con)

    def _refresh_views(self, con) -> dict[str, tuple[str, str]]:
        """Drop every view and recreate one per table of each stage's latest version."""
        for (name,) in con.execute(
                "SELECT view_name FROM duckdb_views() WHERE NOT internal AND schema_name = 'main'"
        ).fetchall():
            con.execute(f"DROP VIEW IF EXISTS {quote_ident(name)}")
        con.execute(f"DELETE FROM {VIEWS_TABLE}")
        latest = con.execute("""
            SELECT stage, version, path FROM (
                SELECT stage, version, path,
                       row_number() OVER (PARTITION BY stage ORDER BY created_at DESC, version DESC) AS rn,
                       min(created_at) OVER (PARTITION BY stage) AS first_seen
                FROM artifacts WHERE status = 'committed')
            WHERE rn = 1 ORDER BY first_seen, stage""").fetchall()
        used = set(RESERVED)
        made: dict[str, tuple[str, str]] = {}
        for stage, version, path in latest:
            manifest = read_manifest(Path(path))
            if manifest is None:  # folder vanished under us; reconcile on next open drops the row
                continue
            tables = manifest.get("tables", {})
            # The default table first, so it keeps the stage's own name.
            for table in sorted(tables, key=lambda t: (not tables[t].get("default"), t)):
                info = tables[table]
                if not info.get("files"):
                    continue
                name = stage if info.get("default") else table
                if name.lower() in used:
                    name = f"{stage}_{table}"
                if name.lower() in used:
                    continue
                sub = "data" if info.get("default") else f"data/{table}"
                glob = str(Path(path) / sub / "*.parquet")
                # DDL cannot take bound parameters; identifier and literal are escaped, and
                # both come from validated stage/table names and our own paths.
                con.execute(f"CREATE VIEW {quote_ident(name)} AS "
                            f"SELECT * FROM read_parquet({quote_literal(glob)})")
                con.execute(f"INSERT INTO {VIEWS_TABLE} VALUES (?, ?, ?, ?)",
                            [name, stage, version, table])
                used.add(name.lower())
                made[name] = (stage, table)
        return made
