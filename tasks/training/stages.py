"""Training family: a dense system's `train:` section and its stage train:NAME, which reads pairs
and negatives artifacts as data, starts from the system's origin (base checkpoint, another
system's model, a model artifact or a folder), trains with a loss from the registry, keeps the
best of the evaluated checkpoints by the dev metric, and saves and exports the encoder."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any, ClassVar, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from storage import Artifact
from tasks.compute.device import resolve_device
from tasks.compute.encode import EncodeSettings
from tasks.compute.origin import Origin, origin_of
from tasks.engine import Stage, StageParams
from tasks.training.arguments import (LENGTH_PIECES_HELP, LengthPieces, TrainerArgs, rows_per_piece,
                                      trainer_settings_of, written_flat)

logger = logging.getLogger("passage_forge")


class DenseTrainConfig(BaseModel):
    """A dense system's `train:` section: the trainer's settings (`schedule`, a TrainerArgs) and
    what the pipeline feeds it. The YAML writes both flat in one section (so a YAML merge key can
    override one setting of either, `{<<: *gold, seed: 2}`); `schedule:` as an object is read too."""
    model_config = ConfigDict(extra="forbid")
    # Hashed as if its fields sat in this section (tasks.engine.with_inlined): versions planned
    # while the section inherited the trainer's settings keep their hashes.
    INLINE: ClassVar[frozenset[str]] = frozenset({"schedule"})

    schedule: TrainerArgs = Field(default_factory=TrainerArgs, description=(
        "the trainer's settings (lr, batch_size, hard_negatives, epochs or max_steps, seed, bf16, checkpoints, "
        "lengths); a YAML section may write them flat beside the others"))
    loss: str = Field("dpr", description=(
        "loss by name from models.losses.LOSSES: dpr, bidirectional, weighted, margin_mse and listwise_kl (distil "
        "the cross_encoder's scores), xmoco (needs model.shared: false)"))
    loss_options: dict[str, Any] = Field(default_factory=dict, description=(
        "keyword arguments of the loss's constructor (e.g. scale, or a momentum objective's queue_size)"))
    pairs: list[Literal["gold", "synthetic", "silver"]] = Field(
        default_factory=lambda: ["gold"], min_length=1,
        description="pairs artifacts trained on (pairs:NAME stages): gold, synthetic (needs qgen:), silver (needs cross_encoder:)")
    # Paper 001 section 4.2: w = 1 for gold pairs and p^2 for silver ones, with loss: weighted.
    pair_weights: bool = Field(True, description="false: every pair weighs 1 (paper 001's non-modified softmax ablation)")
    negatives: list[str] = Field(default_factory=lambda: ["bm25"], description=(
        "strategies the pool is drawn from (negatives:NAME stages): bm25, context, random, mixed, or a "
        "negatives.dense name (coarse, fine, self-mined); [] with hard_negatives 0: in-batch (Rnd) only"))
    split: str = Field("train", description="the split whose pairs are trained on")
    # Paper 003 sections 4.3 and 5.3: N = 2 hard negatives per question per step, drawn from its pool of M = 100.
    negative_pool: int = Field(100, ge=1, description="M: the top negatives per question the N are drawn from")
    max_questions: Optional[int] = Field(None, ge=1, description="train on at most this many pairs")
    # Checkpoint selection on dev (paper 000, Experiment, implementation details: "dev set results
    # to select the final checkpoint"; paper 003 section 5.3: recall@1 on dev for early stopping).
    select_on_dev: bool = Field(True, description="keep the best of the base model and the evaluated steps by dev top-k accuracy")
    dev_split: str = Field("dev", description="questions that pick the checkpoint")
    dev_k: int = Field(1, ge=1, description="dev metric: share of questions with a gold passage in the top k")
    dev_distractors: int = Field(0, ge=0, description="random passages added to the dev articles' passages as the dev pool")
    dev_max_questions: Optional[int] = Field(None, ge=1, description="evaluate on at most this many dev questions")
    length_pieces: LengthPieces = Field("auto", description=LENGTH_PIECES_HELP)

    @model_validator(mode="before")
    @classmethod
    def _schedule_written_flat(cls, data: Any) -> Any:
        """The trainer's settings written flat in the section go to `schedule`; one given both
        flat and in `schedule:` is refused."""
        if not isinstance(data, dict):
            return data
        if not written_flat(data, own=cls.model_fields):
            return data   # nothing flat: a schedule object given as one stays as it is
        rest, schedule = trainer_settings_of(data, own=cls.model_fields)
        return {**rest, "schedule": schedule}

    @field_validator("loss")
    @classmethod
    def _known_loss(cls, name: str) -> str:
        from models.losses import LOSSES

        if name not in LOSSES:
            raise ValueError(f"unknown loss {name!r}; known: {', '.join(sorted(LOSSES))}")
        return name

    @property
    def distils(self) -> bool:
        """Whether the loss learns from the cross-encoder's scores (the train stage scores the pairs)."""
        from models.losses import LOSSES

        return bool(getattr(LOSSES[self.loss], "uses_teacher_scores", False))

    @model_validator(mode="after")
    def _loss_takes_options(self):
        from models.losses import LOSSES, check_loss_options

        check_loss_options(self.loss, self.loss_options)
        if "silver" in self.pairs and self.pair_weights and not getattr(LOSSES[self.loss], "uses_weights", False):
            raise ValueError(f"silver pairs weigh p^2 but loss {self.loss!r} takes no weights: use loss: weighted "
                             "(paper 001 section 4.2), or pair_weights: false for the unweighted ablation")
        return self


