"""Converted models (an ONNX export, its int8 quantisation, a CTranslate2 conversion) cached per
model version: the key is a digest of the source folder's files (names and bytes) plus what the
conversion was (kind, precision, converter versions), so a retrained model never reuses a stale
conversion and the same weights are converted once per machine.

The cache lives in $PFORGE_RUNTIME_CACHE, else ~/.cache/passage-forge/runtimes. A conversion is
built in a temporary folder beside its final place and renamed in, under a per-key lock, so two
processes (Dask workers, two runs) never see half a conversion and convert only once.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable

from storage.atomic import atomic_dir
from storage.fsutil import remove_tree
from storage.locks import file_lock
from storage.file_identity import file_sha256

CACHE_ENV = "PFORGE_RUNTIME_CACHE"
DONE = ".complete"  # written last inside a conversion: its presence means the folder is whole


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "passage-forge" / "runtimes"


def folder_digest(folder: Path) -> str:
    """sha256 over every file's relative name and content digest (content digests are memoised by
    path, size and mtime, so a second call on an unchanged folder reads nothing)."""
    folder = Path(folder)
    digest = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(f"{f.relative_to(folder)}\0{file_sha256(f)}\n".encode())
    return digest.hexdigest()


def cached_conversion(source: Path, kind: str, settings: dict, build: Callable[[Path], None]) -> Path:
    """The folder of `source` converted as `kind` with `settings` (JSON-able: precision, opset,
    converter versions...), built by `build(target_folder)` on first use."""
    key = hashlib.sha256(json.dumps({"source": folder_digest(source), "kind": kind, "settings": settings},
                                    sort_keys=True).encode()).hexdigest()[:24]
    final = cache_root() / kind / key
    if (final / DONE).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(final.parent / f".{key}.lock"):
        if (final / DONE).is_file():  # another process converted it while this one waited
            return final
        if final.exists():  # a conversion that died before its marker
            remove_tree(final)

        def convert(tmp: Path) -> None:
            build(tmp)
            (tmp / "conversion.json").write_text(json.dumps({"source": str(source), "kind": kind, "settings": settings},
                                                            indent=2, sort_keys=True) + "\n")
            (tmp / DONE).write_text("")

        atomic_dir(final, convert)
    return final
