"""Content identity of input files, so a changed input file gives a new artifact version. Planning
asks for the same input files many times: the digest is kept per (path, size, mtime)."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from storage import hashing


def file_sha256(path: Path) -> str:
    stat = path.stat()
    return _sha256(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=64)
def _sha256(path: str, size: int, mtime_ns: int) -> str:  # size/mtime key the cache only
    return hashing.file_sha256(path)
