"""Version = content hash of what determines an artifact's content."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import PurePath
from typing import Any

VERSION_LEN = 16
_BLOCK = 1 << 20  # 1 MiB reads: a file of any size hashes in constant memory


def _default(obj: Any) -> Any:
    # Config objects arrive as pydantic models, dataclasses, paths, sets: reduce them to JSON
    # deterministically; anything else is an error, because str() of it may not be stable.
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, PurePath):
        return str(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=lambda x: json.dumps(x, sort_keys=True, default=_default))
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return obj.item()
    raise TypeError(f"parameter value of type {type(obj).__name__} is not JSON-serialisable")


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=True, default=_default)


def normalize(value: Any) -> Any:
    """The JSON form of `value` (what gets hashed and what the manifest records)."""
    return json.loads(canonical_json(value))


def version_for(stage: str, code_version: str, params: dict, inputs: dict[str, str]) -> str:
    payload = {"stage": stage, "code_version": str(code_version),
               "params": params or {}, "inputs": {k: str(v) for k, v in (inputs or {}).items()}}
    return hashlib.sha256(canonical_json(payload).encode("utf-8")).hexdigest()[:VERSION_LEN]


def file_sha256(path: PurePath | str) -> str:
    """The SHA-256 of a file's bytes, hex, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()
