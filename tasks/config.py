"""Run configuration: pydantic models that validate the YAML files and render as Prefect UI forms."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

PROJECT_ROOT = Path(__file__).resolve().parents[1]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SquadSource(_Strict):
    path: str = Field("squad/dev-v1.1-partial.json", description="SQuAD v1.1 JSON, relative to data_root")
    download: Optional[Literal["dev-v1.1", "train-v1.1"]] = Field(
        "dev-v1.1", description="official file to download (checksum verified) when path is absent")
    max_articles: Optional[int] = Field(None, ge=1, description="keep only the first N articles (quick runs)")


class BeirSource(_Strict):
    path: str = Field(..., description="BEIR dataset folder or zip, relative to data_root")
    qrels_splits: list[str] = Field(default_factory=lambda: ["test"], description="qrels files to load")


class DataConfig(_Strict):
    data_root: str = Field("../shared/data", description="folder holding the input data; relative paths start at the project root")
    squad: Optional[SquadSource] = None
    wikipedia: list[str] = Field(default_factory=list, description="pages-articles XML dumps (.bz2 or plain): distractor documents")
    wikipedia_max_pages: Optional[int] = Field(None, ge=1)
    beir: Optional[BeirSource] = None

    @model_validator(mode="after")
    def _one_qa_source(self):
        if (self.squad is None) == (self.beir is None):
            raise ValueError("configure exactly one of data.squad or data.beir as the question source")
        return self

    def resolve(self, relative: str) -> Path:
        root = Path(os.environ.get("PFORGE_DATA", self.data_root))
        if not root.is_absolute():
            root = PROJECT_ROOT / root
        return (root / relative).resolve()


class ChunkConfig(_Strict):
    # DPR / xMoCo section 4.1: disjoint 100-word passages. words <= 0: one passage per document.
    words: int = Field(100, description="passage length in words (0: whole documents)")
    stride: Optional[int] = Field(None, ge=1, description="words between passage starts (default: words, no overlap)")


class SplitConfig(_Strict):
    seed: int = 13
    ratios: dict[str, float] = Field(default_factory=lambda: {"train": 0.6, "dev": 0.1, "test": 0.3})
    articles: dict[str, list[str]] = Field(default_factory=dict, description="explicit article titles per split; they override the ratios")


class BM25Config(_Strict):
    # DPR / xMoCo section 4.1: BM25 with k1=0.9, b=0.4 for open-domain QA.
    k1: float = Field(0.9, gt=0)
    b: float = Field(0.4, ge=0, le=1)
    k: int = Field(100, ge=1, description="passages retrieved per question")
    threads: int = Field(2, ge=1)


class EvalConfig(_Strict):
    ks: list[int] = Field(default_factory=lambda: [1, 5, 10, 20, 100])
    match_type: Literal["string", "regex"] = "string"


class DenseModelConfig(_Strict):
    base: str = Field("minilm", description="backbone: 'minilm' (the offline all-MiniLM-L6-v2), a local path or a hub name")
    shared: bool = Field(True, description="one tower for questions and passages (paper 003) or two (DPR, xMoCo)")
    pooling: Literal["cls", "mean"] = "mean"
    projection_dim: Optional[int] = Field(None, ge=1, description="FC layer on the pooled vector (paper 003 section 3)")
    normalize: bool = Field(True, description="l2-normalise embeddings")
    scale: float = Field(1.0, gt=0, description="similarity scale (paper 001 section 4.2 uses 100 with normalisation)")


class DenseTrainConfig(_Strict):
    loss: Literal["dpr", "bidirectional"] = "dpr"
    # Paper 003 section 4.3: N hard negatives per question per step, drawn from its pool of M.
    hard_negatives: int = Field(1, ge=0, description="N hard negatives per question per step")
    negative_pool: int = Field(10, ge=1, description="M: BM25 passages without an answer, per question")
    lr: float = Field(2e-5, gt=0)
    batch_size: int = Field(16, ge=2)
    epochs: int = Field(1, ge=1)
    max_steps: Optional[int] = Field(None, ge=1)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    query_max_len: int = 32
    passage_max_len: int = 128
    max_questions: Optional[int] = Field(None, ge=1, description="train on at most this many train-split questions")
    bf16: Literal["auto", "on", "off"] = "auto"
    seed: int = 42
    # Checkpoint selection on dev (paper 000, Experiment, implementation details: "dev set results
    # to select the final checkpoint"; paper 003 section 5.3: recall@1 on dev for early stopping).
    select_on_dev: bool = Field(True, description="keep the best of the base model and the evaluated steps by dev top-k accuracy")
    eval_every: Optional[int] = Field(None, ge=1, description="steps between dev evaluations (always at the start and the end)")
    dev_split: str = Field("dev", description="questions that pick the checkpoint")
    dev_k: int = Field(1, ge=1, description="dev metric: share of questions with a gold passage in the top k")
    dev_distractors: int = Field(0, ge=0, description="random passages added to the dev articles' passages as the dev pool")
    dev_max_questions: Optional[int] = Field(None, ge=1, description="evaluate on at most this many dev questions")


class DenseSystemConfig(_Strict):
    name: str = Field(..., pattern=r"^[A-Za-z0-9_-]+$", description="system name in runs and metrics")
    model: DenseModelConfig = Field(default_factory=DenseModelConfig)
    train: Optional[DenseTrainConfig] = Field(None, description="absent: the base encoder, zero-shot")


class EncodeConfig(_Strict):
    batch_size: int = Field(64, ge=1)
    shard_size: int = Field(100_000, ge=1, description="passages read, tokenised and written at a time")
    passage_max_len: int = 256
    query_max_len: int = 64
    dtype: Literal["float32", "float16"] = Field("float32", description="stored embedding precision")
    bf16: bool = Field(False, description="bf16 autocast while encoding (CUDA, or CPUs with bf16 units)")
    int8: bool = Field(False, description="CPU only: dynamic int8 quantisation of the Linear layers (benchmarks/encoding_throughput.py measures speed and accuracy)")
    device: str = Field("auto", description="'auto' picks CUDA when present")


class FaissConfig(_Strict):
    kind: Literal["flat", "hnsw", "ivfpq"] = "flat"
    hnsw_m: int = 32
    ef_search: int = 128
    nlist: Optional[int] = None
    pq_m: Optional[int] = None
    nprobe: int = 16


class HybridConfig(_Strict):
    system: str = Field(..., description="the dense system fused with BM25 (papers 000 and 003)")
    tune_split: str = Field("dev", description="split on which the BM25 weight is chosen")
    tune_k: int = Field(20, ge=1, description="cut-off of the metric maximised when choosing the weight")
    tune_metric: Literal["auto", "accuracy", "ndcg"] = Field(
        "auto", description="top-k answer accuracy, or nDCG@k on the gold qrels; 'auto': accuracy when questions carry answers")


class DenseConfig(_Strict):
    systems: list[DenseSystemConfig] = Field(default_factory=list)
    encode: EncodeConfig = Field(default_factory=EncodeConfig)
    index: FaissConfig = Field(default_factory=FaissConfig)
    hybrid: Optional[HybridConfig] = None

    @model_validator(mode="after")
    def _known_hybrid_system(self):
        names = [s.name for s in self.systems]
        if len(set(names)) != len(names):
            raise ValueError(f"dense system names must be unique: {names}")
        if self.hybrid and self.hybrid.system not in names:
            raise ValueError(f"hybrid.system {self.hybrid.system!r} is not one of the dense systems {names}")
        return self


class PipelineConfig(_Strict):
    name: str = "squad-open"
    data: DataConfig = Field(default_factory=lambda: DataConfig(squad=SquadSource()))
    chunk: ChunkConfig = Field(default_factory=ChunkConfig)
    split: SplitConfig = Field(default_factory=SplitConfig)
    bm25: BM25Config = Field(default_factory=BM25Config)
    evaluation: EvalConfig = Field(default_factory=EvalConfig)
    dense: Optional[DenseConfig] = Field(None, description="dense systems (zero-shot, trained) and the hybrid")


class ConfigError(ValueError):
    pass


def merge_config(base: dict, override: dict) -> dict:
    """Mappings merge key by key; anything else (lists included, e.g. dense.systems) replaces."""
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


def _resolved_raw(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """The YAML of `path` merged over the config it `extends:` (a path relative to it), recursively."""
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
    return merge_config(_resolved_raw(base_path, (*seen, path.resolve())), raw)


def load_config(path: str | Path) -> PipelineConfig:
    """Read and validate a YAML config (after `extends:`); errors name the file and the offending field."""
    path = Path(path)
    raw = _resolved_raw(path)
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as exc:
        where = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{path}: invalid config: {where}") from exc
