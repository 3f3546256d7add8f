"""Model references in a config (a generator, a base encoder), checked when the config loads.

A reference is a packaged alias (models/checkpoints.py), an existing folder, or a hub name
(`org/name`, or a legacy bare name such as `bert-base-uncased`). Offline (HF_HUB_OFFLINE=1) a hub
name must be in the local hub cache; online a bare name that is not a hub repository can only be
found out by asking the hub, which loading does. Anything else would fail only once the pipeline
reached the stage that loads it, behind minutes of work and a hub URL error.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

HUB_NAME = re.compile(r"(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*")  # hub repository ids: [org/]name
OFFLINE_VALUES = {"1", "on", "yes", "true"}


def hub_offline() -> bool:
    return any(os.environ.get(var, "").strip().lower() in OFFLINE_VALUES for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def in_hub_cache(name: str) -> bool:
    """Whether the local hub cache holds a snapshot of repository `name`."""
    from huggingface_hub.constants import HF_HUB_CACHE

    snapshots = Path(HF_HUB_CACHE) / f"models--{name.replace('/', '--')}" / "snapshots"
    return snapshots.is_dir() and any(snapshots.iterdir())


def check_model_reference(name: str) -> str:
    """`name` if it can name a model; ValueError (one line, the fix in it) otherwise."""
    from models.checkpoints import ALIASES

    aliases = ", ".join(sorted(ALIASES))
    if name.lower() in ALIASES or Path(name).expanduser().exists():
        return name
    if HUB_NAME.fullmatch(name):
        if hub_offline() and not in_hub_cache(name):
            raise ValueError(f"{name!r} is a hub name, but the hub is offline (HF_HUB_OFFLINE=1) and the local hub "
                             f"cache lacks it: use an alias ({aliases}) or a model folder, or download it first")
        return name
    raise ValueError(f"{name!r} is not a model: neither an alias ({aliases}), an existing folder, nor a hub name "
                     "'[org/]name'")
