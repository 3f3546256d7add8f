"""Atomic writes: a file or a folder appears at its name whole or not at all, and is on the disk
once the call returns.

Each is written beside its target under a temporary name (same folder, so the rename cannot cross
file systems), fsynced, renamed onto the target, and then the folder holding it is fsynced: a
rename is only durable once the directory entry is. On an exception the temporary is removed and
the target keeps what it held.

    with atomic_write(path, "w") as f:
        json.dump(record, f)
    atomic_write_text(path, text)
    atomic_dir(out_dir / "best", model.save_pretrained)

Temporary names: a file's is `.<name>.<pid>-<random>.part`, a folder's `.tmp-<name>-<pid>-<random>`
(the trainers' stale-temp clean-up removes `.tmp-*` in their checkpoint folder). A caller whose
readers know another name passes it as `tmp`; whatever a killed writer left at that name is
cleared first.
"""
from __future__ import annotations

import errno
import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Callable, Iterator, TypeVar

from .fsutil import fsync_dir, fsync_file, fsync_tree, remove_tree

TMP_DIR_PREFIX = ".tmp-"
OLD_DIR_PREFIX = ".old-"  # an existing folder, moved aside while its replacement is renamed in
TMP_FILE_SUFFIX = ".part"

PathLike = str | os.PathLike
T = TypeVar("T")


def _unique() -> str:
    # pid + random: processes, threads and retries never share a temporary
    return f"{os.getpid()}-{secrets.token_hex(4)}"


def temp_file_for(target: PathLike) -> Path:
    target = Path(target)
    return target.with_name(f".{target.name}.{_unique()}{TMP_FILE_SUFFIX}")


def temp_dir_for(target: PathLike, prefix: str = TMP_DIR_PREFIX) -> Path:
    target = Path(target)
    return target.with_name(f"{prefix}{target.name}-{_unique()}")


@contextmanager
def atomic_path(target: PathLike, *, tmp: PathLike | None = None) -> Iterator[Path]:
    """Yields a temporary path beside `target` for the caller to create a file at (for writers
    that take a name: DuckDB, Parquet); on a clean exit it is fsynced and renamed onto `target`.

    Args:
        target: the file to write; its folder is created when missing.
        tmp: the temporary's name, when readers rely on it (default: a unique sibling).
    """
    target = Path(target)
    tmp = Path(tmp) if tmp is not None else temp_file_for(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp.unlink(missing_ok=True)  # a killed writer's, under a fixed name: never taken for ours
    try:
        yield tmp
        fsync_file(tmp)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


@contextmanager
def atomic_write(target: PathLike, mode: str = "wb", *, tmp: PathLike | None = None,
                 encoding: str = "utf-8") -> Iterator[IO]:
    """Yields a file open for writing; on a clean exit it replaces `target` whole (see atomic_path).

    Args:
        target: the file to write; its folder is created when missing.
        mode: "wb" (bytes) or "w" (text, in `encoding`).
        tmp: the temporary's name, when readers rely on it (default: a unique sibling).
        encoding: of a text mode.
    """
    if mode not in ("wb", "w", "wt"):
        raise ValueError(f"atomic_write writes a new file: mode 'wb' or 'w', not {mode!r}")
    with atomic_path(target, tmp=tmp) as path:
        # O_EXCL: the name is ours alone; 0o666 leaves the permissions to the umask, as open() does
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with open(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f


def atomic_write_text(target: PathLike, text: str, *, tmp: PathLike | None = None) -> Path:
    """`target` holds `text` (UTF-8) whole, or keeps what it held."""
    with atomic_write(target, "w", tmp=tmp) as f:
        f.write(text)
    return Path(target)


def atomic_dir(target: PathLike, write: Callable[[Path], T], *, tmp: PathLike | None = None,
               replace: bool = True) -> T:
    """`target` becomes the folder `write(folder)` fills: `write` is given an empty temporary folder
    beside it, which is fsynced (every file and folder) and renamed into place.

    An existing target is moved aside, the new folder renamed in, and the old one deleted; should
    the rename in fail, the old folder is put back. A reader finds the old folder or the new one,
    never a mix (for the instant between the two renames, none).

    Args:
        target: the folder to write; its parent is created when missing.
        write: fills the folder it is given (which exists, empty).
        tmp: the temporary folder's name, when readers rely on it (default: `.tmp-<name>-<pid>-<random>`).
        replace: False keeps a target that is already there (a concurrent writer's, first one
            wins): FileExistsError, and the new folder is discarded.

    Returns:
        What `write` returned.
    """
    target = Path(target)
    tmp = Path(tmp) if tmp is not None else temp_dir_for(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_tree(tmp)  # a killed writer's, under a fixed name
    tmp.mkdir(parents=True)
    try:
        result = write(tmp)
        fsync_tree(tmp)
        if replace and target.exists():
            _swap_in(tmp, target)
        else:
            _rename_new(tmp, target)
    except BaseException:
        remove_tree(tmp)
        raise
    fsync_dir(target.parent)
    return result


def _rename_new(tmp: Path, target: Path) -> None:
    try:
        os.rename(tmp, target)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise FileExistsError(exc.errno, "already there", str(target)) from exc
        raise


def _swap_in(tmp: Path, target: Path) -> None:
    # A folder cannot be renamed onto a non-empty one: the old one steps aside first.
    old = temp_dir_for(target, OLD_DIR_PREFIX)
    os.rename(target, old)
    try:
        os.rename(tmp, target)
    except BaseException:
        os.rename(old, target)
        raise
    remove_tree(old)
