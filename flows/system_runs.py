"""Which runs artifact (`bm25_runs`, `dense_runs` or `hybrid_runs`) a search serves a system
from: the newest one of that system in the store, the one a given config builds, or the newest
one built with the promoted encoder."""
from __future__ import annotations

from typing import Mapping

from flows.promotion import MODEL_STAGE, latest_promotion
from storage import Artifact, ArtifactStore
from tasks.config import PipelineConfig

RUNS_STAGES = ("bm25_runs", "dense_runs", "hybrid_runs")

#: (artifact stage, version) -> the config's Stage that builds it (its full parameters).
Planned = Mapping[tuple[str, str], object]


def planned_runs(cfg: PipelineConfig | None) -> Planned:
    """What `cfg` builds, by (artifact stage, planned version); empty without a config."""
    if cfg is None:
        return {}
    from flows.registry import plan_for

    plan = plan_for(cfg)
    return {(stage.artifact, plan.planned_version(stage.name)): stage for stage in plan}


def system_runs(store: ArtifactStore, system: str, cfg: PipelineConfig | None, planned: Planned) -> Artifact:
    """The runs artifact of `system` (a system name or a stage name): the one `cfg` builds when
    a config is given, else the store's newest."""
    if cfg is not None:
        return _configured_runs(store, system, cfg, planned)
    candidates = [a for a in (store.latest(stage, {"system": system}) for stage in RUNS_STAGES) if a is not None]
    if not candidates and system.startswith("search:"):
        return system_runs(store, system.split(":", 1)[1], None, planned)
    if not candidates and system in ("bm25_search", "bm25_runs"):
        return system_runs(store, "bm25", None, planned)
    if not candidates and system == "hybrid":  # the DPR hybrid of whichever dense system
        candidates = [a for a in _all_latest(store, "hybrid_runs") if system_name(a).startswith("hybrid(")]
    if not candidates and system.startswith("fusion:"):
        return system_runs(store, system.split(":", 1)[1], None, planned)
    if not candidates:
        known = sorted({system_name(a) for stage in RUNS_STAGES for a in _all_latest(store, stage)})
        raise ValueError(f"{store.root}: no system {system!r} has runs" + (f"; systems: {', '.join(known)}" if known
                                                                           else ": run a pipeline first"))
    return max(candidates, key=lambda a: a.manifest["created_at"])


def _configured_runs(store: ArtifactStore, system: str, cfg: PipelineConfig, planned: Planned) -> Artifact:
    by_system = {stage.variant["system"]: (version, stage) for (_, version), stage in planned.items()
                 if stage.produces_runs and "system" in stage.variant}
    by_stage = {stage.name: (version, stage) for (_, version), stage in planned.items() if stage.produces_runs}
    found = by_system.get(system) or by_stage.get(system) or by_stage.get({"bm25": "bm25_search"}.get(system, ""))
    if found is None:
        raise ValueError(f"config {cfg.name!r}: no system {system!r}; systems: {', '.join(sorted(by_system))}")
    version, stage = found
    artifact = store.get(stage.artifact, version)
    if artifact is None:
        raise RuntimeError(f"{store.root}: config {cfg.name!r} has not built {stage.name} ({stage.artifact} {version}): "
                           "run `pforge run` on it first")
    return artifact


def promoted_runs(store: ArtifactStore, planned: Planned) -> Artifact:
    """The newest dense runs made with the promoted encoder (of those `planned`, when any is)."""
    version = latest_promotion(store)
    if version is None:
        raise ValueError(f"{store.root}: no encoder has been promoted: `pforge promote VERSION` first "
                         f"(versions: `pforge artifacts --stage {MODEL_STAGE}`)")
    uses = [a for a in _all_versions(store, "dense_runs") if encoder_of(a) == version]
    if not uses:
        raise RuntimeError(f"{store.root}: the promoted {MODEL_STAGE} {version} has no FAISS index and runs yet: "
                           "run a config whose dense system uses it (its own train stage, or init_from: "
                           f"{MODEL_STAGE}:{version})")
    mine = [a for a in uses if (a.stage, a.version) in planned]
    return max(mine or uses, key=lambda a: a.manifest["created_at"])


def system_name(artifact: Artifact) -> str:
    """The system a runs artifact ranks for (its name in runs and metrics)."""
    return (artifact.manifest.get("variant") or {}).get("system", artifact.stage)


def encoder_of(runs: Artifact) -> str | None:
    """The dense_model version behind dense runs, when an input of theirs is one."""
    if runs.stage != "dense_runs":
        return None
    models = [rec["version"] for rec in runs.manifest.get("inputs", {}).values() if rec.get("stage") == MODEL_STAGE]
    return models[0] if models else None


def _all_versions(store: ArtifactStore, stage: str) -> list[Artifact]:
    rows = store.list_artifacts(stage)
    return [a for a in (store.get(r["stage"], r["version"]) for r in rows) if a is not None]


def _all_latest(store: ArtifactStore, stage: str) -> list[Artifact]:
    latest: dict[str, Artifact] = {}
    for artifact in _all_versions(store, stage):  # oldest first: the newest of each system wins
        latest[system_name(artifact)] = artifact
    return list(latest.values())
