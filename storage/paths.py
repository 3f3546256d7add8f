"""Where things live under the store root. One place, so layout changes stay local."""
from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

ENV_HOME = "PFORGE_HOME"
CATALOG_FILE = "catalog.duckdb"
CATALOG_LOCK = ".catalog.lock"
TMP_PREFIX = ".tmp-"      # in-progress builds: .tmp-<version>-<pid>-<random>
TRASH_PREFIX = ".trash-"  # gc renames here first so a removed version vanishes atomically
DAMAGED_PREFIX = ".damaged-"  # `pforge verify --repair` moves a damaged version here, kept for inspection
IMPORT_PREFIX = ".import-"    # `pforge import` unpacks an archive here, under the root
IMPORT_LOCK = ".import.lock"  # held by an import while it runs: a free one means such a folder is a leftover


def resolve_root(cli_root: str | None = None) -> Path:
    """The artifact root every `pforge` command uses: `--root DIR` wins, then `$PFORGE_HOME`,
    then `./artifacts` (relative to the working directory); `~` expanded, always absolute.

    Args:
        cli_root: the `--root` value, or None when it was not given.

    Returns:
        The root folder, which may not exist yet (`ArtifactStore` decides whether to create it).
    """
    raw = cli_root or os.environ.get(ENV_HOME) or "artifacts"
    return Path(raw).expanduser().resolve()


def stage_dir(root: Path, stage: str) -> Path:
    return root / stage


def version_dir(root: Path, stage: str, version: str) -> Path:
    return root / stage / version


def lock_file(root: Path, stage: str, version: str) -> Path:
    return root / stage / ".locks" / f"{version}.lock"


def work_dir(root: Path, stage: str, version: str) -> Path:
    """Scratch space of a resumable build: it survives a killed build (the next attempt at the same
    version continues from it) and is removed once the version is committed."""
    return root / stage / f".work-{version}"


def damaged_dir(root: Path, stage: str, version: str, stamp: str) -> Path:
    """Where a damaged version is moved aside: hidden (no longer a committed version) and never
    deleted by the store, so what went wrong can be looked at; `stamp` keeps repeats apart."""
    return root / stage / f"{DAMAGED_PREFIX}{version}-{stamp}"


def new_tmp_dir(root: Path, stage: str, version: str) -> Path:
    # pid + random: several processes (or retries) never share a scratch folder.
    return root / stage / f"{TMP_PREFIX}{version}-{os.getpid()}-{secrets.token_hex(4)}"


def tmp_dir_version(name: str) -> str | None:
    """Version encoded in a tmp dir name, or None if the name is not ours."""
    if not name.startswith(TMP_PREFIX):
        return None
    parts = name[len(TMP_PREFIX):].split("-")
    return parts[0] if len(parts) >= 3 else None


def is_plain_name(name: str) -> bool:
    """A name that is one folder under its parent: no separators, no dots, nothing hidden."""
    return isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_\-]*", name) is not None


def check_name(kind: str, name: str) -> str:
    """Stage and table names become folder and SQL view names: keep them plain."""
    if not is_plain_name(name):
        raise ValueError(f"invalid {kind} name {name!r}: use letters, digits, _ and -")
    return name
