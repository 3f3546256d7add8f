"""Artifact store: versioned Parquet datasets, model and index folders, and a DuckDB catalog.

Knows nothing about retrieval. See DESIGN.md section 4.
"""
from .artifact import Artifact
from .hashing import version_for
from .parquet import ParquetTableWriter, write_table
from .paths import resolve_root
from .store import ArtifactStore, MissingStoreError, ReadOnlyStoreError, require_writable_root

__all__ = ["Artifact", "ArtifactStore", "MissingStoreError", "ParquetTableWriter", "ReadOnlyStoreError", "require_writable_root", "resolve_root", "version_for", "write_table"]
