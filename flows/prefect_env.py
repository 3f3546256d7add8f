"""The Prefect settings of a `pforge` process, set in its environment before Prefect is imported
(Prefect reads them once, and its ephemeral server subprocess inherits them). A user's explicit
setting always wins.

- Analytics off: there is no network here, and a server that tries prints a telemetry error.
- A start-up timeout for the ephemeral server that a loaded 2-core machine meets (Prefect's 20 s
  is not: with every core busy the server takes longer to import and migrate its database).
- One ephemeral server at a time per SQLite database. Two runs on the default database
  (`$PREFECT_HOME/prefect.db`) fail each other's writes with "database is locked": SQLite WAL
  refuses a read transaction's upgrade to a write after another writer committed, whatever the
  busy timeout, so no timeout fixes it. The first `pforge` process holds a lock beside that
  database and uses it as before (its runs stay in the history a later `prefect server start`
  shows, and its server starts on an already migrated database); a process that finds the lock
  held gets a database of its own in a temporary folder, removed when it exits (or, after a
  crash, by the next start). What that run loses is only its place in the shared history (its
  artifacts, manifests and lineage are in the store as always). Nothing changes when the user
  chose a server (PREFECT_API_URL) or a database (PREFECT_API_DATABASE_CONNECTION_URL).

Prefect's client already retries 408/429/502/503 and transient connection errors
(PREFECT_CLIENT_MAX_RETRIES, default 5, exponential back-off from 2 s: bounded at about a minute).
"""
from __future__ import annotations

import atexit
import fcntl
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import MutableMapping

DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # Prefect counts only its 0.1 s sleeps towards this, so the wall-clock wait is longer still.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
}
DATABASE_VARIABLES = ("PREFECT_API_DATABASE_CONNECTION_URL", "PREFECT_SERVER_DATABASE_CONNECTION_URL")
DATABASE_DIR_PREFIX = "pforge-prefect-"
_DIR_NAME = re.compile(re.escape(DATABASE_DIR_PREFIX) + r"(\d+)-")


SHARED_DATABASE_LOCK = "pforge-ephemeral-server.lock"
_held_locks = []   # open for the life of the process: the kernel releases them however it ends


def configure_prefect_environment(environ: MutableMapping[str, str] = os.environ,
                                  temp_root: str | None = None) -> Path | None:
    """Sets the defaults above where the user set nothing; returns the private database folder
    (None when this process uses the shared one, or the user chose a server or a database),
    which the caller removes at exit."""
    for name, value in DEFAULTS.items():
        environ.setdefault(name, value)
    if environ.get("PREFECT_API_URL") or any(environ.get(name) for name in DATABASE_VARIABLES):
        return None
    temp_root = temp_root or tempfile.gettempdir()
    remove_stale_database_dirs(temp_root)
    if _lock_shared_database(Path(environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()):
        return None
    folder = Path(tempfile.mkdtemp(prefix=f"{DATABASE_DIR_PREFIX}{os.getpid()}-", dir=temp_root))
    environ["PREFECT_API_DATABASE_CONNECTION_URL"] = f"sqlite+aiosqlite:///{folder / 'prefect.db'}"
    return folder


def _lock_shared_database(prefect_home: Path) -> bool:
    """True if this process now holds the default database's lock (for as long as it lives)."""
    try:
        prefect_home.mkdir(parents=True, exist_ok=True)
        handle = open(prefect_home / SHARED_DATABASE_LOCK, "a")
    except OSError:  # an unwritable home: a private database works anyway
        return False
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return False
    _held_locks.append(handle)
    return True


def remove_database_dir(folder: Path | None) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def remove_stale_database_dirs(temp_root: str) -> list[Path]:
    """The private database folders of `pforge` processes that no longer exist (killed -9, power
    loss): their owner's pid is in the name."""
    removed = []
    for folder in Path(temp_root).glob(f"{DATABASE_DIR_PREFIX}*"):
        match = _DIR_NAME.match(folder.name)
        if match and folder.is_dir() and not _alive(int(match.group(1))):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # somebody else's process
        return True
    return True


def prepare_process() -> Path | None:
    """For a `pforge` process (not a test calling `main` in its own process): the environment
    above, with the private database removed at exit (registered before Prefect's own exit
    handler, so it runs after the server has stopped)."""
    folder = configure_prefect_environment()
    atexit.register(remove_database_dir, folder)
    return folder
