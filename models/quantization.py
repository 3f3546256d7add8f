"""Dynamic int8 quantisation for CPU inference: the Linear layers (about 90% of a BERT's
encoding FLOPs at 256 tokens) run int8 matmuls with activations quantised per batch; attention
softmax, layer norms and embeddings stay fp32. Training and CUDA use the fp32/bf16 model."""
from __future__ import annotations

import copy
import warnings

import torch
from torch import nn


def quantize_dynamic_int8(model: nn.Module) -> nn.Module:
    """A copy of `model` whose nn.Linear layers are dynamically quantised to int8 (CPU only)."""
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        return quantize_dynamic(copy.deepcopy(model).cpu().eval(), {nn.Linear}, dtype=torch.qint8)
