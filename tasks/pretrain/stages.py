"""Pre-training family (paper 002 sections 2-4): the `pretrain:` config section and its stage
pretrain:NAME, which pairs passages (chunk) with contexts (the qgen stage's synthetic queries, or
for the passage-passage baseline other passages of the document), trains the encoder with the
shared bi-encoder trainer and an objective of models/pretraining (the heads are the loss module's
parameters, checkpointed with it), then drops the heads and saves the encoder as a base
checkpoint: `model/` holds a plain transformers encoder and its tokenizer, which a dense system
starts from with `init_from: pretrain:NAME` (its own model section adds pooling and the rest).

The build is resumable: the trainer's checkpoints (every `checkpoint_every` steps) live in the
stage's work folder, so a killed pre-training continues where it stopped."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal, Optional

from pydantic import Field, model_validator

from models.pretraining.losses import (
    COCONDENSER_MASK_RATE,
    COTMAE_DECODER_MASK_RATE,
    COTMAE_MASK_RATE,
    HEAD_LAYERS,
    TEMPERATURE,
)
from storage import Artifact
from tasks.compute.device import resolve_device
from tasks.engine import Stage, StageParams
from tasks.stage_refs import parse_init_from
from tasks.training.arguments import LENGTH_PIECES_HELP, LengthPieces, TrainerArgs, rows_per_piece

logger = logging.getLogger("passage_forge")

QUERY_FORMS = ("cocondenser", "cotmae")
#: The artifact a pretrain stage writes; its `model/` folder is the base checkpoint.
ARTIFACT = "pretrained_encoder"
_OBJECTIVE_ONLY = {"cocondenser": {"head_layers", "middle_layer", "temperature", "pooling"},
                   "cotmae": {"decoder_mask_rate", "decoder_layers"}}


class PretrainRun(TrainerArgs):
    """What one pre-training run computes: the form, the objective's settings (paper defaults) and
    the schedule (the trainer's fields; defaults sized for a CPU). Its stage's version hashes it."""
    name: str = Field(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$", description="the stage is pretrain:NAME")
    form: Literal["cocondenser", "cotmae", "passage-passage"] = Field(..., description=(
        "cocondenser or cotmae: query as context (paper 002 section 3.1, the qgen stage's queries); "
        "passage-passage: two passages of one document (section 2, the baseline)"))
    objective: Optional[Literal["cocondenser", "cotmae"]] = Field(None, description=(
        "the objective; for passage-passage which one pairs the passages (default cocondenser, the "
        "original coCondenser); for the query forms the form itself"))
    base: str = Field("minilm", description="backbone: 'minilm', 'mpnet', a local path or a hub name")
    mask_rate: Optional[float] = Field(None, gt=0, lt=1, description=(
        "encoder MLM mask rate; default 0.15 for cocondenser (BERT's), 0.30 for cotmae (section 2.2)"))
    # CoT-MAE (Wu et al. 2022, section 2.2's source): 45% of the decoder's context is masked.
    decoder_mask_rate: float = Field(COTMAE_DECODER_MASK_RATE, gt=0, lt=1, description="cotmae: the context's mask rate")
    # Sections 2.1/2.2 leave M open: Condenser's head and the CoT-MAE code's decoder have 2 layers.
    head_layers: int = Field(HEAD_LAYERS, ge=1, description="cocondenser: Condenser head layers")
    decoder_layers: int = Field(HEAD_LAYERS, ge=1, description="cotmae: decoder layers")
    # Section 2.1: the head reads the M-th layer's token states, "e.g. L/2" (6 of BERT-base's 12).
    middle_layer: Optional[int] = Field(None, ge=1, description=(
        "cocondenser: the layer the head's token states come from (empty: L/2)"))
    temperature: float = Field(TEMPERATURE, gt=0, description="cocondenser: tau of the contrastive loss (section 2.1)")
    # Section 2.1: the span's representation is the last layer's [CLS] state, h_L^0.
    pooling: Literal["cls", "mean"] = Field("cls", description="cocondenser: the representation the contrastive loss compares")
    max_passages: Optional[int] = Field(None, ge=1, description="pre-train on a seeded sample of this many passages")
    # The schedule: section 4.1 (coCondenser: AdamW, lr 1e-4, weight decay 0.01; CoT-MAE: warm-up
    # ratio 0.1; passages of at most 144 tokens). No hard negatives: in-batch contexts only.
    lr: float = Field(1e-4, gt=0, description="peak learning rate (section 4.1: 1e-4 coCondenser, 4e-4 CoT-MAE at batch 16k)")
    batch_size: int = Field(16, ge=2, description="passages per step; the others' contexts are in-batch negatives")
    hard_negatives: int = Field(0, ge=0, le=0, description="none: pre-training pairs carry no hard negatives")
    query_max_len: int = Field(32, ge=4, description="context tokens (passage-passage: passage_max_len unless given)")
    passage_max_len: int = Field(144, ge=8, description="passage tokens (section 4.1: 144)")
    eval_at_start: bool = Field(False, description="none: pre-training has no dev evaluation")

    @model_validator(mode="after")
    def _resolve(self):
        objective = self.objective or (self.form if self.form in QUERY_FORMS else "cocondenser")
        if self.form in QUERY_FORMS and objective != self.form:
            raise ValueError(f"pretrain {self.name}: form {self.form} trains the {self.form} objective, not {objective}")
        other = "cotmae" if objective == "cocondenser" else "cocondenser"
        misplaced = sorted(f for f in _OBJECTIVE_ONLY[other] & self.model_fields_set
                           if getattr(self, f) != type(self).model_fields[f].default)
        if misplaced:
            raise ValueError(f"pretrain {self.name}: {misplaced} are {other} settings; this run trains {objective}")
        self.objective = objective
        if self.mask_rate is None:
            self.mask_rate = COCONDENSER_MASK_RATE if objective == "cocondenser" else COTMAE_MASK_RATE
        if self.form == "passage-passage" and "query_max_len" not in self.model_fields_set:
            self.query_max_len = self.passage_max_len  # the context is a passage too
        return self

    def loss_options(self) -> dict:
        """The objective's constructor arguments (models.pretraining.build_pretraining_loss)."""
        if self.objective == "cocondenser":
            return {"mask_rate": self.mask_rate, "head_layers": self.head_layers, "middle_layer": self.middle_layer,
                    "temperature": self.temperature, "pooling": self.pooling, "seed": self.seed}
        return {"mask_rate": self.mask_rate, "decoder_mask_rate": self.decoder_mask_rate,
                "decoder_layers": self.decoder_layers, "seed": self.seed}


class PretrainConfig(PretrainRun):
    """A `pretrain:` entry of the config: the run and where it computes."""
    device: str = Field("auto", description="'auto' picks CUDA when present")
    length_pieces: LengthPieces = Field("auto", description=LENGTH_PIECES_HELP)

    def run(self) -> PretrainRun:
        return PretrainRun(**self.model_dump(exclude={"device", "length_pieces"}))


def check_pretrain_config(cfg) -> None:
    """Config-level checks (PipelineConfig calls it): unique names, the query forms need a qgen
    section, and every `init_from: pretrain:NAME` names a declared run."""
    names = [p.name for p in cfg.pretrain]
    if len(set(names)) != len(names):
        raise ValueError(f"pretrain names must be unique: {names}")
    needs_queries = [p.name for p in cfg.pretrain if p.form in QUERY_FORMS]
    if needs_queries and cfg.qgen is None:
        raise ValueError(f"pretrain {needs_queries}: query-as-context pre-training reads the synthetic queries of a "
                         "qgen: section, which this config lacks (or use form: passage-passage)")
    runs = {p.name: p for p in cfg.pretrain}
    for system in (cfg.dense.systems if cfg.dense else []):
        init = parse_init_from(system.init_from)
        if init is None or init.kind != "pretrain":
            continue
        run = runs.get(init.target)
        if run is None:
            raise ValueError(f"{system.name}.init_from {system.init_from!r}: no pretrain run of that name; "
                             f"declared: {names}")
        check_pooling(system.name, system.model.pooling, run)


def check_pooling(system: str, pooling: str, run: PretrainRun) -> None:
    """A system fine-tuned from a pre-training run pools [CLS], the representation the run
    shaped: the Condenser head (section 2.1) and the CoT-MAE decoder (section 2.2) read the last
    layer's [CLS]; coCondenser's contrastive term must compare [CLS] too (the paper's h_L^0)."""
    if run.objective == "cocondenser" and run.pooling != "cls":
        raise ValueError(f"{system}.init_from pretrain:{run.name}: its Condenser head reads [CLS] while its contrastive "
                         f"term compares {run.pooling!r} pooling; set pretrain {run.name}'s pooling to 'cls' "
                         "(paper 002 section 2.1) to fine-tune from it")
    if pooling != "cls":
        raise ValueError(f"{system}: pooling {pooling!r}, but pretrain:{run.name} shapes the [CLS] representation: "
                         "set the system's model.pooling to 'cls' (paper 002: [CLS] in pre-training and fine-tuning)")


class PretrainParams(StageParams):
    RUNTIME = frozenset({"device", "length_pieces"})   # where and how fast it computes, not what
    pretrain: PretrainRun
    device: str
    length_pieces: LengthPieces = "auto"


def save_base_checkpoint(model, folder: Path) -> Path:
    """The encoder alone (no pre-training head, no bi-encoder config) and its tokenizer: a folder
    any dense system's `model.base` (or init_from) loads as its backbone."""
    folder.mkdir(parents=True, exist_ok=True)
    model.query_encoder.save_pretrained(folder)
    model.tokenizer.save_pretrained(folder)
    return folder


def build_pretrain(params: PretrainParams, inputs: dict[str, Artifact], out: Path, work: Path) -> dict:
    import torch

    from models import BiEncoder, resolve_checkpoint
    from models.pretraining import build_pretraining_loss, load_bert_mlm_head
    from tasks.pretrain.examples import passage_context_examples, query_context_examples, sample_examples
    from tasks.training.resumable import keep_record, training_dir, training_times
    from tasks.training.trainer import train_bi_encoder

    c = params.pretrain
    passages = inputs["chunk"].read_table(columns=["pid", "doc_id", "title", "text"])
    if c.form == "passage-passage":
        examples = passage_context_examples(passages)
    else:
        examples = query_context_examples(passages, inputs["synthetic_queries"].read_table(columns=["pid", "n", "query"]))
    examples = sample_examples(examples, c.max_passages, c.seed)
    if len(examples) < c.batch_size:
        why = "documents of one passage have none" if c.form == "passage-passage" else "check the qgen stage"
        raise ValueError(f"pretrain {c.name}: {len(examples)} passages with a context, fewer than batch_size "
                         f"{c.batch_size} (form {c.form}: {why})")
    torch.manual_seed(c.seed)  # the heads' initialisation
    model = BiEncoder.from_pretrained(c.base, pooling="cls")
    loss = build_pretraining_loss(c.objective, model, **c.loss_options())
    head_from_checkpoint = load_bert_mlm_head(loss.mlm_head, resolve_checkpoint(c.base))
    contexts = sum(len(e.queries) for e in examples) / len(examples)
    logger.info("pretrain %s: %s (%s objective) on %d passages, %.2f contexts each, batch %d", c.name, c.form,
                c.objective, len(examples), contexts, c.batch_size)
    train_dir = training_dir(out, work)
    device = resolve_device(params.device)
    rows = rows_per_piece(params.length_pieces, device)
    result = train_bi_encoder(model, loss, examples, c, train_dir, progress=False, device=device, rows_per_piece=rows)
    save_base_checkpoint(model, out / "model")
    keep_record(train_dir, out)
    history = result["history"]
    return {"stats": {"form": c.form, "objective": c.objective, "passages": len(examples),
                      "contexts_per_passage": round(contexts, 3), "steps": len(history),
                      "final_loss": history[-1]["loss"] if history else None,
                      "final_terms": {k: float(v) for k, v in loss.last_terms.items()},
                      "mask_rate": c.mask_rate, "middle_layer": getattr(loss, "middle_layer", None),
                      "mlm_head": "checkpoint" if head_from_checkpoint else "fresh", "rows_per_piece": rows,
                      **training_times(result), "passages_per_second": result.get("pairs_per_second"),
                      "resumed_from": result.get("resumed_from")}}


def stages(cfg, earlier: list[Stage]) -> list[Stage]:
    out = []
    for run in cfg.pretrain:
        contexts = ("synthetic_queries",) if run.form in QUERY_FORMS else ()
        params = PretrainParams(pretrain=run.run().resolved_for(run.device), device=run.device,
                                length_pieces=run.length_pieces)
        out.append(Stage(f"pretrain:{run.name}", ARTIFACT, "1", ("chunk", *contexts), params, build_pretrain,
                         variant={"pretrain": run.name}, resumable=True))
    return out
