"""Where `cross_encoder.model` points: a cross_encoder artifact pinned by version
('cross_encoder:VERSION'), a model folder (absolute, or relative to the config's folder), or a hub
name."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from tasks.compute.origin import folder_hash


def classifier_reference(reference: str, cfg_dir: Optional[Path]) -> tuple[Optional[str], Optional[str], Optional[str]]:
    """`cross_encoder.model` resolved: (artifact version, None, None) for `cross_encoder:VERSION`,
    (None, absolute folder, its digest) for a folder, (None, None, None) for a hub name; a path
    that is no folder fails, naming it."""
    from tasks.errors import InputError
    from tasks.stage_refs import pinned_version

    version = pinned_version(reference, "cross_encoder")
    if version is not None:
        return version, None, None
    path = model_folder(reference, cfg_dir)
    if path.is_dir():
        return None, str(path.resolve()), folder_hash(path)
    if looks_like_path(reference):
        raise InputError(path, "cross_encoder.model", "no such model folder")
    return None, None, None


def model_folder(reference: str, cfg_dir: Optional[Path]) -> Path:
    """A folder reference as a path: absolute, or relative to the config's folder."""
    path = Path(reference).expanduser()
    return path if path.is_absolute() else (cfg_dir or Path.cwd()) / path


def looks_like_path(reference: str) -> bool:
    return reference.startswith((".", "/", "~"))


