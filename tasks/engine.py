"""The stage engine: the `Stage` declaration, a validated `Plan` of one config's stages, version
planning, running a stage, and upstream resolution for single-stage reruns.

A stage's builder is called as `build(params, inputs, out)`: `params` is the frozen object its
version is hashed from, so a builder cannot read a setting its version does not record. Fields
that only say how to compute (device, threads, shard size) are declared in the params class's
`RUNTIME` and left out of the hash; everything else is hashed. A field added to a params model
(or to any model nested in one) after versions were built without it is declared in that model's
`ADDED` with the value those versions had: while it holds that value it stays out of the hash, so
they keep their versions (`without_added`). A field that regroups a model's fields into a nested
model is named in that model's `INLINE`, and hashes as the fields it holds (`with_inlined`).
Stage families (tasks/<family>/stages.py) import this module; flows/ assembles them.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Mapping

from pydantic import BaseModel, ConfigDict

from storage import Artifact, ArtifactStore, version_for

logger = logging.getLogger("passage_forge")


class StageParams(BaseModel):
    """What a stage's builder may read. Frozen: the object hashed is the object used."""
    model_config = ConfigDict(frozen=True, extra="forbid")
    # Fields that do not change the output (where and how fast it is computed): not hashed.
    # Dotted names reach into nested models ("origin.init_path").
    RUNTIME: ClassVar[frozenset[str]] = frozenset()
    # Fields added after versions were built: name -> the value those versions had (module docstring).
    ADDED: ClassVar[Mapping[str, Any]] = {}

    def hashed(self) -> dict:
        exclude: dict = {}
        for name in self.RUNTIME:
            *parents, leaf = name.split(".")
            node = exclude
            for parent in parents:
                node = node.setdefault(parent, {})
            node[leaf] = True
        return with_inlined(self, without_added(self, self.model_dump(mode="json", exclude=exclude)))


def without_added(model: BaseModel, dumped: dict) -> dict:
    """`dumped` (`model`'s JSON dump) without each field that `model`, or a model nested in it,
    declares in its `ADDED` while the field holds the declared value. Dotted names reach into a
    nested model that declares nothing itself ("config.queries")."""
    out = dict(dumped)
    for name in type(model).model_fields:
        if name in out:
            out[name] = _in_nested_models(getattr(model, name), out[name], without_added)
    for dotted, value in getattr(type(model), "ADDED", {}).items():
        *parents, leaf = dotted.split(".")
        node = out
        for parent in parents:
            node = node.get(parent) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf in node and node[leaf] == value:
            del node[leaf]
    return out


def _in_nested_models(value: Any, dumped: Any, rule: Callable[[BaseModel, dict], dict]) -> Any:
    """`dumped` (`value`'s dump) with `rule` applied to every model inside it, through lists and dicts."""
    if isinstance(value, BaseModel) and isinstance(dumped, dict):
        return rule(value, dumped)
    if isinstance(value, (list, tuple)) and isinstance(dumped, list) and len(value) == len(dumped):
        return [_in_nested_models(v, d, rule) for v, d in zip(value, dumped)]
    if isinstance(value, dict) and isinstance(dumped, dict):
        return {k: _in_nested_models(value.get(k), d, rule) for k, d in dumped.items()}
    return dumped


def with_inlined(model: BaseModel, dumped: dict) -> dict:
    """`dumped` (`model`'s JSON dump) with each field that `model`, or a model nested in it, names
    in its `INLINE` replaced by that field's own fields, as if they sat beside the others (a
    section regrouped into a nested object keeps the versions planned before)."""
    out = {name: _in_nested_models(getattr(model, name, None), value, with_inlined) for name, value in dumped.items()}
    for name in getattr(type(model), "INLINE", ()):
        inner = out.pop(name, None)
        if isinstance(inner, dict):
            clash = sorted(set(inner) & set(out))
            if clash:
                raise ValueError(f"{type(model).__name__}.{name}: {clash} also sit beside it; it cannot be inlined")
            out.update(inner)
    return out


