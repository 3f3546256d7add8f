"""The registry of stage families: the order they declare their stages in, the stage aliases users
type, and `plan_for(config)`, the validated plan of one configuration. Adding a stage family is
one package under tasks/ plus its import and its place in `FAMILIES` here (docs/contributing.md
lists the other files it touches)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tasks.bm25 import stages as bm25
from tasks.chunking import stages as chunking
from tasks.config import PipelineConfig, load_config
from tasks.dense import stages as dense
from tasks.engine import Plan, PlanError
from tasks.evaluation import stages as evaluation
from tasks.fusion import stages as fusion
from tasks.gold import stages as gold
from tasks.negatives import stages as negatives
from tasks.qgen import stages as qgen
from tasks.pretrain import stages as pretrain
from tasks.readers import stages as ingest
from tasks.rerank import stages as rerank
from tasks.silver import stages as silver
from tasks.stage_refs import is_config_reference, parse_init_from, split_config_reference
from tasks.training import stages as training

# Each family declares its stages from the config and the stages declared before it.
FAMILIES = [ingest, chunking, gold, bm25, qgen, negatives, pretrain, silver, training, dense, fusion, rerank, evaluation]

ALIASES = {"ingest": "ingest_documents", "questions": "ingest_questions", "gold": "link_gold",
           "index": "bm25_index", "retrieve": "bm25_search", "bm25": "bm25_search", "eval": "evaluate"}


def plan_for(cfg: PipelineConfig) -> Plan:
    cfg = _resolve_config_references(cfg)
    declared = []
    for family in FAMILIES:
        declared += family.stages(cfg, list(declared))
    return Plan(declared, ALIASES)


@dataclass(frozen=True)
class ConfigReference:
    """An artifact a config reads from another config's run (`other.yaml:STAGE`, resolved): the
    stage of that config which builds it, and the version that config's plan gives it."""
    written: str       # as the config writes it: "squad-open.yaml:qgen_model"
    config: Path       # the other config's file
    stage: str
    artifact: str
    version: str


def config_references(cfg: PipelineConfig) -> list[ConfigReference]:
    """Every `other.yaml:...` reference of `cfg`, resolved (its run stops at a stage that reads one
    the artifact root lacks: the study builds those first)."""
    return [reference for _, reference in _references(cfg, ())]


def _references(cfg: PipelineConfig, seen: tuple[Path, ...]) -> list[tuple[str | int, ConfigReference]]:
    """`cfg`'s `other.yaml:...` references, each with where it is written: a dense system's
    `init_from` (the system's index), "qgen" (`qgen.generator`) or "cross_encoder" (its `model`)."""
    out = []
    for index, system in enumerate(cfg.dense.systems if cfg.dense is not None else []):
        init = parse_init_from(system.init_from)
        if init is not None and init.kind == "config":
            out.append((index, _planned_elsewhere(cfg, system.init_from, init.file, f"train:{init.target}", seen,
                                                  f"has no trained system {init.target!r}")))
    models = (("qgen", cfg.qgen.generator if cfg.qgen is not None else None, "qgen_model",
               "fine-tunes no generator (qgen:)"),
              ("cross_encoder", cfg.cross_encoder.model if cfg.cross_encoder is not None else None, "cross_encoder",
               "trains no cross_encoder"))
    for where, written, wanted, missing in models:
        if written and is_config_reference(written):
            file, stage = split_config_reference(written)
            _expect_stage(written, stage, wanted)
            out.append((where, _planned_elsewhere(cfg, written, file, stage, seen, missing)))
    return out


def _resolve_config_references(cfg: PipelineConfig, seen: tuple[Path, ...] = ()) -> PipelineConfig:
    """Every `other.yaml:...` reference -> `ARTIFACT:VERSION`, the version that config's plan gives
    the stage (planned, not built: run that config first): a dense system's `init_from:
    other.yaml:NAME` (its train:NAME), `qgen.generator: other.yaml:qgen_model` and
    `cross_encoder.model: other.yaml:cross_encoder`."""
    updates, systems = {}, list(cfg.dense.systems) if cfg.dense is not None else []
    references = _references(cfg, seen)
    for where, reference in references:
        pinned = f"{reference.artifact}:{reference.version}"
        if where == "qgen":
            updates["qgen"] = cfg.qgen.model_copy(update={"generator": pinned})
        elif where == "cross_encoder":
            updates["cross_encoder"] = cfg.cross_encoder.model_copy(update={"model": pinned})
        else:
            systems[where] = systems[where].model_copy(update={"init_from": pinned})
    if any(isinstance(where, int) for where, _ in references):
        updates["dense"] = cfg.dense.model_copy(update={"systems": systems})
    if not updates:
        return cfg
    resolved = cfg.model_copy(update=updates)
    resolved._config_dir, resolved._smoke = cfg._config_dir, cfg._smoke
    return resolved


def _expect_stage(reference: str, stage: str, wanted: str) -> None:
    if stage != wanted:
        raise PlanError(f"{reference!r}: name the stage that builds it, other.yaml:{wanted}")


def _planned_elsewhere(cfg: PipelineConfig, reference: str, file: str, stage: str, seen: tuple[Path, ...],
                       missing: str) -> ConfigReference:
    """`stage` of the config `file` (beside cfg, or beside a config it extends), planned."""
    path = cfg.referenced_config(file)
    if path in seen:
        raise PlanError(f"{reference!r}: configs refer to each other in a cycle")
    other = _resolve_config_references(load_config(path, smoke=cfg._smoke), (*seen, path))
    plan = plan_for(other)
    if stage not in plan:
        raise PlanError(f"{reference!r}: {path} {missing}")
    return ConfigReference(reference, path, stage, plan[stage].artifact, plan.planned_version(stage))
