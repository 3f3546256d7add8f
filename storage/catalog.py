"""The DuckDB catalog: an `artifacts` table plus views over each stage's latest version.

The manifests on disk are the record; `catalog.duckdb` is a read-only index rebuilt from them.
A rebuild writes a new database beside the old one and renames it into place, so a writer never
opens the file readers use: a notebook or the DuckDB CLI can hold `catalog.duckdb` open for as long
as it likes (it keeps the snapshot it opened; reopen to see newer artifacts). Rebuilds are
serialised across processes by a flock on <root>/.catalog.lock, which readers never take.

View naming: the default table of stage S is view "S"; a named table T is view "T". When that name
is already taken (by a stage registered earlier, i.e. with an older first artifact, or by the
catalog's own tables), the view is "S_T" instead. A stage whose artifacts carry a `variant`
(a mapping of column -> value in the manifest, e.g. one artifact per system) gets the latest
version of each variant in its views, unioned, with the variant's columns added where the table
lacks them.
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import duckdb
import pyarrow as pa

from .fsutil import fsync_dir
from .hashing import canonical_json
from .locks import file_lock
from .manifest import parse_created_at
from .paths import CATALOG_FILE, CATALOG_LOCK

VIEWS_TABLE = "catalog_views"
META_TABLE = "catalog_meta"
RESERVED = {"artifacts", VIEWS_TABLE, META_TABLE}
FORMAT = 2  # bump when the catalog's tables change: older files are rebuilt on open

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
CREATE TABLE {VIEWS_TABLE} (view_name VARCHAR PRIMARY KEY, stage VARCHAR, versions VARCHAR[], table_name VARCHAR);
CREATE TABLE {META_TABLE} (format INTEGER, fingerprint VARCHAR);
"""
COLUMNS = ["stage", "version", "status", "created_at", "code_version", "parameters", "inputs",
           "rows", "bytes", "path", "stats", "variant"]

Committed = dict[tuple[str, str], tuple[dict, Path]]


class CatalogError(ValueError):
    """A query the catalog refused: bad SQL, an unknown view, a missing parameter, a write."""


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


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


class Catalog:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.path = self.root / CATALOG_FILE
        self.lock_path = self.root / CATALOG_LOCK

    # -- reading ----------------------------------------------------------------------
    @contextmanager
    def read(self) -> Iterator[duckdb.DuckDBPyConnection]:
        # A fresh read-only connection per call: it sees the file as renamed in at that moment.
        con = duckdb.connect(str(self.path), read_only=True)
        try:
            yield con
        finally:
            con.close()

    def built_from(self) -> str | None:
        """The fingerprint the current file was built from; None if absent or of an older format."""
        if not self.path.exists():
            return None
        try:
            with self.read() as con:
                row = con.execute(f"SELECT format, fingerprint FROM {META_TABLE}").fetchone()
        except duckdb.Error:
            return None
        return row[1] if row and row[0] == FORMAT else None

    def query(self, sql: str, params: list | None = None) -> pa.Table:
        try:
            with self.read() as con:
                return con.sql(sql, params=params or None).to_arrow_table()
        except duckdb.Error as exc:
            # One line: DuckDB's first line names the error class and the offending token.
            raise CatalogError(f"catalog query failed: {str(exc).strip().splitlines()[0]}") from exc

    # -- rebuilding -------------------------------------------------------------------------
    def rebuild(self, committed: Committed) -> None:
        """Write a new catalog for `committed` (as scanned from disk) and swap it in atomically."""
        tmp = self.root / f".catalog-{os.getpid()}-{secrets.token_hex(4)}.duckdb"
        try:
            con = duckdb.connect(str(tmp))
            try:
                con.execute(SCHEMA)
                rows = [row_from_manifest(m, p) for m, p in committed.values()]
                if rows:
                    con.executemany(f"INSERT INTO artifacts ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
                                    [[r[c] for c in COLUMNS] for r in rows])
                _create_views(con, committed)
                con.execute(f"INSERT INTO {META_TABLE} VALUES (?, ?)", [FORMAT, fingerprint(committed)])
                con.execute("CHECKPOINT")
            finally:
                con.close()
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            fsync_dir(self.root)
        finally:
            for leftover in (tmp, Path(f"{tmp}.wal")):
                leftover.unlink(missing_ok=True)
        Path(f"{self.path}.wal").unlink(missing_ok=True)  # a WAL of a replaced file would be replayed onto the new one

    @contextmanager
    def rebuilding(self) -> Iterator[None]:
        """Hold the cross-process rebuild lock (writers only; readers never wait on it)."""
        with file_lock(self.lock_path):
            yield

    def remove_leftovers(self) -> None:
        """Temporary catalogs of rebuilds that died (called under the rebuild lock)."""
        for leftover in self.root.glob(".catalog-*.duckdb*"):
            leftover.unlink(missing_ok=True)


