"""File locks. flock (not lockf): it is per open file, so two threads or two store
objects in one process exclude each other too, and the kernel drops it when a process dies."""
from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def file_lock(path: Path, blocking: bool = True) -> Iterator[bool]:
    """Hold an exclusive lock on `path` (created if missing).

    Yields True when held; with blocking=False yields False instead of waiting.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        flags = fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB
        try:
            fcntl.flock(fd, flags)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