class NoParams(StageParams):
    pass


Build = Callable[[StageParams, dict[str, Artifact], Path], "dict | None"]


@dataclass(frozen=True)
class Pinned:
    """An input fixed to one artifact version (e.g. a model trained by another config's run)."""
    artifact: str
    version: str


@dataclass(frozen=True)
class Stage:
    name: str                     # what users type: pforge run ... --stage NAME
    artifact: str                 # the artifact stage (folder and DuckDB view name)
    code_version: str             # bump when the output for the same inputs changes
    inputs: tuple[str, ...]       # upstream stage names of the same plan
    params: StageParams
    build: Build
    produces_runs: bool = False   # its table is a runs table that the evaluation scores
    pinned: Mapping[str, Pinned] = field(default_factory=dict)  # inputs fixed to artifact versions
    variant: Mapping[str, str] = field(default_factory=dict)    # catalog columns telling parallel artifacts apart
    # A resumable build is called as build(params, inputs, out, work): `work` keeps its finished
    # shards across a killed run (same version) and is removed once the artifact is committed.
    resumable: bool = False


class PlanError(ValueError):
    pass


class Plan:
    """The stages of one configuration, checked: unique names, declared inputs exist upstream,
    no cycle. Iterates in an order where inputs come first (the declared order when it is one)."""

    def __init__(self, stages: list[Stage], aliases: Mapping[str, str] | None = None):
        self.aliases = dict(aliases or {})
        by_name: dict[str, Stage] = {}
        for stage in stages:
            if stage.name in by_name:
                raise PlanError(f"stage {stage.name!r} is declared twice")
            by_name[stage.name] = stage
        for stage in stages:
            missing = [dep for dep in stage.inputs if dep not in by_name]
            if missing:
                raise PlanError(f"stage {stage.name!r} needs {missing}, which this configuration does not declare")
        self.stages = {name: by_name[name] for name in _topological(by_name)}
        self._planned: dict[str, str] = {}

    def __iter__(self) -> Iterator[Stage]:
        return iter(self.stages.values())

    def __getitem__(self, name: str) -> Stage:
        return self.stages[name]

    def __contains__(self, name: str) -> bool:
        return name in self.stages

    def names(self) -> list[str]:
        return list(self.stages)

    def resolve_name(self, name: str) -> str:
        name = self.aliases.get(name, name)
        if name not in self.stages:
            raise ValueError(f"unknown stage {name!r}; stages: {', '.join(self.stages)}")
        return name

    def needed_for(self, name: str) -> set[str]:
        """`name` and every stage it reads from, directly or not (pinned inputs are built elsewhere)."""
        needed, todo = set(), [self.resolve_name(name)]
        while todo:
            stage = todo.pop()
            if stage not in needed:
                needed.add(stage)
                todo.extend(self.stages[stage].inputs)
        return needed

    def planned_version(self, name: str) -> str:
        """The version `name` would get, computed without building anything (or opening a store)."""
        if name not in self._planned:
            stage = self.stages[name]
            upstream = {dep: self.planned_version(dep) for dep in stage.inputs}
            upstream.update({key: pin.version for key, pin in stage.pinned.items()})
            self._planned[name] = version_for(stage.artifact, stage.code_version, stage.params.hashed(), upstream)
        return self._planned[name]

    def missing_pins(self, store: ArtifactStore, name: str) -> list[Pinned]:
        """The inputs of `name` pinned to another run's artifacts that `store` lacks."""
        return [pin for pin in self.stages[name].pinned.values() if store.get(pin.artifact, pin.version) is None]

    def pins_to_fetch(self, store: ArtifactStore | None, name: str) -> list[Pinned]:
        """What a run of `name` on `store` still needs from other runs: nothing once it is built
        (it is read, not rerun), every pinned input without a store, else the pins `store` lacks."""
        if store is None:
            return list(self.stages[name].pinned.values())
        if store.get(self.stages[name].artifact, self.planned_version(name)) is not None:
            return []
        return self.missing_pins(store, name)

    def pinned_inputs(self, store: ArtifactStore, name: str) -> dict[str, Artifact]:
        out = {}
        for key, pin in self.stages[name].pinned.items():
            artifact = store.get(pin.artifact, pin.version)
            if artifact is None:
                raise RuntimeError(f"stage {name!r} needs {pin.artifact} {pin.version}, which is not in {store.root}: "
                                   "run the configuration that builds it first")
            out[key] = artifact
        return out

    def upstream_for_single_stage(self, store: ArtifactStore, name: str) -> dict[str, Artifact]:
        """Inputs for rerunning one stage: the upstream artifacts this config produces, else the latest."""
        inputs = {}
        for dep in self.stages[name].inputs:
            upstream = self.stages[dep]
            found = (store.get(upstream.artifact, self.planned_version(dep))
                     or store.latest(upstream.artifact, upstream.variant or None))
            if found is None:
                raise RuntimeError(f"stage {name!r} needs {dep!r}, which has never run: run the pipeline first")
            inputs[dep] = found
        return {**inputs, **self.pinned_inputs(store, name)}


