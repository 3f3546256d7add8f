"""The registry of stage families: the order they declare their stages in, the stage aliases users
type, and `plan_for(config)`, the validated plan of one configuration. Adding a stage family is
one module under tasks/ plus one line here."""
from __future__ import annotations

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


def _resolve_config_references(cfg: PipelineConfig, seen: tuple[Path, ...] = ()) -> PipelineConfig:
    """`init_from: other.yaml:NAME` -> `dense_model:VERSION`, the version that config's train:NAME
    stage has (planned, not built: run that config first)."""
    if cfg.dense is None or not any(s.init_from and ".yaml:" in s.init_from for s in cfg.dense.systems):
        return cfg
    systems = []
    for system in cfg.dense.systems:
        if system.init_from and ".yaml:" in system.init_from:
            file, _, name = system.init_from.rpartition(":")
            path = (cfg.config_dir / file).resolve()
            if path in seen:
                raise PlanError(f"init_from {system.init_from!r}: configs refer to each other in a cycle")
            other = _resolve_config_references(load_config(path, smoke=cfg._smoke), (*seen, path))
            plan = plan_for(other)
            stage = f"train:{name}"
            if stage not in plan:
                raise PlanError(f"init_from {system.init_from!r}: {path} has no trained system {name!r}")
            version = plan.planned_version(stage)
            system = system.model_copy(update={"init_from": f"dense_model:{version}"})
        systems.append(system)
    resolved = cfg.model_copy(update={"dense": cfg.dense.model_copy(update={"systems": systems})})
    resolved._config_dir, resolved._smoke = cfg._config_dir, cfg._smoke
    return resolved

