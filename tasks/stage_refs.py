"""References from a config to an artifact another run built: `ARTIFACT:VERSION` (any version in
the store) or `other.yaml:STAGE` (the version that config's plan gives STAGE; flows/registry.py
resolves it to `ARTIFACT:VERSION` at planning). Used where a stage can take a model another
config trained instead of training its own: `qgen.generator: squad-open.yaml:qgen_model`,
`cross_encoder.model: silver.yaml:cross_encoder` (issue 25's adaptation recipe). A dense system's
`init_from` uses both forms beside its own (`parse_init_from`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

CONFIG_SUFFIXES = (".yaml:", ".yml:")
#: The artifact a dense system's train stage writes: `init_from: dense_model:VERSION` pins one.
MODEL_ARTIFACT = "dense_model"


def is_config_reference(value: str) -> bool:
    """`other.yaml:STAGE`."""
    return any(s in value for s in CONFIG_SUFFIXES)


def split_config_reference(value: str) -> tuple[str, str]:
    """`other.yaml:STAGE` -> ('other.yaml', 'STAGE'); a stage's name may hold a colon
    (`other.yaml:pairs:silver`)."""
    end = min(value.index(suffix) + len(suffix) - 1 for suffix in CONFIG_SUFFIXES if suffix in value)
    return value[:end], value[end + 1:]


def pinned_version(value: str, artifact: str) -> Optional[str]:
    """VERSION of `ARTIFACT:VERSION` when `value` is one for `artifact`, else None."""
    prefix = f"{artifact}:"
    if value.startswith(prefix) and len(value) > len(prefix) and "/" not in value:
        return value[len(prefix):]
    return None


def is_reference(value: str, artifact: str) -> bool:
    """Whether `value` names a built `artifact` (by version or through another config)."""
    return is_config_reference(value) or pinned_version(value, artifact) is not None


@dataclass(frozen=True)
class InitFrom:
    """A dense system's `init_from`, parsed: where its training starts."""
    kind: Literal["system", "pretrain", "artifact", "config", "path"]
    # system and config: the system's name; pretrain: the run's name; artifact: the model's version;
    # path: the folder as written
    target: str
    file: Optional[str] = None  # config: the other config's file


def parse_init_from(value: Optional[str]) -> Optional[InitFrom]:
    """`other.yaml:NAME` (config, that config's system NAME), `pretrain:NAME` (a pretrain run of
    this config), `dense_model:VERSION` (artifact), a folder (holds '/' or starts with '.': path),
    else another system of this config (system); in that order. None (no init_from): None."""
    if not value:
        return None
    if is_config_reference(value):
        file, name = split_config_reference(value)
        return InitFrom("config", name, file)
    if value.startswith("pretrain:"):
        return InitFrom("pretrain", value.split(":", 1)[1])
    version = pinned_version(value, MODEL_ARTIFACT)
    if version is not None:
        return InitFrom("artifact", version)
    if "/" in value or value.startswith("."):
        return InitFrom("path", value)
    return InitFrom("system", value)
