"""Run configuration: pydantic models that validate the YAML files and render as Prefect UI forms."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from tasks.bm25.stages import BM25Config
from tasks.chunking.stages import ChunkConfig
from tasks.compute.encode import EncodeConfig
from tasks.dense.stages import DenseModelConfig, FaissConfig
from tasks.evaluation.stages import EvalConfig
from tasks.model_refs import check_model_reference
from tasks.fusion.stages import FusionConfig, HybridConfig
from tasks.negatives.stages import NegativesConfig
from tasks.qgen.stages import QgenConfig
from tasks.pretrain.stages import PretrainConfig, check_pretrain_config
from tasks.rerank.stages import RerankConfig
from tasks.silver.model_reference import looks_like_path, model_folder
from tasks.silver.config import CrossEncoderConfig, SilverConfig
from tasks.stage_refs import is_reference, parse_init_from
from tasks.refresh.config import RefreshConfig
from tasks.runners import RunnerConfig
from tasks.readers.stages import PROJECT_ROOT, BeirSource, DataConfig, QaFile, QaSource, SplitConfig, SquadSource
from tasks.training.stages import DenseTrainConfig

__all__ = ["BM25Config", "BeirSource", "ChunkConfig", "ConfigError", "DataConfig", "DenseConfig", "DenseModelConfig",
           "DenseSystemConfig", "DenseTrainConfig", "EncodeConfig", "EvalConfig", "FaissConfig", "FusionConfig",
           "HybridConfig", "NegativesConfig", "PROJECT_ROOT", "PipelineConfig", "QgenConfig", "QaFile", "QaSource", "SplitConfig",
           "SquadSource", "load_config", "merge_config"]

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]*$"  # a folder, a Prefect artifact key and a deployment name


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DenseSystemConfig(_Strict):
    name: str = Field(..., pattern=r"^[A-Za-z0-9_-]+$", description="system name in runs and metrics")
    model: DenseModelConfig = Field(default_factory=DenseModelConfig)
    train: Optional[DenseTrainConfig] = Field(None, description="absent: the encoder is used as it starts (zero-shot)")
    init_from: Optional[str] = Field(
        None, description="start from another system's trained encoder (its name), a model artifact of any run "
                          "('dense_model:VERSION'), another config's system ('other.yaml:NAME'), a pre-trained base "
                          "encoder ('pretrain:NAME'), or a model folder (a path)")
    evaluate: bool = Field(True, description="false: train only (e.g. a stage-1 model that others start from), no encode/index/search")

    @model_validator(mode="after")
    def _evaluated_or_trained(self):
        if not self.evaluate and self.train is None:
            raise ValueError(f"{self.name}: evaluate: false leaves nothing to do without train")
        return self


class DenseConfig(_Strict):
    systems: list[DenseSystemConfig] = Field(default_factory=list)
    encode: EncodeConfig = Field(default_factory=EncodeConfig)
    index: FaissConfig = Field(default_factory=FaissConfig)
    hybrid: Optional[HybridConfig] = None

    @model_validator(mode="after")
    def _known_systems(self):
        names = [s.name for s in self.systems]
        if len(set(names)) != len(names):
            raise ValueError(f"dense system names must be unique: {names}")
        if self.hybrid and self.hybrid.system not in names:
            raise ValueError(f"hybrid.system {self.hybrid.system!r} is not one of the dense systems {names}")
        if self.hybrid and not next(s for s in self.systems if s.name == self.hybrid.system).evaluate:
            raise ValueError(f"hybrid.system {self.hybrid.system!r} has evaluate: false (it writes no runs)")
        trained = {s.name for s in self.systems if s.train}
        for s in self.systems:
            init = parse_init_from(s.init_from)
            if init is not None and init.kind == "system" and init.target not in trained:
                raise ValueError(f"{s.name}.init_from {s.init_from!r} is not a trained dense system of this config "
                                 f"{sorted(trained)}")
        return self


class PipelineConfig(_Strict):
    name: str = Field("squad-open", pattern=NAME_PATTERN, description="letters, digits, _ and -")
    data: DataConfig = Field(default_factory=lambda: DataConfig(squad=SquadSource()))
    chunk: ChunkConfig = Field(default_factory=ChunkConfig)
    split: SplitConfig = Field(default_factory=SplitConfig)
    bm25: BM25Config = Field(default_factory=BM25Config)
    evaluation: EvalConfig = Field(default_factory=EvalConfig)
    negatives: NegativesConfig = Field(default_factory=NegativesConfig)
    qgen: Optional[QgenConfig] = Field(None, description="doc2query: a generator fine-tuned on train-split pairs writes synthetic queries")
    pretrain: list[PretrainConfig] = Field(default_factory=list, description=(
        "query-as-context pre-training (paper 002): base encoders dense systems start from (init_from: pretrain:NAME)"))
    dense: Optional[DenseConfig] = Field(None, description="dense systems (zero-shot, trained) and the hybrid")
    fusion: list[FusionConfig] = Field(default_factory=list, description="fused systems: linear (weights tuned on dev) or RRF")
    cross_encoder: Optional[CrossEncoderConfig] = Field(
        None, description="paper 001's cross-attention classifier: silver labels, reranking, false-negative filtering")
    silver: SilverConfig = Field(default_factory=SilverConfig, description="silver pairs (systems training on pairs: silver)")
    rerank: list[RerankConfig] = Field(default_factory=list, description="systems reranked by the cross_encoder")
    refresh: RefreshConfig = Field(default_factory=RefreshConfig, description=(
        "corpus refresh (`pforge refresh`, the NAME--corpus-refresh deployment): the newer dump and its schedule"))
    runner: RunnerConfig = Field(default_factory=RunnerConfig, description=(
        "where shard-parallel stages (encoding, query generation, cross-encoder scoring) compute their shards: "
        "local, threads, or dask (a local cluster, or a remote scheduler's address); changes no version"))
    # The folder of the YAML file (relative init_from paths and config references start there).
    _config_dir: Optional[Path] = PrivateAttr(default=None)
    # The folders of the configs it extends, nearest first: a config reference that is not beside
    # the file is looked up there (a config outside configs/ that extends a shipped one keeps its
    # `squad-open.yaml:qgen_model` working).
    _extends_dirs: tuple[Path, ...] = PrivateAttr(default=())
    # Loaded with the smoke overlay (tasks/smoke.py): configs it refers to are loaded the same way.
    _smoke: bool = PrivateAttr(default=False)

    @model_validator(mode="after")
    def _known_negatives(self):
        systems = {s.name: s for s in (self.dense.systems if self.dense else [])}
        for name, miner in self.negatives.dense.items():
            if miner.system not in systems or not systems[miner.system].evaluate:
                raise ValueError(f"negatives.dense.{name}.system {miner.system!r} is not an evaluated dense system "
                                 f"(its passage and question vectors mine): {sorted(systems)}")
        known = {"bm25", "context", "random", "mixed", *self.negatives.dense}
        for system in systems.values():
            names = system.train.negatives if system.train else []
            if "mixed" in names:  # paper 003's mix: coarse, fine, bm25, context unless configured otherwise
                unknown = [n for n in self.negatives.mixed if n not in known - {"mixed"}]
                if unknown:
                    raise ValueError(f"{system.name} draws from mixed, whose negatives.mixed names {unknown}: define them "
                                     f"under negatives.dense (e.g. coarse: {{system: NAME}}) or drop them from negatives.mixed")
            unknown = [n for n in names if n not in known]
            if unknown:
                raise ValueError(f"{system.name}.train.negatives {unknown}: not a strategy; known: {sorted(known)} "
                                 "(dense-mined ones are defined under negatives.dense)")
        return self

    @model_validator(mode="after")
    def _cross_encoder_users(self):
        systems = self.dense.systems if self.dense else []
        if self.cross_encoder is None:
            users = [f"{s.name} (pairs: silver)" for s in systems if s.train and "silver" in s.train.pairs]
            users += [f"{s.name} (loss: {s.train.loss})" for s in systems if s.train and s.train.distils]
            users += ["rerank"] * bool(self.rerank)
            users += ["negatives.drop_relevant_above"] * (self.negatives.drop_relevant_above is not None)
            if users:
                raise ValueError(f"{', '.join(users)} need a cross_encoder: section (the classifier)")
        if self.cross_encoder and self.cross_encoder.dense_system and \
                self.cross_encoder.dense_system not in {s.name for s in systems if s.evaluate}:
            raise ValueError(f"cross_encoder.dense_system {self.cross_encoder.dense_system!r} is not an evaluated "
                             f"dense system: {[s.name for s in systems]}")
        if any(s.train and "synthetic" in s.train.pairs for s in systems) and self.qgen is None:
            raise ValueError("a system trains on pairs: synthetic, which needs a qgen: section")
        return self

    @model_validator(mode="after")
    def _known_pretrain(self):
        check_pretrain_config(self)
        return self

    @model_validator(mode="after")
    def _known_models(self):
        """Every model a stage will load names one that exists now (an alias, a folder, a hub name
        that is reachable), not a hub URL error minutes into the run."""
        refs = [("qgen.generator", self.qgen.generator)] if self.qgen and not is_reference(self.qgen.generator, "qgen_model") else []
        refs += [(f"dense.systems.{s.name}.model.base", s.model.base) for s in self.dense.systems] if self.dense else []
        refs += [("cross_encoder.base", self.cross_encoder.base)] if self.cross_encoder else []
        model = self.cross_encoder.model if self.cross_encoder else None
        if model and not is_reference(model, "cross_encoder") and not looks_like_path(model) \
                and not model_folder(model, self._config_dir).is_dir():
            refs.append(("cross_encoder.model", model))  # a hub name (folders are checked when planned)
        refs += [(f"pretrain.{p.name}.base", p.base) for p in self.pretrain]
        for where, name in refs:
            try:
                check_model_reference(name)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
        return self

    @model_validator(mode="after")
    def _known_run_systems(self):
        """Fusions and reranks name systems this config produces runs for, in the order the plan
        declares them: bm25, the evaluated dense systems, hybrid(NAME), earlier fusions."""
        evaluated = [s.name for s in (self.dense.systems if self.dense else []) if s.evaluate]
        systems = ["bm25", *evaluated]
        if self.dense and self.dense.hybrid:
            systems.append(f"hybrid({self.dense.hybrid.system})")
        for fusion in self.fusion:
            unknown = [r for r in fusion.runs if r not in systems]
            if unknown:
                raise ValueError(f"fusion {fusion.name!r}: runs {unknown} name no system of this config; systems "
                                 f"(earlier ones only): {systems}")
            if fusion.name in systems:
                raise ValueError(f"fusion {fusion.name!r}: the name is already a system of this config: {systems}")
            systems.append(fusion.name)
        for rerank in self.rerank:
            if rerank.run not in systems:
                raise ValueError(f"rerank run {rerank.run!r} names no system of this config; systems: {systems}")
        names = [name for r in self.rerank for name in r.systems]
        taken = [n for n in names if n in systems or names.count(n) > 1]
        if taken:
            raise ValueError(f"rerank systems {sorted(set(taken))}: each rerank needs a name of its own (name:), "
                             f"not one of {systems} nor another rerank's")
        systems += names
        for pair in self.evaluation.compare:
            unknown = [name for name in pair if name not in systems]
            if unknown:
                raise ValueError(f"evaluation.compare {list(pair)}: {unknown} name no system of this config; systems: "
                                 f"{systems}")
        if self.silver.retriever not in ["bm25", *evaluated]:
            raise ValueError(f"silver.retriever {self.silver.retriever!r} is neither bm25 nor an evaluated dense system "
                             f"of this config: {evaluated}")
        return self

    @property
    def config_dir(self) -> Path:
        return self._config_dir or PROJECT_ROOT / "configs"

    def referenced_config(self, file: str) -> Path:
        """The config file of an `other.yaml:STAGE` reference: beside this config, else beside the
        nearest config it extends that has it (else the path beside this one, for the error)."""
        folders = dict.fromkeys((self.config_dir, *self._extends_dirs))
        for folder in folders:
            if (folder / file).is_file():
                return (folder / file).resolve()
        return (self.config_dir / file).resolve()


class ConfigError(ValueError):
    """A config that cannot be read or does not validate; the message names the file and the field."""


def merge_config(base: dict, override: dict) -> dict:
    """`override` over `base`, as `extends:` merges a config over the one it extends: mappings merge
    key by key; anything else (lists included, e.g. dense.systems) replaces. Neither is modified."""
    merged = dict(base)
    for key, value in override.items():
        merged[key] = merge_config(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    return merged


def _read_yaml(path: Path) -> dict:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a config is a mapping, not {type(raw).__name__}")
    return raw


def _resolved_raw(path: Path, seen: tuple[Path, ...] = (), extends_dirs: Optional[list[Path]] = None) -> dict:
    """The YAML of `path` merged over the config it `extends:` (a path relative to it), recursively;
    the folders of the configs it extends are appended to `extends_dirs`, nearest first."""
    raw = _read_yaml(path)
    base = raw.pop("extends", None)
    if base is None:
        return raw
    if not isinstance(base, str):
        raise ConfigError(f"{path}: extends: expected a config path, got {base!r}")
    base_path = (path.parent / base).resolve()
    if base_path in seen or base_path == path.resolve():
        raise ConfigError(f"{path}: extends: {base} makes a cycle")
    if not base_path.is_file():
        raise ConfigError(f"{path}: extends: no config file {base_path}")
    if extends_dirs is not None:
        extends_dirs.append(base_path.parent)
    return merge_config(_resolved_raw(base_path, (*seen, path.resolve()), extends_dirs), raw)


def load_config(path: str | Path, smoke: bool = False) -> PipelineConfig:
    """Read and validate a YAML run configuration.

    The file's `extends:` chain is merged first (a path relative to the file; mappings merge key
    by key, lists and scalars replace), then the result is validated by `PipelineConfig`: unknown
    keys, meaningless values and models that do not load are refused here, before anything runs.

    Args:
        path: the YAML file, e.g. `configs/squad-open.yaml`.
        smoke: apply the smoke overlay (tasks/smoke.py): the same stages and code paths on a few
            seconds' work each, as `pforge run --smoke` does.

    Returns:
        The validated configuration. It remembers the file's folder, where relative `init_from`
        paths and `other.yaml:STAGE` references start.

    Raises:
        ConfigError: the file cannot be read, is not a mapping, `extends:` is missing or makes a
            cycle, or a field is invalid; the message names the file and the field.

    Examples:
        ```python
        from flows.registry import plan_for
        from tasks.config import load_config

        cfg = load_config("configs/tiny.yaml")
        plan = plan_for(cfg)  # the stages, in run order
        print(cfg.name, plan.names())
        ```
    """
    path = Path(path)
    extends_dirs: list[Path] = []
    raw = _resolved_raw(path, extends_dirs=extends_dirs)
    if smoke:
        from tasks.smoke import smoke_overlay

        raw = smoke_overlay(raw)
    try:
        cfg = PipelineConfig.model_validate(raw)
    except ValidationError as exc:
        where = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{path}: invalid config: {where}") from exc
    cfg._config_dir = path.resolve().parent
    cfg._extends_dirs = tuple(extends_dirs)
    cfg._smoke = smoke
    return cfg
