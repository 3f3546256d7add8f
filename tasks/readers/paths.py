"""Where the readers' input files are, shared with the families that read inputs of their own
(chunking's DPR passage files, refresh's newer dumps): the downloads folder and a configured
file that must exist."""
from __future__ import annotations

import os
from pathlib import Path

from tasks.errors import InputError


def downloads_dir() -> Path:
    """Where downloaded inputs are kept: $PFORGE_DOWNLOADS, else ~/.cache/passage-forge/downloads
    (the data folder may be read-only)."""
    default = Path.home() / ".cache" / "passage-forge" / "downloads"
    return Path(os.environ.get("PFORGE_DOWNLOADS", default))


def existing(data, relative: str, what: str) -> Path:
    """`relative` under the `data` section's root (a DataConfig), refused when absent."""
    path = data.resolve(relative)
    if not path.exists():
        raise InputError(path, "file", f"{what} not found")
    return path
