"""References from a config to an artifact another run built: `ARTIFACT:VERSION` (any version in
the store) or `other.yaml:STAGE` (the version that config's plan gives STAGE; flows/registry.py
resolves it to `ARTIFACT:VERSION` at planning). Used where a stage can take a model another
config trained instead of training its own: `qgen.generator: squad-open.yaml:qgen_model`,
`cross_encoder.model: silver.yaml:cross_encoder` (issue 25's adaptation recipe)."""
from __future__ import annotations

from typing import Optional

CONFIG_SUFFIXES = (".yaml:", ".yml:")


def is_config_reference(value: str) -> bool:
    """`other.yaml:STAGE`."""
    return any(s in value for s in CONFIG_SUFFIXES)


def split_config_reference(value: str) -> tuple[str, str]:
    """`other.yaml:STAGE` -> ('other.yaml', 'STAGE')."""
    file, _, stage = value.rpartition(":")
    return file, stage


def pinned_version(value: str, artifact: str) -> Optional[str]:
    """VERSION of `ARTIFACT:VERSION` when `value` is one for `artifact`, else None."""
    prefix = f"{artifact}:"
    if value.startswith(prefix) and len(value) > len(prefix) and "/" not in value:
        return value[len(prefix):]
    return None


def is_reference(value: str, artifact: str) -> bool:
    """Whether `value` names a built `artifact` (by version or through another config)."""
    return is_config_reference(value) or pinned_version(value, artifact) is not None