def not_needed(plan: Plan, store: ArtifactStore, names: list[str]) -> set[str]:
    """The stages of `names` (in run order) that a run can leave out: not built, and every stage
    of `names` that reads them is built or left out too (an imported artifact's producers: a
    machine given the generated queries does not fine-tune the generator that wrote them). A
    stage nobody in `names` reads (what was asked for) is never left out, nor one whose version
    `pforge verify --repair` moved aside: the repair promises its rebuild."""
    readers: dict[str, list[str]] = {name: [] for name in names}
    for name in names:
        for dep in plan[name].inputs:
            if dep in readers:
                readers[dep].append(name)
    built = {name: store.get(plan[name].artifact, plan.planned_version(name)) is not None for name in names}
    repaired = {name for name in names if not built[name]
                and store.moved_aside(plan[name].artifact, plan.planned_version(name))}
    skipped: set[str] = set()
    for name in reversed(names):
        if not built[name] and name not in repaired and readers[name] and all(built[r] or r in skipped for r in readers[name]):
            skipped.add(name)
    return skipped


def _topological(stages: Mapping[str, Stage]) -> list[str]:
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, path: tuple[str, ...]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            raise PlanError(f"stage inputs form a cycle: {' -> '.join((*path, name))}")
        state[name] = "visiting"
        for dep in stages[name].inputs:
            visit(dep, (*path, name))
        state[name] = "done"
        order.append(name)

    for name in stages:
        visit(name, ())
    return order


def run_stage(store: ArtifactStore, stage: Stage, inputs: dict[str, Artifact],
              before_commit: Callable[[Path], None] | None = None) -> Artifact:
    """Build `stage` into the store (a cache hit when its version exists). `before_commit` runs on
    the finished folder before it becomes visible: if it fails, nothing is registered."""
    work = store.work_dir(stage.artifact, stage.code_version, stage.params.hashed(), inputs) if stage.resumable else None

    def build(out: Path):
        if work is not None:
            work.mkdir(parents=True, exist_ok=True)
            extra = stage.build(stage.params, inputs, out, work)
        else:
            extra = stage.build(stage.params, inputs, out)
        if before_commit is not None:
            before_commit(out)
        if stage.variant:
            extra = {**(extra or {}), "variant": dict(stage.variant)}
        return extra

    artifact = store.materialize(stage.artifact, stage.code_version, stage.params.hashed(), inputs, build)
    logger.info("%s: %s %s (%s)", stage.name, stage.artifact, artifact.version, "cache hit" if artifact.cache_hit else "built")
    return artifact
