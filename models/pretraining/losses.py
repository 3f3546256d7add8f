"""Query-as-context pre-training objectives (paper 002 sections 2 and 3) as loss modules around a
shared-tower `BiEncoder`, which the bi-encoder trainer runs like any loss: the collated query
batch is the context (a generated query, or another passage of the document for the
passage-passage baseline), the passage batch the passage. Heads live in the loss module, so the
trainer checkpoints them with it and the encoder is saved without them.

- `CoCondenserLoss` (section 2.1): encoder MLM and Condenser-head MLM on both spans, plus an
  in-batch contrastive loss between each passage and its context; the total is the sum.
- `CotMaeLoss` (section 2.2): encoder MLM on the passage at a higher mask rate, and a shallow
  decoder reconstructing the masked context from the passage's [CLS] state plus the context's
  token embeddings; the total is the sum.

Masking is drawn per (seed, step, span) (`masking.step_generator`): the trainer tells the loss
the step through the `on_batch` hook, so a resumed run masks exactly as an uninterrupted one.
The encoder reads a masked span in its model's length pieces (models/length_pieces.py: the trainer
sets them): the MLM terms are sums over pieces and the representations go back in row order, so
the loss is the whole batch's with less padding.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F

from models.callbacks import TrainerCallback
from models.length_pieces import batch_pieces, in_batch_order
from models.losses.base import EmbeddingLoss, no_weights
from models.losses.distributed import gather_rows
from models.pooling import Pooling, pool

from .heads import MlmHead, TransformerHead
from .masking import IGNORE, MaskSpec, mask_tokens, step_generator

# Paper defaults, one line each.
# BERT's 15%, which coCondenser keeps (section 2.1 follows Gao and Callan 2021b).
COCONDENSER_MASK_RATE = 0.15
# Section 2.2: the CoT-MAE encoder masks at "a higher mask rate (e.g. 30%)".
COTMAE_MASK_RATE = 0.30
# CoT-MAE (Wu et al. 2022, section 2.2's source) masks the decoder's context at 45%; section
# 2.2's own figure is lost in this copy of paper 002.
COTMAE_DECODER_MASK_RATE = 0.45
# Sections 2.1/2.2 leave the head depth M open: Condenser's head has 2 layers, and the public
# CoT-MAE code's default decoder too (n_head_layers=2).
HEAD_LAYERS = 2
# Section 2.1: the dot product of the spans' representations; tau is left open there, and
# section 3.2 fixes it to 1 for fine-tuning: 1 here too.
TEMPERATURE = 1.0

_ENCODER_INPUTS = ("attention_mask", "token_type_ids", "position_ids")


def contrastive_loss(x: torch.Tensor, y: torch.Tensor, temperature: float = TEMPERATURE) -> torch.Tensor:
    """Section 2.1's L_co: mean over i of -log softmax_j(x_i . y_j / tau)[i] (y_i is x_i's context,
    the other rows' contexts are its in-batch negatives)."""
    if x.shape != y.shape:
        raise ValueError(f"{tuple(x.shape)} passages but {tuple(y.shape)} contexts")
    logits = (x.float() @ y.float().T) / temperature
    return F.cross_entropy(logits, torch.arange(x.shape[0], device=x.device))


def masked_lm_sum(head, hidden: torch.Tensor, labels: torch.Tensor, embeddings: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Section 2's L_mlm before averaging: (sum over the masked positions i of CE(g(h_i), r_i),
    the number of masked positions). g runs only at the masked positions (labels != IGNORE)."""
    chosen = labels != IGNORE
    count = int(chosen.sum())
    if count == 0:
        return hidden.sum() * 0.0, 0
    logits = head(hidden[chosen], embeddings)
    return F.cross_entropy(logits.float(), labels[chosen], reduction="sum"), count


def middle_layer_of(num_layers: int, middle_layer: int | None) -> int:
    """Section 2.1: the Condenser head reads the token states of the encoder's M-th layer, "e.g.
    L/2" (layer 6 of BERT-base's 12, layer 3 of MiniLM-L6's 6)."""
    m = num_layers // 2 if middle_layer is None else int(middle_layer)
    if not 1 <= m < num_layers:
        raise ValueError(f"middle_layer must be in 1..{num_layers - 1} for a {num_layers}-layer encoder, got {m}")
    return m


