"""How a runs artifact's runs were made, read once from its manifest into a typed recipe that
flows/rankers.py ranks a new question with: BM25's index and k1/b; a dense system's encoder,
encode settings, FAISS index and embeddings; a fusion's parts, method and weights. A manifest
that lacks a field a recipe needs is an error naming the manifest file."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Union

from pydantic import BaseModel, ValidationError

from flows.system_runs import RUNS_STAGES, Planned, system_name
from storage import Artifact, ArtifactStore
from storage.manifest import MANIFEST
from tasks.compute.encode import EncodeSettings
from tasks.compute.origin import Origin


@dataclass(frozen=True)
class InputRef:
    """An input a runs artifact's manifest records: the artifact `stage` `version`, under `key`."""
    key: str
    stage: str
    version: str
    owner: Path   # the folder of the artifact that records it

    def resolve(self, store: ArtifactStore) -> Artifact:
        found = store.get(self.stage, self.version)
        if found is None:
            raise RuntimeError(f"{self.owner}: its input {self.stage} {self.version} is not in {store.root} "
                               "(garbage-collected?): rerun the pipeline that built it")
        return found


@dataclass(frozen=True)
class Recipe:
    """What every recipe names: where its runs are, whose they are and how deep they go."""
    source: Path          # the runs artifact's folder
    system: str           # the system's name in runs and metrics
    depth: int | None     # how many passages per question its runs keep (parameters.k), when recorded


@dataclass(frozen=True)
class Bm25Recipe(Recipe):
    index: InputRef       # the bm25_index
    k1: float
    b: float


@dataclass(frozen=True)
class DenseRecipe(Recipe):
    origin: Origin
    settings: EncodeSettings
    device: str                  # as configured: 'auto' unless the config that ran it is given
    index: InputRef              # the faiss_index
    embeddings: InputRef         # its rows' passages
    model: InputRef | None       # the input holding the encoder's weights, when one does


@dataclass(frozen=True)
class FusionRecipe(Recipe):
    method: str                          # linear or rrf
    parts: tuple[InputRef, ...]          # the runs fused, in fusion order
    rrf_k: int | None                    # rrf
    weights: tuple[float, ...] | None    # linear: one per part


AnyRecipe = Union[Bm25Recipe, DenseRecipe, FusionRecipe]


class _Manifest:
    """A runs artifact's manifest, read field by field: a missing field names the file."""

    def __init__(self, artifact: Artifact):
        self.artifact = artifact
        self.file = artifact.path / MANIFEST

    def missing(self, what: str) -> RuntimeError:
        return RuntimeError(f"{self.file}: {self.artifact.stage} {self.artifact.version} records no {what}, which "
                            "search needs to rank a question as its runs were ranked")

    def parameter(self, name: str):
        params = self.artifact.manifest.get("parameters") or {}
        if name not in params:
            raise self.missing(f"parameters.{name}")
        return params[name]

    def parsed(self, name: str, model: type[BaseModel]):
        """parameters.`name` read as a `model`."""
        try:
            return model(**self.parameter(name))
        except (TypeError, ValidationError) as exc:
            raise RuntimeError(f"{self.file}: parameters.{name}: {exc}") from None

    def stat(self, name: str):
        stats = self.artifact.manifest.get("stats") or {}
        if name not in stats:
            raise self.missing(f"stats.{name}")
        return stats[name]

    def input(self, key: str) -> InputRef:
        record = (self.artifact.manifest.get("inputs") or {}).get(key)
        if record is None:
            raise self.missing(f"input {key!r}")
        return InputRef(key, record["stage"], record["version"], self.artifact.path)

    def only_input(self, stage: str) -> InputRef:
        keys = [key for key, rec in (self.artifact.manifest.get("inputs") or {}).items() if rec.get("stage") == stage]
        if len(keys) != 1:
            raise RuntimeError(f"{self.file}: expected one {stage} input, found {keys}")
        return self.input(keys[0])

    def common(self) -> dict:
        params = self.artifact.manifest.get("parameters") or {}
        return {"source": self.artifact.path, "system": system_name(self.artifact), "depth": params.get("k")}


def recipe_of(runs: Artifact, planned: Planned) -> AnyRecipe:
    """The recipe of the runs artifact `runs`; a config's plan (`planned`) that builds it supplies
    what the manifest leaves out (the device, a model folder given as a path)."""
    parse = {"bm25_runs": _bm25, "dense_runs": _dense, "hybrid_runs": _fusion}.get(runs.stage)
    if parse is None:
        raise ValueError(f"{runs.path}: {runs.stage} is not a runs artifact ({', '.join(RUNS_STAGES)})")
    return parse(_Manifest(runs), planned)


def _bm25(manifest: _Manifest, planned: Planned) -> Bm25Recipe:
    return Bm25Recipe(**manifest.common(), index=manifest.input("bm25_index"), k1=manifest.parameter("k1"),
                      b=manifest.parameter("b"))


def _dense(manifest: _Manifest, planned: Planned) -> DenseRecipe:
    runs = manifest.artifact
    stage = planned.get((runs.stage, runs.version))
    # A configured stage's origin keeps the model folder's path, which manifests leave out.
    origin = stage.params.origin if stage is not None else manifest.parsed("origin", Origin)
    if origin.init_hash is not None and origin.init_path is None:
        raise RuntimeError(f"{runs.path}: {system_name(runs)}'s encoder came from a model folder (init_from: PATH) "
                           "that the store does not record: pass --config with the config that ran it")
    return DenseRecipe(**manifest.common(), origin=origin, settings=manifest.parsed("settings", EncodeSettings),
                       device=stage.params.device if stage is not None else "auto",
                       index=manifest.only_input("faiss_index"), embeddings=manifest.only_input("embeddings"),
                       model=manifest.input(origin.model_input) if origin.model_input is not None else None)


def _fusion(manifest: _Manifest, planned: Planned) -> FusionRecipe:
    params = manifest.artifact.manifest.get("parameters") or {}
    if "runs" not in params and "systems" in params:
        raise ValueError(f"{manifest.artifact.path}: {system_name(manifest.artifact)} is an embedding fusion, which "
                         "search does not serve; search one of its systems")
    names, method = manifest.parameter("runs"), manifest.parameter("method")
    # The fusion's depth is its parts' depth too, where a part's manifest records none.
    common = {**manifest.common(), "depth": manifest.parameter("k")}
    parts = tuple(manifest.input(name) for name in names)
    if method == "rrf":
        return FusionRecipe(**common, method=method, parts=parts, rrf_k=manifest.parameter("rrf_k"), weights=None)
    weights = dict((name, w) for name, w in manifest.stat("weights"))
    missing = [name for name in names if name not in weights]
    if missing:
        raise manifest.missing(f"stats.weights of {', '.join(missing)}")
    return FusionRecipe(**common, method=method, parts=parts, rrf_k=None, weights=tuple(weights[name] for name in names))
