"""The trainers' settings: the optimisation schedule every trainer of the project runs
(ScheduleArgs) and the bi-encoder trainer's own settings (TrainerArgs). Pydantic models, so they
validate and render as Prefect UI forms."""
from __future__ import annotations

from typing import Annotated, Any, Collection, Literal, Optional, Union

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from tasks.compute.device import resolve_device


# How fast a step encodes, not what it trains (models/length_pieces.py): stages leave it out of the hash.
LengthPieces = Union[Literal["auto"], Annotated[int, Field(ge=1)], None]
LENGTH_PIECES_HELP = ("rows per length-sorted piece when a training step encodes its padded batches, each piece "
                      "padded to its own longest (less padding; the same outputs and loss); auto: 8 rows on a CPU, "
                      "whole batches on CUDA; empty: whole batches. benchmarks/length_pieces.py measures it")
CPU_ROWS_PER_PIECE = 8   # benchmarks/length_pieces.py: smaller pieces pad less, larger ones keep the matmuls wide


def rows_per_piece(setting: LengthPieces, device: str) -> int | None:
    """A `length_pieces` setting for `device`: 'auto' cuts batches on a CPU (padding is paid in
    full there), not on CUDA (wide batches fill the GPU)."""
    if setting != "auto":
        return setting
    return CPU_ROWS_PER_PIECE if torch.device(resolve_device(device)).type == "cpu" else None


class ScheduleArgs(BaseModel):
    """The optimisation schedule any of the project's trainers runs (AdamW, warm-up then linear
    decay, clipping, bf16 autocast, checkpoints, dev evaluations); a pydantic model, so it validates
    and renders as a Prefect UI form. Trainers subclass it with their own fields and defaults; the
    batch size is one of their own, since what a batch holds (questions, pairs, passages) is theirs."""

    model_config = ConfigDict(extra="forbid")

    lr: float = Field(2e-5, gt=0, description="peak learning rate (AdamW)")
    epochs: int = Field(1, ge=1, description="passes over the examples (ignored when max_steps is given)")
    max_steps: Optional[int] = Field(None, ge=1, description="optimizer steps; overrides epochs when given")
    warmup_ratio: float = Field(0.1, ge=0, le=1, description="share of the steps with a linear warm-up, then linear decay to 0")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay (none on biases and LayerNorm)")
    max_grad_norm: Optional[float] = Field(2.0, ge=0, description="gradient clipping norm; empty or 0: no clipping")
    seed: int = Field(42, description="seeds the example order, the draws and the initial RNG state")
    bf16: Literal["auto", "on", "off"] = Field(
        "auto", description="bf16 autocast: 'auto' is on for CUDA with bf16 support and for CPUs with bf16 units "
                            "(AMX, avx512_bf16), off otherwise (true/false: on/off); planning resolves 'auto' to 'on' "
                            "on such a CPU, so the version says the model trained in bf16")
    checkpoint_every: Optional[int] = Field(None, ge=1, description="steps between resumable checkpoints; empty: none")
    eval_every: Optional[int] = Field(None, ge=1, description="steps between dev evaluations; one at the end always")
    keep_checkpoints: int = Field(2, ge=1, description="resumable checkpoints kept (the latest ones)")

    @field_validator("bf16", mode="before")
    @classmethod
    def _bf16_from_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):
            return "on" if value else "off"
        return value

    def resolved_for(self, device: str) -> "ScheduleArgs":
        """These settings as planned for `device` ('auto', 'cpu', 'cuda'): 'auto' becomes 'on' on a
        CPU with bf16 units (hashed: the version names a bf16-trained model), and stays 'auto'
        elsewhere, so versions planned before CPU bf16 training keep their hash."""
        from models.cpu_features import bf16_wanted

        if self.bf16 == "auto" and torch.device(resolve_device(device)).type == "cpu" and bf16_wanted("auto", "cpu"):
            return self.model_copy(update={"bf16": "on"})
        return self


class TrainerArgs(ScheduleArgs):
    """The bi-encoder trainer's settings: a dense system's `train.schedule` (written flat in its
    train section beside the pipeline's own settings). The device is not a setting of the run: it
    is `train_bi_encoder(device=...)`."""

    batch_size: int = Field(16, ge=2, description="questions per step; the others' passages are in-batch negatives")
    hard_negatives: int = Field(2, ge=0, description="N: hard negatives per question per step (paper 003 section 5.3: 2)")
    # Empty by default: a pipeline trains at the lengths it encodes with (dense.encode's, set at
    # planning, so the version names them); a direct caller of the trainer gives its own.
    query_max_len: Optional[int] = Field(None, ge=1, description="query tokens; empty: dense.encode.query_max_len")
    passage_max_len: Optional[int] = Field(None, ge=1, description=(
        "passage tokens (title and text); empty: dense.encode.passage_max_len"))
    gradient_checkpointing: bool = Field(False, description="recompute activations in the backward to save memory")
    eval_at_start: bool = Field(True, description="with an evaluator: the untrained model is a candidate too (step 0 "
                                                  "wins if training hurts)")


def written_flat(section: dict, own: Collection[str] = ()) -> dict:
    """The TrainerArgs fields written flat in a train section (not those in `own`, its own fields)."""
    return {k: v for k, v in section.items() if k in TrainerArgs.model_fields and k not in own}


def trainer_settings_of(section: dict, own: Collection[str] = ()) -> tuple[dict, dict]:
    """A train section's (other settings, trainer settings): the TrainerArgs fields written flat in
    it (those not in `own`, the section's own fields) merged with its `schedule:` mapping or object;
    one setting given both ways is refused, whoever reads the section (the config or an overlay)."""
    flat = written_flat(section, own)
    given = section.get("schedule") or {}
    nested = given.model_dump(exclude_unset=True) if isinstance(given, TrainerArgs) else dict(given)
    twice = sorted(set(flat) & set(nested))
    if twice:
        raise ValueError(f"{', '.join(twice)}: given both in the section and in its schedule")
    rest = {k: v for k, v in section.items() if k not in flat and k != "schedule"}
    return rest, {**nested, **flat}