class PretrainingLoss(EmbeddingLoss, TrainerCallback):
    """What both objectives share: the encoder of a shared-tower BiEncoder, the tied MLM head g,
    masking seeded per (seed, step, span), and the masked-token cross entropy. `forward` returns
    the sum of `terms(...)`; `last_terms` keeps the latest step's terms (detached)."""

    def __init__(self, model, mask_rate: float, seed: int = 0) -> None:
        super().__init__(model)
        if not getattr(model.config, "shared", True):
            raise ValueError("pre-training trains one shared tower (model.shared: true)")
        if getattr(model, "tokenizer", None) is None:
            raise ValueError("pre-training masks tokens: the model needs its tokenizer")
        if not 0 < mask_rate < 1:
            raise ValueError(f"mask_rate must be in (0, 1), got {mask_rate}")
        config = self.encoder.config
        self.spec = MaskSpec.of(model.tokenizer, self.encoder.get_input_embeddings().num_embeddings)
        self.mlm_head = MlmHead(config)
        self.mask_rate = float(mask_rate)
        self.seed = int(seed)
        self.step = 0
        self.last_terms: dict[str, torch.Tensor] = {}

    @property
    def encoder(self):
        return self.model.query_encoder

    # -- trainer hook: the step seeds the masks ----------------------------------------------
    def on_batch(self, step: int, batch) -> None:
        self.step = int(step)

    # -- pieces ------------------------------------------------------------------------------
    def mask(self, batch: Mapping[str, Any], rate: float, stream: str) -> tuple[torch.Tensor, torch.Tensor]:
        return mask_tokens(batch["input_ids"], batch["attention_mask"], rate, self.spec,
                           step_generator(self.seed, self.step, stream))

    def masked_pieces(self, batch: Mapping[str, Any], masked: torch.Tensor, labels: torch.Tensor):
        """(batch rows, piece) for each length piece of a masked span: a piece holds the encoder's
        inputs, the masked ids and the MLM labels of its rows, cut to its longest row; one piece
        (rows None) unless the model encodes in pieces."""
        inputs = {k: v for k, v in batch.items() if k in _ENCODER_INPUTS and v is not None}
        rows_per_piece = getattr(self.model, "rows_per_piece", None)
        return batch_pieces({**inputs, "input_ids": masked, "labels": labels}, rows_per_piece)

    def run_encoder(self, piece: Mapping[str, torch.Tensor], hidden_states: bool = False):
        """The encoder over one piece of `masked_pieces` (its masked ids and inputs; not its labels)."""
        inputs = {k: v for k, v in piece.items() if k != "labels"}
        return self.encoder(output_hidden_states=hidden_states, **inputs)

    def mlm_sum(self, hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
        return masked_lm_sum(self.mlm_head, hidden, labels, self.encoder.get_input_embeddings().weight)

    # -- the loss ----------------------------------------------------------------------------
    def terms(self, context_batch: Mapping[str, Any], passage_batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def forward(self, query_batch, passage_batch, negative_batch=None, weights=None) -> torch.Tensor:
        if negative_batch is not None:
            raise ValueError(f"{type(self).__name__} takes no hard negatives (hard_negatives: 0)")
        no_weights(type(self).__name__, weights)
        terms = self.terms(query_batch, passage_batch)
        self.step += 1  # used when no trainer calls on_batch (benchmarks); the trainer sets it
        self.last_terms = {k: v.detach() for k, v in terms.items()}
        return sum(terms.values())


def _mean(parts: list[tuple[torch.Tensor, int]]) -> torch.Tensor:
    return sum(s for s, _ in parts) / max(sum(n for _, n in parts), 1)


class CoCondenserLoss(PretrainingLoss):
    """L = L_mlm + L_aux-mlm + L_co (section 2.1). Both spans (passage, context) are masked once
    and encoded; L_mlm is g on the last layer's states, L_aux-mlm g on the Condenser head's output,
    whose input is the last layer's [CLS] state followed by the middle layer's token states
    (h_L^0, h_M^1..h_M^n); each is the mean cross entropy over both spans' masked tokens. L_co is
    `contrastive_loss` between the passages' and the contexts' representations (`pooling`: the
    last layer's [CLS] state, section 2.1's h_L^0, or the mean of its token states)."""

    def __init__(self, model, mask_rate: float = COCONDENSER_MASK_RATE, head_layers: int = HEAD_LAYERS,
                 middle_layer: int | None = None, temperature: float = TEMPERATURE, pooling: str = "cls",
                 seed: int = 0) -> None:
        super().__init__(model, mask_rate, seed)
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.middle_layer = middle_layer_of(int(self.encoder.config.num_hidden_layers), middle_layer)
        self.head = TransformerHead(self.encoder.config, head_layers)
        self.temperature = float(temperature)
        self.pooling = Pooling(pooling)

    def span(self, batch: Mapping[str, Any], stream: str):
        """(representation, [(MLM sum, count)], [(head MLM sum, count)]) of one span, a sum per piece."""
        masked, labels = self.mask(batch, self.mask_rate, stream)
        reps, rows, mlm, aux = [], [], [], []
        for piece_rows, piece in self.masked_pieces(batch, masked, labels):
            states = self.run_encoder(piece, hidden_states=True).hidden_states
            last, middle = states[-1], states[self.middle_layer]
            head_out = self.head(torch.cat([last[:, :1], middle[:, 1:]], dim=1), piece["attention_mask"])
            reps.append(pool(last, piece["attention_mask"], self.pooling))
            rows.append(piece_rows)
            mlm.append(self.mlm_sum(last, piece["labels"]))
            aux.append(self.mlm_sum(head_out, piece["labels"]))
        return in_batch_order(reps, rows), mlm, aux

    def terms(self, context_batch, passage_batch):
        p_rep, p_mlm, p_aux = self.span(passage_batch, "passage")
        c_rep, c_mlm, c_aux = self.span(context_batch, "context")
        # Under DDP the in-batch negatives are the global batch's (identity in one process); the
        # MLM terms stay per rank, averaged over ranks by DDP.
        return {"mlm": _mean(p_mlm + c_mlm), "aux_mlm": _mean(p_aux + c_aux),
                "contrastive": contrastive_loss(gather_rows(p_rep), gather_rows(c_rep), self.temperature)}


class CotMaeLoss(PretrainingLoss):
    """L = L_mlm + L_ctx-mlm (section 2.2): the passage, masked at `mask_rate`, through the
    encoder with g on its last layer; the context, masked at `decoder_mask_rate`, reconstructed by
    a freshly initialised `decoder_layers`-layer decoder whose input is (h_x, a_1..a_n): the
    passage's last-layer [CLS] state in place of the context's first token, then the context's
    token embeddings (the encoder's embedding layer). Nothing else of the passage reaches it."""

    def __init__(self, model, mask_rate: float = COTMAE_MASK_RATE, decoder_mask_rate: float = COTMAE_DECODER_MASK_RATE,
                 decoder_layers: int = HEAD_LAYERS, seed: int = 0) -> None:
        super().__init__(model, mask_rate, seed)
        if not 0 < decoder_mask_rate < 1:
            raise ValueError(f"decoder_mask_rate must be in (0, 1), got {decoder_mask_rate}")
        if not hasattr(self.encoder, "embeddings"):
            raise ValueError(f"{type(self.encoder).__name__} has no embeddings module for the decoder's input")
        self.decoder_mask_rate = float(decoder_mask_rate)
        self.decoder = TransformerHead(self.encoder.config, decoder_layers)

    def decoder_inputs(self, cls: torch.Tensor, context_ids: torch.Tensor) -> torch.Tensor:
        """d_0 = (h_x, a_1, ..., a_n): (B, H) [CLS] states and (B, T) context ids -> (B, T, H)."""
        if cls.dim() != 2:
            raise ValueError(f"the decoder takes one [CLS] vector per passage, (B, H); got {tuple(cls.shape)}")
        embedded = self.encoder.embeddings(input_ids=context_ids)
        return torch.cat([cls.unsqueeze(1).to(embedded.dtype), embedded[:, 1:]], dim=1)

    def context_loss(self, cls: torch.Tensor, context_batch: Mapping[str, Any]) -> torch.Tensor:
        """L_ctx-mlm from the passages' [CLS] states alone (the signature admits nothing else)."""
        masked, labels = self.mask(context_batch, self.decoder_mask_rate, "context")
        decoded = self.decoder(self.decoder_inputs(cls, masked), context_batch["attention_mask"])
        return _mean([self.mlm_sum(decoded, labels)])

    def terms(self, context_batch, passage_batch):
        masked, labels = self.mask(passage_batch, self.mask_rate, "passage")
        mlm, cls, rows = [], [], []
        for piece_rows, piece in self.masked_pieces(passage_batch, masked, labels):
            last = self.run_encoder(piece).last_hidden_state
            mlm.append(self.mlm_sum(last, piece["labels"]))
            cls.append(last[:, 0])
            rows.append(piece_rows)
        # The context is a short query: the decoder reads it whole.
        return {"mlm": _mean(mlm), "context_mlm": self.context_loss(in_batch_order(cls, rows), context_batch)}


#: The pre-training objectives by the name a config gives them.
PRETRAINING_LOSSES: dict[str, type[PretrainingLoss]] = {"cocondenser": CoCondenserLoss, "cotmae": CotMaeLoss}


def build_pretraining_loss(objective: str, model, **options) -> PretrainingLoss:
    try:
        cls = PRETRAINING_LOSSES[objective]
    except KeyError:
        raise ValueError(f"unknown pre-training objective {objective!r}; known: {', '.join(PRETRAINING_LOSSES)}") from None
    return cls(model, **options)
