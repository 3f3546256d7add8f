"""Export a BiEncoder tower as a plain Hugging Face + sentence-transformers folder.

One folder per tower::

    config.json, model.safetensors, tokenizer files     <- AutoModel / AutoTokenizer
    modules.json, sentence_bert_config.json,
    config_sentence_transformers.json                    <- SentenceTransformer(path)
    1_Pooling/config.json                                <- cls or mean pooling
    2_Dense/{config.json, model.safetensors}             <- only with a projection (identity activation)
    N_Normalize/                                         <- only when the model l2-normalises
    passage_forge_export.json                            <- what was exported (side, scale, ...)

``SentenceTransformer(path).encode(texts)`` then equals ``model.encode_query`` /
``model.encode_passage`` on the same tokenisation. Without sentence-transformers, load the folder
with ``AutoModel.from_pretrained(path)``, pool the last hidden state as ``1_Pooling/config.json``
says, then apply ``2_Dense`` (``y = x W^T + b``) and the l2 normalisation if present.

Not carried over: ``similarity_scale`` (sentence-transformers has no such knob; it is recorded in
``passage_forge_export.json`` and does not change rankings), and the pair input for passages
(our passages are tokenised as ``tokenizer(title, text)``; give sentence-transformers the same
tokenisation to get the same vectors).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .bi_encoder import BiEncoder, _hidden_size
from .pooling import Pooling

EXPORT_INFO_NAME = "passage_forge_export.json"
_SIDES = ("query", "passage")


def _tower(model: BiEncoder, side: str) -> tuple[nn.Module, nn.Linear | None]:
    if side not in _SIDES:
        raise ValueError(f"side must be one of {_SIDES}, got {side!r}")
    if model.config.shared or side == "query":
        return model.query_encoder, model.query_projection
    return model.passage_encoder, model.passage_projection


def _default_max_seq_length(encoder: nn.Module, tokenizer: Any) -> int:
    limits = []
    positions = getattr(getattr(encoder, "config", None), "max_position_embeddings", None)
    if positions:
        limits.append(int(positions))
    tok_max = getattr(tokenizer, "model_max_length", None)
    if tok_max and tok_max < 1_000_000:  # transformers uses a huge sentinel for "unset"
        limits.append(int(tok_max))
    return min(limits) if limits else 512


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")


def _versions() -> dict[str, str]:
    out = {"pytorch": torch.__version__}
    try:
        import transformers

        out["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        pass
    try:  # the installed version without importing it (the import costs 10 s or more)
        from importlib.metadata import PackageNotFoundError, version

        out["sentence_transformers"] = version("sentence-transformers")
    except PackageNotFoundError:
        out["sentence_transformers"] = "2.3.0"  # oldest format this layout targets
    return out


def export_encoder(
    model: BiEncoder,
    out_dir: str | Path,
    side: str = "query",
    max_seq_length: int | None = None,
    tokenizer: Any = None,
) -> Path:
    """Write the ``side`` tower ('query' or 'passage'; the same tower when shared) of ``model``
    to ``out_dir`` as a Hugging Face model folder that is also a sentence-transformers model.

    ``tokenizer`` defaults to ``model.tokenizer`` (required: an exported model without a tokenizer
    cannot encode text). ``max_seq_length`` (sentence-transformers truncation) defaults to
    min(max_position_embeddings, tokenizer.model_max_length). Returns ``out_dir``.
    """
    from safetensors.torch import save_file

    encoder, projection = _tower(model, side)
    tokenizer = tokenizer if tokenizer is not None else model.tokenizer
    if tokenizer is None or not hasattr(tokenizer, "save_pretrained"):
        raise ValueError("export needs a tokenizer: set model.tokenizer or pass tokenizer=")
    if max_seq_length is None:
        max_seq_length = _default_max_seq_length(encoder, tokenizer)
    if max_seq_length < 1:
        raise ValueError(f"max_seq_length must be >= 1, got {max_seq_length}")

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    encoder.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)

    hidden = _hidden_size(encoder)
    pooling = model.pooling
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    _write_json(out / "sentence_bert_config.json", {"max_seq_length": int(max_seq_length), "do_lower_case": False})
    # legacy key layout: read by every sentence-transformers release (6.x converts it on load)
    _write_json(out / "1_Pooling" / "config.json", {
        "word_embedding_dimension": hidden,
        "pooling_mode_cls_token": pooling is Pooling.CLS,
        "pooling_mode_mean_tokens": pooling is Pooling.MEAN,
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": False,
        "include_prompt": True,
    })
    if projection is not None:
        dense_dir = out / "2_Dense"
        _write_json(dense_dir / "config.json", {
            "in_features": projection.in_features,
            "out_features": projection.out_features,
            "bias": projection.bias is not None,
            "activation_function": "torch.nn.modules.linear.Identity",
        })
        state = {"linear.weight": projection.weight.detach().cpu().contiguous()}
        if projection.bias is not None:
            state["linear.bias"] = projection.bias.detach().cpu().contiguous()
        save_file(state, str(dense_dir / "model.safetensors"), metadata={"format": "pt"})
        modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    if model.config.normalize:
        idx = len(modules)
        path = f"{idx}_Normalize"
        (out / path).mkdir(exist_ok=True)
        modules.append({"idx": idx, "name": str(idx), "path": path, "type": "sentence_transformers.models.Normalize"})
    _write_json(out / "modules.json", modules)
    _write_json(out / "config_sentence_transformers.json", {
        "__version__": _versions(),
        "prompts": {},
        "default_prompt_name": None,
        "similarity_fn_name": "cosine" if model.config.normalize else "dot",
    })
    _write_json(out / EXPORT_INFO_NAME, {
        "side": "shared" if model.config.shared else side,
        "pooling": pooling.value,
        "projection_dim": model.config.projection_dim,
        "normalize": bool(model.config.normalize),
        "similarity_scale": model.similarity_scale,
        "base_model": model.config.base_model,
        "passage_input": "tokenizer(title, text) pairs: [CLS] title [SEP] text [SEP]",
    })
    return out


def export_bi_encoder(model: BiEncoder, out_dir: str | Path, **kwargs: Any) -> dict[str, Path]:
    """Export both sides. A shared tower gives one folder, ``out_dir``, under both keys;
    separate towers give ``out_dir/query_encoder`` and ``out_dir/passage_encoder``.
    Returns ``{'query': path, 'passage': path}``; ``kwargs`` go to `export_encoder`."""
    out = Path(out_dir)
    if model.config.shared:
        path = export_encoder(model, out, side="query", **kwargs)
        return {"query": path, "passage": path}
    return {
        "query": export_encoder(model, out / "query_encoder", side="query", **kwargs),
        "passage": export_encoder(model, out / "passage_encoder", side="passage", **kwargs),
    }
