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


class PipelineConfig(_Strict):
    name: str = "squad-open"
    data: DataConfig = Field(default_factory=lambda: DataConfig(squad=SquadSource()))
    chunk: ChunkConfig = Field(default_factory=ChunkConfig)
    split: SplitConfig = Field(default_factory=SplitConfig)
    bm25: BM25Config = Field(default_factory=BM25Config)
    evaluation: EvalConfig = Field(default_factory=EvalConfig)


class ConfigError(ValueError):
    pass


def load_config(path: str | Path) -> PipelineConfig:
    """Read and validate a YAML config; errors name the file and the offending field."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}") from exc
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as exc:
        where = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{path}: invalid config: {where}") from exc
