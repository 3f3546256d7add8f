"""The pre-training heads, all dropped after pre-training (paper 002 section 4.1: "discard the
decoder" / "the Condenser head is discarded"):

- `MlmHead`, the projection g to the vocabulary (paper 002 section 2): BERT's transform (dense,
  activation, LayerNorm) and a decoder tied to the encoder's input embeddings. MiniLM and mpnet
  ship without one, so it starts fresh; a BERT checkpoint that has one (`cls.predictions.*`) can
  seed it (`load_bert_mlm_head`).
- `TransformerHead`, a short stack of post-LayerNorm transformer layers sized like the encoder's:
  the Condenser head (section 2.1) and CoT-MAE's shallow decoder (section 2.2), freshly
  initialised.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


def _init_linear_and_norm(module: nn.Module, std: float) -> None:
    """BERT's initialisation: normal(0, initializer_range) weights, zero biases, unit LayerNorms."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def _config_value(config, name: str, default):
    value = getattr(config, name, None)
    return default if value is None else value


class MlmHead(nn.Module):
    """g(h) = LayerNorm(act(W h + b)) E^T + c, with E the encoder's input embedding matrix, passed
    to `forward` so the tie survives any reload of the encoder."""

    def __init__(self, config) -> None:
        from transformers.activations import ACT2FN

        super().__init__()
        hidden = int(config.hidden_size)
        self.dense = nn.Linear(hidden, hidden)
        self.act = ACT2FN[_config_value(config, "hidden_act", "gelu")]
        self.layer_norm = nn.LayerNorm(hidden, eps=float(_config_value(config, "layer_norm_eps", 1e-12)))
        self.bias = nn.Parameter(torch.zeros(int(config.vocab_size)))
        self.apply(lambda m: _init_linear_and_norm(m, float(_config_value(config, "initializer_range", 0.02))))

    def forward(self, hidden: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        """(N, H) states -> (N, V) vocabulary logits."""
        if embeddings.shape[0] != self.bias.shape[0]:
            raise ValueError(f"the embedding matrix has {embeddings.shape[0]} rows, the head {self.bias.shape[0]}")
        return F.linear(self.layer_norm(self.act(self.dense(hidden))), embeddings, self.bias)


# A BertForMaskedLM checkpoint's head tensors -> MlmHead's.
_BERT_MLM_KEYS = {
    "cls.predictions.transform.dense.weight": "dense.weight",
    "cls.predictions.transform.dense.bias": "dense.bias",
    "cls.predictions.transform.LayerNorm.weight": "layer_norm.weight",
    "cls.predictions.transform.LayerNorm.bias": "layer_norm.bias",
    "cls.predictions.bias": "bias",
}


def load_bert_mlm_head(head: MlmHead, folder: str | Path) -> bool:
    """Copy a BERT checkpoint's own MLM head (its `model.safetensors` holds `cls.predictions.*`)
    into `head`; False, leaving `head` fresh, when the folder has none (MiniLM, mpnet)."""
    from safetensors import safe_open

    path = Path(folder) / "model.safetensors"
    if not path.is_file():
        return False
    with safe_open(str(path), framework="pt") as f:
        keys = set(f.keys())
        if not set(_BERT_MLM_KEYS) <= keys:
            return False
        state = {ours: f.get_tensor(theirs) for theirs, ours in _BERT_MLM_KEYS.items()}
    if state["bias"].shape != head.bias.shape:
        raise ValueError(f"{path}: its MLM head has {state['bias'].shape[0]} outputs, the vocabulary {head.bias.shape[0]}")
    head.load_state_dict(state)
    return True


class TransformerHead(nn.Module):
    """`layers` transformer layers with the encoder's width, heads, feed-forward size, activation,
    dropout and LayerNorm epsilon (post-LayerNorm, as BERT), initialised as BERT initialises."""

    def __init__(self, config, layers: int) -> None:
        super().__init__()
        if layers < 1:
            raise ValueError(f"a head needs at least one layer, got {layers}")
        act = _config_value(config, "hidden_act", "gelu")
        if act not in ("gelu", "relu"):
            raise ValueError(f"hidden_act {act!r}: the head's layers support gelu and relu")
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(
            d_model=int(config.hidden_size), nhead=int(config.num_attention_heads),
            dim_feedforward=int(config.intermediate_size), dropout=float(_config_value(config, "hidden_dropout_prob", 0.1)),
            activation=act, layer_norm_eps=float(_config_value(config, "layer_norm_eps", 1e-12)),
            batch_first=True, norm_first=False) for _ in range(layers))
        self.apply(lambda m: _init_linear_and_norm(m, float(_config_value(config, "initializer_range", 0.02))))
        for layer in self.layers:  # the attention's packed input projection is a bare Parameter
            nn.init.normal_(layer.self_attn.in_proj_weight, mean=0.0, std=float(_config_value(config, "initializer_range", 0.02)))
            nn.init.zeros_(layer.self_attn.in_proj_bias)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, T, H) inputs, (B, T) mask of real tokens -> (B, T, H)."""
        padding = attention_mask == 0
        for layer in self.layers:
            hidden = layer(hidden, src_key_padding_mask=padding)
        return hidden
