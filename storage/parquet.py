"""Parquet writing for stage builds: explicit schema, zstd, bounded memory.

Layout inside a build dir: the stage's default table is data/part-*.parquet, a named table
is data/<name>/part-*.parquet.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from .paths import check_name

DEFAULT_ROWS_PER_FILE = 500_000
ROW_GROUP_ROWS = 65_536  # buffer this many rows before a write: few row groups, bounded memory
COMPRESSION = "zstd"


def table_dir(base: Path, name: str | None) -> Path:
    return base / "data" if name is None else base / "data" / check_name("table", name)


def table_files(base: Path, name: str | None) -> list[Path]:
    """Parquet files of one table, in part order (part names are zero-padded)."""
    return sorted(p for p in table_dir(base, name).glob("*.parquet") if p.is_file())


def parquet_rows(path: Path) -> int:
    # Footer only: counting rows never reads the data pages.
    return pq.read_metadata(path).num_rows


def parquet_columns(path: Path) -> list[str]:
    """The file's column names, from its footer."""
    return pq.read_schema(path).names


class ParquetTableWriter:
    """Stream rows into a table as a sequence of part files.

    Holds at most ROW_GROUP_ROWS buffered rows plus one open file, so memory stays constant
    whatever the table size. Starts a new part every `rows_per_file` rows.
    """

    def __init__(self, tmp_dir: Path, schema: pa.Schema, name: str | None = None,
                 rows_per_file: int = DEFAULT_ROWS_PER_FILE):
        if rows_per_file <= 0:
            raise ValueError("rows_per_file must be positive")
        self.dir = table_dir(Path(tmp_dir), name)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.schema = schema
        self.rows_per_file = rows_per_file
        self.rows = 0
        self._buffer: list[pa.RecordBatch] = []
        self._buffered = 0
        self._writer: pq.ParquetWriter | None = None
        self._file_rows = 0
        # Continue numbering if another writer already put parts here.
        self._next_part = len(list(self.dir.glob("part-*.parquet")))
        self._closed = False

    # -- input -------------------------------------------------------------------
    def _to_batch(self, batch) -> pa.RecordBatch | pa.Table:
        if isinstance(batch, (pa.RecordBatch, pa.Table)):
            if batch.schema != self.schema:
                # Reorder to the declared column order, then cast: the schema is the contract.
                batch = batch.select(self.schema.names).cast(self.schema)
            return batch
        if isinstance(batch, Mapping):  # column dict
            return pa.Table.from_pydict(dict(batch), schema=self.schema)
        return pa.RecordBatch.from_pylist(list(batch), schema=self.schema)

    def write_batch(self, batch: Iterable[dict] | pa.RecordBatch | pa.Table) -> None:
        if self._closed:
            raise RuntimeError("writer is closed")
        data = self._to_batch(batch)
        batches = data.to_batches() if isinstance(data, pa.Table) else [data]
        for b in batches:
            if b.num_rows:
                self._buffer.append(b)
                self._buffered += b.num_rows
        if self._buffered >= ROW_GROUP_ROWS:
            self._flush()

    write = write_batch

    # -- output ------------------------------------------------------------------
    def _open_part(self) -> None:
        path = self.dir / f"part-{self._next_part:05d}.parquet"
        self._next_part += 1
        self._writer = pq.ParquetWriter(path, self.schema, compression=COMPRESSION)
        self._file_rows = 0

    def _close_part(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _flush(self) -> None:
        if not self._buffered:
            return
        table = pa.Table.from_batches(self._buffer, schema=self.schema)
        self._buffer, self._buffered = [], 0
        offset = 0
        while offset < table.num_rows:
            if self._writer is None or self._file_rows >= self.rows_per_file:
                self._close_part()
                self._open_part()
            take = min(self.rows_per_file - self._file_rows, table.num_rows - offset)
            self._writer.write_table(table.slice(offset, take), row_group_size=ROW_GROUP_ROWS)
            self._file_rows += take
            self.rows += take
            offset += take

    def close(self) -> int:
        """Flush and close; returns rows written. An empty table still gets one file, so
        readers and catalog views always see its schema."""
        if self._closed:
            return self.rows
        self._flush()
        if self._writer is None and self.rows == 0:
            self._open_part()
        self._close_part()
        self._closed = True
        return self.rows

    def __enter__(self) -> "ParquetTableWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:  # the build is failing; the tmp dir will be removed anyway
            self._close_part()
            self._closed = True


def write_table(tmp_dir: Path, table: pa.Table, name: str | None = None,
                rows_per_file: int = DEFAULT_ROWS_PER_FILE) -> int:
    """Write a whole in-memory table into a build folder (schema taken from it).

    Args:
        tmp_dir: the folder a stage's builder was given.
        table: the rows.
        name: None for the stage's default table (`data/part-*.parquet`), else a named table
            (`data/<name>/part-*.parquet`, a catalog view of that name).
        rows_per_file: start a new part file after this many rows.

    Returns:
        The number of rows written.
    """
    with ParquetTableWriter(tmp_dir, table.schema, name=name, rows_per_file=rows_per_file) as w:
        w.write_batch(table)
    return w.rows