def _latest_per_variant(committed: Committed) -> list[tuple[str, list[tuple[str, dict, Path]]]]:
    """[(stage, [(version, manifest, path) latest of each variant])], stages by first appearance."""
    by_stage: dict[str, dict[str, tuple]] = {}
    first_seen: dict[str, tuple] = {}
    for (stage, version), (manifest, path) in committed.items():
        created = parse_created_at(manifest["created_at"])
        first_seen[stage] = min(first_seen.get(stage, (created, stage)), (created, stage))
        key = canonical_json(manifest.get("variant") or {})
        best = by_stage.setdefault(stage, {}).get(key)
        if best is None or (created, version) > (best[0], best[1]):
            by_stage[stage][key] = (created, version, manifest, path)
    ordered = sorted(by_stage, key=lambda s: first_seen[s])
    return [(s, [(v, m, p) for _, v, m, p in sorted(by_stage[s].values(), key=lambda t: canonical_json(t[2].get("variant") or {}))])
            for s in ordered]


def _select(glob: str, variant: dict, columns: set[str]) -> str:
    extra = "".join(f", {quote_literal(str(value))} AS {quote_ident(col)}"
                    for col, value in sorted(variant.items()) if col not in columns)
    return f"SELECT *{extra} FROM read_parquet({quote_literal(glob)})"


def _create_views(con, committed: Committed) -> None:
    used = set(RESERVED)
    for stage, latest in _latest_per_variant(committed):
        tables = latest[0][1].get("tables", {})
        # The default table first, so it keeps the stage's own name.
        for table in sorted(tables, key=lambda t: (not tables[t].get("default"), t)):
            info = tables[table]
            parts = [(v, m, p) for v, m, p in latest if m.get("tables", {}).get(table, {}).get("files")]
            if not parts:
                continue
            name = stage if info.get("default") else table
            if name.lower() in used:
                name = f"{stage}_{table}"
            if name.lower() in used:
                continue
            sub = "data" if info.get("default") else f"data/{table}"
            selects = []
            for _, manifest, path in parts:
                glob = str(Path(path) / sub / "*.parquet")
                columns = {c[0] for c in con.execute(f"DESCRIBE SELECT * FROM read_parquet({quote_literal(glob)})").fetchall()}
                selects.append(_select(glob, manifest.get("variant") or {}, columns))
            # DDL cannot take bound parameters; identifiers and literals are escaped, and both come
            # from validated stage/table names and our own paths.
            con.execute(f"CREATE VIEW {quote_ident(name)} AS " + " UNION ALL BY NAME ".join(selects))
            con.execute(f"INSERT INTO {VIEWS_TABLE} VALUES (?, ?, ?, ?)", [name, stage, [v for v, _, _ in parts], table])
            used.add(name.lower())


def parse_json_columns(row: dict) -> dict:
    for key in ("parameters", "inputs", "stats", "variant"):
        if isinstance(row.get(key), str):
            row[key] = json.loads(row[key])
    return row
