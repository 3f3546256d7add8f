"""The silver family's config sections (paper 001): `cross_encoder:` (the cross-attention
classifier: what trains it, or which trained one to use, and how later stages score with it) and
`silver:` (which candidates get labelled, and the probability that keeps one)."""
from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from models.encoder_runtimes import EncoderRuntime
from tasks.silver.classifier import ClassifierTrainArgs


class CrossEncoderConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    base: str = Field("minilm", description="base encoder: minilm, mpnet, a hub name or a folder (a fresh one-logit head)")
    # Issue 25: a corpus without questions borrows a classifier trained elsewhere as its teacher.
    model: Optional[str] = Field(None, description=(
        "use a trained classifier instead of training one: 'other.yaml:cross_encoder' (pinned to the version that "
        "config builds), 'cross_encoder:VERSION', a folder, or a hub name of a one-logit cross-encoder; with "
        "queries: synthetic, the classifier fine-tuning starts from"))
    # Issue 25: a teacher for a corpus without questions can learn from the questions written for it.
    queries: Literal["gold", "synthetic"] = Field("gold", description=(
        "what trains it: the split's gold questions (paper 001), or the generated queries (pairs:synthetic: a "
        "query's own passage is its positive, negatives from BM25's top `depth` and its document, 1:1)"))
    train: ClassifierTrainArgs = Field(default_factory=ClassifierTrainArgs)
    split: str = Field("train", description="the split whose gold pairs train it")
    # Paper 001 section 4.1: negatives from the BM25 top 10 and the dense top 10.
    depth: int = Field(10, ge=1, description="negatives come from each retriever's top `depth`")
    dense_system: Optional[str] = Field(None, description="the dense system whose run gives the dense negatives "
                                                          "(empty: BM25 and document negatives only, 1:1)")
    # Paper 001 section 5.1: hyper-parameters set on 10% of the training data held out.
    dev_share: float = Field(0.1, gt=0, lt=1, description="share of the split's questions held out as the classifier's dev")
    max_questions: Optional[int] = Field(None, ge=1, description="train on at most this many questions (seeded sample)")
    # Log loss and AUC are reported at every evaluation; a calibrated base-rate model wins on
    # log loss while ranking nothing, so AUC picks the checkpoint by default.
    select_by: Literal["auc", "log_loss"] = Field("auc", description="the dev metric that picks the checkpoint")
    report_split: str = Field("test", description="questions whose pairs (built the same way) the report scores")
    report_max_questions: Optional[int] = Field(300, ge=1, description="report on at most this many of them")
    batch_size: int = Field(64, ge=1, description="pairs per scoring batch")
    device: str = Field("auto", description="auto, cpu or cuda")
    runtime: EncoderRuntime = Field(
        "auto", description="scoring runtime (silver, rerank, the negatives' judge): torch (the reference), onnx "
                            "(ONNX Runtime, CPU) or openvino (OpenVINO, CPU; fp32 or bf16); auto: openvino at bf16 "
                            "where the CPU has bf16 units, torch elsewhere (measured in docs/benchmarks.md, "
                            "'CPU runtimes')")
    int8: bool = Field(False, description="CPU only: score with int8 weights (torch dynamic int8 or ORT int8)")
    bf16: Union[bool, Literal["auto"]] = Field(
        "auto", description="CPU scoring in bf16 (torch's autocast; OpenVINO's precision hint); auto: on where the "
                            "CPU has bf16 units (AMX or avx512_bf16) without int8 or onnx, off elsewhere. CUDA "
                            "scoring autocasts to bf16 whatever this says")
    seed: int = 13


class SilverConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    queries: list[Literal["train", "synthetic"]] = Field(
        default_factory=lambda: ["train", "synthetic"], min_length=1,
        description="question sets labelled: the train split's questions, the generated queries (needs qgen:)")
    retriever: str = Field("bm25", description="candidates' source: bm25 or a dense system's name")
    top_k: int = Field(10, ge=1, description="candidates per query")
    # Paper 001 section 5.1: "we only keep candidate pairs with ... scores >= 0.5".
    threshold: float = Field(0.5, ge=0, le=1, description="keep a candidate with p >= threshold")
    max_queries: Optional[int] = Field(None, ge=1, description="label at most this many queries per set (seeded sample)")
    shard_size: int = Field(2000, ge=1, description="candidate pairs per resumable shard")
    seed: int = 13
