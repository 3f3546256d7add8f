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

User SQL (`pforge sql`, `ArtifactStore.sql`) is one read statement (SELECT, SHOW, DESCRIBE,
EXPLAIN, PRAGMA, CALL) run on a sandboxed read-only connection: files under the root only (the
views read its Parquet), no extensions, no ATTACH, the configuration locked.

A rebuild that cannot write (a full disk: DuckDB raises a FatalException) leaves the catalog in
place and raises StoreWriteError, one line naming the root and the cause.

On a root this process cannot write (a read-only mount: a container, a shared volume), readers
use the file on disk when it is current; when it is stale or missing they read a private catalog
built in a temporary folder outside the root (`serve_read_only`), and nothing is written to the root.

Promotions (`pforge promote`) are recorded in <root>/promotions.jsonl (append-only, fsynced, under
the rebuild lock) and indexed in the `promotions` table; a catalog built before the record last
changed counts as stale, so the next open rebuilds it.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import shutil
import tempfile
import weakref
from contextlib import contextmanager, suppress
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import duckdb
import pyarrow as pa

from .atomic import atomic_path
from .digests import write_sidecar
from .fsutil import fsync_dir
from .hashing import canonical_json, file_sha256
from .locks import file_lock
from .manifest import parse_created_at
from .paths import CATALOG_FILE, CATALOG_LOCK

VIEWS_TABLE = "catalog_views"
META_TABLE = "catalog_meta"
PROMOTIONS_TABLE = "promotions"
PROMOTIONS_FILE = "promotions.jsonl"  # the record of promotions (append-only), beside the catalog
RESERVED = {"artifacts", VIEWS_TABLE, META_TABLE, PROMOTIONS_TABLE}
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
CREATE TABLE {VIEWS_TABLE} (view_name VARCHAR PRIMARY KEY, stage VARCHAR, versions VARCHAR[], table_name VARCHAR);
CREATE TABLE {META_TABLE} (format INTEGER, fingerprint VARCHAR, promotions VARCHAR);
"""
# Promotions (`pforge promote`): which artifact serves searches and refreshes; the highest seq is
# the one in force. Like the manifests, <root>/promotions.jsonl is the record and this table its
# index, filled on every rebuild; IF NOT EXISTS keeps it idempotent.
PROMOTIONS_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {PROMOTIONS_TABLE} (
    seq INTEGER NOT NULL,
    stage VARCHAR NOT NULL,
    version VARCHAR NOT NULL,
    promoted_at TIMESTAMP NOT NULL,
    note VARCHAR
);
"""
COLUMNS = ["stage", "version", "status", "created_at", "code_version", "parameters", "inputs",
           "rows", "bytes", "path", "stats", "variant"]

# The rows' Arrow types (JSON columns travel as text and are cast by the INSERT).
ARROW_ROW = pa.schema([("stage", pa.string()), ("version", pa.string()), ("status", pa.string()),
                       ("created_at", pa.timestamp("us")), ("code_version", pa.string()), ("parameters", pa.string()),
                       ("inputs", pa.string()), ("rows", pa.int64()), ("bytes", pa.int64()), ("path", pa.string()),
                       ("stats", pa.string()), ("variant", pa.string())])
Committed = dict[tuple[str, str], tuple[dict, Path]]


class CatalogError(ValueError):
    """A query the catalog refused: bad SQL, an unknown view, a missing parameter, a write."""


class StoreWriteError(OSError):
    """The store could not write (a full disk, most often): one line naming the root and the cause.
    Built as OSError(errno, message), so it pickles and Prefect can carry it across processes."""

    def __str__(self) -> str:
        return str(self.strerror)


def is_disk_full(exc: BaseException) -> bool:
    """ENOSPC as Python, pyarrow (errno unset) or DuckDB (a FatalException or IOException) report it."""
    return getattr(exc, "errno", None) == errno.ENOSPC or "no space left on device" in str(exc).lower()


