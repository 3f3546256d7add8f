"""Durability helpers: a rename is only a commit if the bytes and the directory entries
reached the disk first."""
from __future__ import annotations

import os
import shutil
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path | str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file, then every directory bottom-up (entries after contents)."""
    for dirpath, _dirs, files in os.walk(root, topdown=False):
        for f in files:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                fsync_file(p)
        fsync_dir(Path(dirpath))


def tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            total += os.path.getsize(os.path.join(dirpath, f))
    return total


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def read_only_reason(folder: Path) -> str | None:
    """Why this process cannot write into `folder` (or, when it is missing, into the nearest folder
    above it, where it would be made), or None when it can."""
    existing = Path(folder)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    # The mount flag first: root bypasses permission bits, so for root only the mount can say no.
    if os.statvfs(existing).f_flag & os.ST_RDONLY:
        return "a read-only mount"
    if not os.access(existing, os.W_OK | os.X_OK):
        return "no write permission for this user"
    return None
