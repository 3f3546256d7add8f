"""User SQL on the catalog (`pforge sql`, `ArtifactStore.sql`): one read statement (SELECT, SHOW,
DESCRIBE, EXPLAIN, PRAGMA, CALL) on a read-only connection locked down first: files under the root
only (the views read its Parquet), no extensions, no ATTACH, the configuration locked so the query
cannot undo any of it.

What may run is decided twice: by statement type before DuckDB sees the text (COPY, even into the
root, ATTACH, INSTALL/LOAD, SET, CREATE... are refused), then by the connection's file rules.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, ContextManager

import duckdb
import pyarrow as pa

from .errors import CatalogError

READ_STATEMENTS = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN, duckdb.StatementType.PRAGMA,
                   duckdb.StatementType.CALL}


def query_error(exc: duckdb.Error) -> CatalogError:
    """One line: DuckDB's first names the error class and the offending token."""
    return CatalogError(f"catalog query failed: {str(exc).strip().splitlines()[0]}")


def one_statement(sql: str) -> str:
    """The text of the single read statement in `sql` (CatalogError otherwise). More than one is
    refused rather than run with only the last result shown: parameters ($1, ...) bind to one
    statement, and a caller gets one table back."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise query_error(exc) from exc
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


def lock_down(con: duckdb.DuckDBPyConnection, root: Path) -> duckdb.DuckDBPyConnection:
    """`con` (read-only, on the catalog of `root`) made fit for user SQL; returned for chaining."""
    # allowed_directories must be set before external access goes off (DuckDB refuses it after).
    con.execute("SET allowed_directories = ?", [[str(root) + os.sep]])
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def sandboxed_query(connect: Callable[[], ContextManager[duckdb.DuckDBPyConnection]], root: Path, sql: str,
                    params: list | None) -> pa.Table:
    """`sql`, one read statement (`one_statement`), on a connection `connect()` opens read-only on the
    catalog of `root`, locked down first; as an Arrow table (empty for a statement without rows).
    Every refusal and DuckDB error comes out as CatalogError, one line."""
    statement = one_statement(sql)
    try:
        with connect() as con:
            result = lock_down(con, root).sql(statement, params=params or None)
            return result.to_arrow_table() if result is not None else pa.table({})
    except duckdb.Error as exc:
        raise query_error(exc) from exc