def write_error(root: Path, doing: str, exc: BaseException) -> StoreWriteError:
    if is_disk_full(exc):
        return StoreWriteError(errno.ENOSPC, f"{root}: no space left on device while {doing}: free space on that "
                                             "disk (or `pforge gc`) and rerun")
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return StoreWriteError(getattr(exc, "errno", None) or errno.EIO, f"{root}: {doing} failed: {first}")


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
        if not row or row[0] != FORMAT or row[2] != _digest(self._promotions_bytes()):
            return None
        return row[1]

    @contextmanager
    def sandboxed(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read connection for user SQL: files under the root only (the views read its Parquet),
        no extensions, no ATTACH, and a locked configuration so the query cannot undo any of it."""
        with self.read() as con:
            # allowed_directories must be set before external access goes off (DuckDB refuses it after).
            con.execute("SET allowed_directories = ?", [[str(self.root) + os.sep]])
            con.execute("SET autoinstall_known_extensions = false")
            con.execute("SET autoload_known_extensions = false")
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
            yield con

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
        statement = _one_statement(sql)
        try:
            with self.sandboxed() as con:
                result = con.sql(statement, params=params or None)
                return result.to_arrow_table() if result is not None else pa.table({})
        except duckdb.Error as exc:
            # One line: DuckDB's first line names the error class and the offending token.
            raise CatalogError(f"catalog query failed: {str(exc).strip().splitlines()[0]}") from exc

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
            promotions_raw = self._promotions_bytes()
            _fill_promotions(con, parse_promotions(promotions_raw))
            rows = [row_from_manifest(m, p) for m, p in committed.values()]
            if rows:
                # One Arrow scan, not executemany: DuckDB binds parameters row by row (~3 ms a
                # row), which made every commit into a root of 700 artifacts cost 2 s.
                con.register("incoming_rows", pa.Table.from_pylist(rows, schema=ARROW_ROW))
                con.execute(f"INSERT INTO artifacts ({', '.join(COLUMNS)}) SELECT {', '.join(COLUMNS)} FROM incoming_rows")
                con.unregister("incoming_rows")
            _create_views(con, committed)
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
    @property
    def promotions_path(self) -> Path:
        return self.root / PROMOTIONS_FILE

    def _promotions_bytes(self) -> bytes:
        try:
            return self.promotions_path.read_bytes()
        except FileNotFoundError:
            return b""

    def promotions(self) -> list[dict]:
        """Every promotion recorded, oldest first (from the record, not the catalog file)."""
        return parse_promotions(self._promotions_bytes())

    def record_promotion(self, stage: str, version: str, note: str | None = None) -> dict:
        """Append a promotion to the record (fsynced, under the rebuild lock). The caller then
        rebuilds the catalog (`ArtifactStore.reconcile(force=True)`); until it does, the stale
        catalog reports itself stale (`built_from`), so the next store open rebuilds it."""
        record = {"stage": stage, "version": version,
                  "promoted_at": datetime.now(timezone.utc).isoformat(timespec="microseconds"), "note": note}
        line = json.dumps(record, sort_keys=True) + "\n"
        with self.rebuilding():
            existing = self._promotions_bytes()
            created = not self.promotions_path.exists()
            if existing and not existing.endswith(b"\n"):
                line = "\n" + line  # a torn last line (a crash mid-append) stays on its own line
            fd = os.open(self.promotions_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode("utf-8"))
                os.fsync(fd)
            except OSError as exc:  # a torn line this leaves is skipped when read
                raise write_error(self.root, "recording the promotion", exc) from exc
            finally:
                os.close(fd)
            if created:
                fsync_dir(self.root)
        return {"seq": len(parse_promotions(existing)) + 1, **record}

    def remove_leftovers(self) -> None:
        """Temporary catalogs of rebuilds that died (called under the rebuild lock)."""
        for leftover in self.root.glob(".catalog-*.duckdb*"):
            leftover.unlink(missing_ok=True)


# What user SQL may be: reads. COPY (even into the root), ATTACH, INSTALL/LOAD, SET, CREATE...
# are refused by type before DuckDB sees them; the sandbox's file rules are the second fence.
READ_STATEMENTS = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN, duckdb.StatementType.PRAGMA,
                   duckdb.StatementType.CALL}


def _one_statement(sql: str) -> str:
    """The text of the single statement in `sql`. More than one is refused rather than run with
    only the last result shown: parameters ($1, ...) bind to one statement, and a caller gets one
    table back."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise CatalogError(f"catalog query failed: {str(exc).strip().splitlines()[0]}") from exc
    if not statements:
        raise CatalogError("catalog query failed: no SQL statement in the query (it is empty or only comments)")
    if len(statements) > 1:
        raise CatalogError(f"catalog query failed: {len(statements)} statements in one query; "
                           "give one statement per query")
    statement = statements[0]
    if statement.type not in READ_STATEMENTS:
        kind = statement.type.name.replace("_", " ")
        if kind == "LOAD":  # DuckDB files INSTALL under the LOAD type: name what the user wrote
            kind = statement.query.split(maxsplit=1)[0].upper()
        raise CatalogError(f"catalog query failed: the catalog is read-only: {kind} statements are refused "
                           "(queries read the views and tables; they write nothing)")
    return statement.query


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
        tables: dict[str, dict] = {}  # every variant's tables (one variant may write a named table others lack)
        for _, manifest, _ in latest:
            for table, info in manifest.get("tables", {}).items():
                tables.setdefault(table, info)
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
                columns = manifest["tables"][table].get("columns")
                if columns is None:  # a manifest from before tables recorded their columns
                    columns = [c[0] for c in con.execute(f"DESCRIBE SELECT * FROM read_parquet({quote_literal(glob)})").fetchall()]
                selects.append(_select(glob, manifest.get("variant") or {}, set(columns)))
            # DDL cannot take bound parameters; identifiers and literals are escaped, and both come
            # from validated stage/table names and our own paths.
            con.execute(f"CREATE VIEW {quote_ident(name)} AS " + " UNION ALL BY NAME ".join(selects))
            con.execute(f"INSERT INTO {VIEWS_TABLE} VALUES (?, ?, ?, ?)", [name, stage, [v for v, _, _ in parts], table])
            used.add(name.lower())


def _remove_database(path: Path) -> None:
    for leftover in (path, Path(f"{path}.wal")):
        leftover.unlink(missing_ok=True)


def _digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def parse_promotions(raw: bytes) -> list[dict]:
    """The records of promotions.jsonl in order, numbered from 1; a torn or foreign line is skipped."""
    out = []
    for line in raw.decode("utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
            out.append({"seq": len(out) + 1, "stage": str(record["stage"]), "version": str(record["version"]),
                        "promoted_at": parse_created_at(record["promoted_at"]), "note": record.get("note")})
        except (ValueError, KeyError, TypeError):
            continue
    return out


def _fill_promotions(con, promotions: list[dict]) -> None:
    con.execute(PROMOTIONS_SCHEMA)
    if promotions:
        con.executemany(f"INSERT INTO {PROMOTIONS_TABLE} VALUES (?, ?, ?, ?, ?)",
                        [[p["seq"], p["stage"], p["version"], p["promoted_at"], p["note"]] for p in promotions])


def parse_json_columns(row: dict) -> dict:
    for key in ("parameters", "inputs", "stats", "variant"):
        if isinstance(row.get(key), str):
            row[key] = json.loads(row[key])
    return row