def planned_train(train: DenseTrainConfig, encode, device: str) -> DenseTrainConfig:
    """`train` as planned: each unset max length taken from the encode section (one length setting
    serves training and encoding by default: title plus 100 words averages 133 MiniLM tokens, so a
    shorter training cut would train on passages the index never sees), and bf16 'auto' resolved
    for `device`; both hashed, so the version names what the model trained with."""
    schedule = train.schedule
    lengths = {name: getattr(encode, name) for name in ("query_max_len", "passage_max_len")
               if getattr(schedule, name) is None}
    return train.model_copy(update={"schedule": schedule.model_copy(update=lengths).resolved_for(device)})


class TrainParams(StageParams):
    # Checkpointing only decides what a killed run can resume from, not what it trains.
    RUNTIME = frozenset({"device", "origin.init_path", "train.schedule.checkpoint_every",
                         "train.schedule.keep_checkpoints", "train.length_pieces"})
    system: str
    origin: Origin
    train: DenseTrainConfig
    dev_encode: EncodeSettings      # the dev metric encodes as the encode stage does
    device: str


def _dev_evaluator(params: TrainParams, inputs: dict[str, Artifact], device: str):
    from tasks.training.dev_metric import TopKDevEvaluator, dev_pool

    t = params.train
    qids, queries, pool, gold_idx = dev_pool(
        inputs["ingest_questions"].read_table("questions"),
        inputs["chunk"].read_table(columns=["pid", "doc_id", "title", "text"]),
        inputs["link_gold"].read_table(), t.dev_split, t.dev_distractors, t.dev_max_questions, t.schedule.seed)
    logger.info("train %s: dev metric top-%d over %d %s questions and %d passages",
                params.system, t.dev_k, len(qids), t.dev_split, len(pool))
    return TopKDevEvaluator(qids, queries, pool, gold_idx, t.dev_k,
                            lambda model, texts, side: params.dev_encode.encode(model, texts, side, device))


def _teacher(cross_encoder: Artifact, device: str):
    """The classifier as a distilling student's collator calls it: (query, passage) pairs -> logits,
    its weights loaded at the first batch."""
    from models.cross_encoder import CrossEncoderModel

    loaded = []

    def logits(pairs):
        if not loaded:
            logger.info("teacher: %s:%s scores the pairs each batch draws", cross_encoder.stage, cross_encoder.version)
            loaded.append(CrossEncoderModel.from_pretrained(cross_encoder.subdir("model")).to(device))
        return loaded[0].logits(pairs, device=device, bf16=str(device) == "cuda")
    return logits


def teacher_summary(rows: list[list[float]]) -> dict:
    """The teacher's scores as the report shows them (issue 25), from the rows it scored while
    the student trained ([positive, *drawn negatives] per question and epoch): quantiles of its
    logits for the positives and for the negatives, the mean margin, and how often it ranks the
    positive above every drawn negative (a teacher that disagrees with the labels shows here)."""
    import numpy as np

    positives = np.array([r[0] for r in rows], dtype=np.float64)
    negatives = np.array([x for r in rows for x in r[1:]], dtype=np.float64)
    if not positives.size:
        return {}

    def quantiles(x):
        return {f"p{q}": round(float(np.percentile(x, q)), 4) for q in (5, 25, 50, 75, 95)} if x.size else {}
    above = [r[0] > max(r[1:]) for r in rows if len(r) > 1]
    margins = [r[0] - x for r in rows for x in r[1:]]
    return {"pairs_scored": int(positives.size + negatives.size), "positive": quantiles(positives),
            "negative": quantiles(negatives), "mean_margin": round(float(np.mean(margins)), 4) if margins else None,
            "positive_above_all_negatives": round(float(np.mean(above)), 4) if above else None}


