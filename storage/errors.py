"""The store's error types, below the modules that raise them (the catalog, its SQL sandbox, the
promotions record, the store), so each imports them without importing the others."""
from __future__ import annotations

import errno
from pathlib import Path


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
    """The StoreWriteError for `exc`, raised while `doing` (a phrase: "writing the catalog")."""
    if is_disk_full(exc):
        return StoreWriteError(errno.ENOSPC, f"{root}: no space left on device while {doing}: free space on that "
                                             "disk (or `pforge gc`) and rerun")
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return StoreWriteError(getattr(exc, "errno", None) or errno.EIO, f"{root}: {doing} failed: {first}")
