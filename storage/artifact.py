"""A committed, immutable artifact: a folder plus its manifest."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds

from .parquet import table_files as _table_files


@dataclass
class Artifact:
    """One committed artifact: its folder (`path`) and its manifest (parameters, inputs, tables,
    rows, stats). `cache_hit` is True when `materialize` found it instead of building it."""
    stage: str
    version: str
    path: Path
    manifest: dict = field(default_factory=dict)
    cache_hit: bool = False

    @property
    def data_dir(self) -> Path:
        return self.path / "data"

    @property
    def tables(self) -> list[str]:
        """Table names; the default table (data/*.parquet), if any, is named after the stage."""
        return list(self.manifest.get("tables", {}))

    @property
    def rows(self) -> int:
        return int(self.manifest.get("rows", 0))

    def _resolve(self, name: str | None) -> str | None:
        """Map a requested table name to its folder name (None = data/ itself)."""
        tables = self.manifest.get("tables", {})
        if name is None:
            if any(t.get("default") for t in tables.values()) or _table_files(self.path, None):
                return None
            named = [n for n, t in tables.items() if not t.get("default")]
            if len(named) == 1:
                return named[0]
            raise KeyError(f"{self.stage}/{self.version} has no default table; pick one of {named}")
        if name in tables and tables[name].get("default"):
            return None
        if name == self.stage and name not in tables and _table_files(self.path, None):
            return None
        return name

    def table_files(self, name: str | None = None) -> list[Path]:
        """The Parquet files of one table, in part order (for DuckDB, pyarrow.dataset, pandas)."""
        files = _table_files(self.path, self._resolve(name))
        if not files:
            raise KeyError(f"{self.stage}/{self.version} has no table {name!r}")
        return files

    def read_table(self, name: str | None = None, columns: list[str] | None = None) -> pa.Table:
        """A table of this artifact as one Arrow table.

        Args:
            name: the table (`tables` lists them); None: the default table, or the only one.
            columns: read only these columns.

        Raises:
            KeyError: the artifact has no such table (or several and no default).
        """
        files = self.table_files(name)
        # Every part shares the writer's explicit schema, so the first file's schema is the table's.
        dataset = ds.dataset([str(f) for f in files], format="parquet")
        return dataset.to_table(columns=columns)

    def subdir(self, name: str) -> Path:
        """A folder inside the artifact, e.g. `model` or `index`."""
        return self.path / name