def build_train(params: TrainParams, inputs: dict[str, Artifact], out: Path, work: Optional[Path] = None) -> dict:
    import pyarrow as pa

    from models import BiEncoder
    from models.export import export_bi_encoder
    from models.losses import build_loss
    from tasks.training.distributed import is_main_process
    from tasks.training.examples import examples_from_pairs
    from tasks.training.resumable import keep_record, training_dir, training_times
    from tasks.training.trainer import train_bi_encoder

    t, device = params.train, resolve_device(params.device)
    schedule = t.schedule
    pairs = pa.concat_tables([inputs[f"pairs:{name}"].read_table() for name in t.pairs])
    negatives = pa.concat_tables([inputs[f"negatives:{name}"].read_table() for name in t.negatives]) if t.negatives else None
    if not t.pair_weights:  # the ablation: silver pairs count as much as gold ones
        pairs = pairs.set_column(pairs.schema.get_field_index("weight"), "weight",
                                 pa.array([1.0] * pairs.num_rows, pa.float32()))
    examples = examples_from_pairs(pairs, negatives, inputs["chunk"].read_table(columns=["pid", "doc_id", "title", "text"]),
                                   negative_pool=t.negative_pool, hard_negatives=schedule.hard_negatives,
                                   batch_size=schedule.batch_size, seed=schedule.seed, max_questions=t.max_questions,
                                   split=t.split)
    model = params.origin.load(inputs)
    loss = build_loss(t.loss, model, **t.loss_options)
    # GPL labels only the triplets it trains on: the teacher scores each batch's drawn pairs
    teacher = _teacher(inputs["cross_encoder"], device) if t.distils else None
    evaluator = _dev_evaluator(params, inputs, device) if t.select_on_dev else None
    logger.info("train %s: %d pairs, loss %s, batch %d", params.system, len(examples), t.loss, schedule.batch_size)
    train_dir = training_dir(out, work)
    result = train_bi_encoder(model, loss, examples, schedule, train_dir, evaluator=evaluator, progress=False, device=device,
                              teacher=teacher, rows_per_piece=rows_per_piece(t.length_pieces, device))
    if not is_main_process():  # under torchrun (flows/ddp.py) rank 0 saves, exports and commits
        return None
    if result["best_step"] != len(result["history"]):
        logger.info("train %s: keeping step %s (dev metric %.4f), not the last step", params.system,
                    result["best_step"], result["best_metric"])
        model = BiEncoder.from_pretrained(train_dir / "best")
    model.save_pretrained(out / "model")
    export_bi_encoder(model, out / "export")
    for copy in ("best", "final", "checkpoints"):  # model/ holds the chosen weights; history and curve stay
        shutil.rmtree(out / "training" / copy, ignore_errors=True)
    keep_record(train_dir, out)
    history = result["history"]
    return {"stats": {"examples": len(examples), "steps": len(history), "best_step": result["best_step"],
                      "best_dev_metric": result["best_metric"], "start_dev_metric": result.get("start_metric"),
                      "dev_curve": result["dev_curve"], "final_loss": history[-1]["loss"] if history else None,
                      **training_times(result),
                      **({"teacher": teacher_summary(result["teacher_rows"])} if t.distils else {})}}


def stages(cfg, earlier: list[Stage]) -> list[Stage]:
    if cfg.dense is None:
        return []
    out = []
    for system in cfg.dense.systems:
        if system.train is None:
            continue
        # `mixed` stands for its member strategies: the version names what was drawn from
        t = planned_train(system.train, cfg.dense.encode, cfg.dense.encode.device)
        t = t.model_copy(update={"negatives": cfg.negatives.expand(t.negatives)})
        origin, origin_stages, pinned = origin_of(system, cfg.config_dir, trained=False)
        data = tuple(f"pairs:{p}" for p in t.pairs) + tuple(f"negatives:{n}" for n in t.negatives)
        if t.distils:
            data += ("cross_encoder",)
        params = TrainParams(system=system.name, origin=origin, train=t, dev_encode=EncodeSettings.of(cfg.dense.encode),
                             device=cfg.dense.encode.device)
        out.append(Stage(f"train:{system.name}", "dense_model", "4",
                         ("ingest_questions", "chunk", "link_gold", *data, *origin_stages), params, build_train,
                         pinned=pinned, variant={"system": system.name}, resumable=True))
    return out
