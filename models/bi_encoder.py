"""Dual encoder (Tevatron-like): `encode_query` / `encode_passage`, variants differ only in
pooling, tower sharing, projection and normalisation.

Paper 003 (section 3): one shared BERT tower, the [CLS] hidden state (no pooler tanh) through a
fully-connected layer, l2-normalised; passages encoded as "[CLS] title [SEP] passage [SEP]".
Paper 001 (section 4.2): l2-normalised embeddings whose dot products are scaled by 100.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .checkpoints import resolve_checkpoint
from .length_pieces import encode_in_pieces
from .pooling import Pooling, pool

CONFIG_NAME = "bi_encoder_config.json"
PROJECTION_NAME = "projection.pt"
_MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")


@dataclass
class BiEncoderConfig:
    shared: bool = True
    pooling: str = Pooling.CLS.value
    projection_dim: int | None = None
    normalize: bool = False
    similarity_scale: float = 1.0
    base_model: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.pooling = Pooling(self.pooling).value


def format_passage(title: str | None, text: str) -> tuple[str, str]:
    """Pair input for the tokenizer: tokenizer(title, text) encodes
    "[CLS] title [SEP] text [SEP]" (paper 003, figure 2). A missing title becomes ''."""
    return (title or "", text)


def format_passages(titles: Sequence[str | None] | None, texts: Sequence[str]) -> tuple[list[str], list[str]]:
    """Batch form of `format_passage`: returns (titles, texts) for `tokenizer(titles, texts)`."""
    if titles is None:
        titles = [None] * len(texts)
    if len(titles) != len(texts):
        raise ValueError(f"{len(titles)} titles for {len(texts)} texts")
    pairs = [format_passage(t, x) for t, x in zip(titles, texts)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


class BiEncoder(nn.Module):
    def __init__(
        self,
        query_encoder: nn.Module,
        passage_encoder: nn.Module | None = None,
        config: BiEncoderConfig | None = None,
        tokenizer: Any = None,
    ) -> None:
        super().__init__()
        self.config = config or BiEncoderConfig(shared=passage_encoder is None)
        if self.config.shared and passage_encoder is not None and passage_encoder is not query_encoder:
            raise ValueError("shared=True takes a single encoder")
        if not self.config.shared and passage_encoder is None:
            raise ValueError("shared=False needs a passage encoder")
        self.query_encoder = query_encoder
        # one tower: register it once, so parameters() does not double-count it
        self.passage_encoder = None if self.config.shared else passage_encoder
        self.tokenizer = tokenizer
        # Rows per length-sorted piece of an encoded batch (models/length_pieces.py); None: whole
        # batches. How fast, not what: set for a training run by `encoding_in_pieces`, never saved.
        self.rows_per_piece: int | None = None
        hidden = _hidden_size(query_encoder)
        dim = self.config.projection_dim
        if dim is not None:
            # paper 003: the same FC layer for questions and passages in the shared tower
            self.query_projection = nn.Linear(hidden, dim)
            self.passage_projection = (
                None if self.config.shared else nn.Linear(_hidden_size(passage_encoder), dim)
            )
        else:
            self.query_projection = None
            self.passage_projection = None

    # -- properties -------------------------------------------------------------------------
    @property
    def similarity_scale(self) -> float:
        return float(self.config.similarity_scale)

    @property
    def pooling(self) -> Pooling:
        return Pooling(self.config.pooling)

    @property
    def embedding_dim(self) -> int:
        if self.config.projection_dim is not None:
            return int(self.config.projection_dim)
        return _hidden_size(self.query_encoder)

    # -- encoding ---------------------------------------------------------------------------
    def _encode(self, encoder: nn.Module, projection: nn.Module | None, batch: Mapping[str, Any]) -> torch.Tensor:
        inputs = {k: v for k, v in batch.items() if k in _MODEL_INPUTS and v is not None}
        return encode_in_pieces(lambda piece: self._encode_rows(encoder, projection, piece), inputs,
                                self.rows_per_piece)

    def _encode_rows(self, encoder: nn.Module, projection: nn.Module | None, inputs: Mapping[str, Any]) -> torch.Tensor:
        out = encoder(**inputs)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        emb = pool(hidden, inputs.get("attention_mask"), self.pooling)
        if projection is not None:
            emb = projection(emb)
        if self.config.normalize:
            emb = F.normalize(emb, p=2, dim=-1)
        return emb

    def encode_query(self, batch: Mapping[str, Any]) -> torch.Tensor:
        return self._encode(self.query_encoder, self.query_projection, batch)

    def encode_passage(self, batch: Mapping[str, Any]) -> torch.Tensor:
        if self.config.shared:
            return self._encode(self.query_encoder, self.query_projection, batch)
        return self._encode(self.passage_encoder, self.passage_projection, batch)

    def score(self, q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """(Bq, D) x (Bp, D) -> (Bq, Bp) scaled dot products."""
        return self.similarity_scale * q @ p.T

    def forward(self, query_batch: Mapping[str, Any], passage_batch: Mapping[str, Any]) -> torch.Tensor:
        return self.score(self.encode_query(query_batch), self.encode_passage(passage_batch))

    # -- persistence ------------------------------------------------------------------------
    def save_pretrained(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / CONFIG_NAME).write_text(json.dumps(asdict(self.config), indent=2, sort_keys=True))
        if self.config.shared:
            self.query_encoder.save_pretrained(directory / "encoder")
        else:
            self.query_encoder.save_pretrained(directory / "query_encoder")
            self.passage_encoder.save_pretrained(directory / "passage_encoder")
        heads = {}
        if self.query_projection is not None:
            heads["query_projection"] = self.query_projection.state_dict()
        if self.passage_projection is not None:
            heads["passage_projection"] = self.passage_projection.state_dict()
        if heads:
            torch.save(heads, directory / PROJECTION_NAME)
        if self.tokenizer is not None and hasattr(self.tokenizer, "save_pretrained"):
            self.tokenizer.save_pretrained(directory / "tokenizer")
        return directory

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path,
        shared: bool | None = None,
        pooling: Pooling | str | None = None,
        projection_dim: int | None = None,
        normalize: bool | None = None,
        scale: float | None = None,
        load_tokenizer: bool = True,
    ) -> "BiEncoder":
        """Build from a backbone checkpoint (alias, local path or hub name), or reload a folder
        written by `save_pretrained`.

        Fresh build defaults: shared=True, pooling='cls', projection_dim=None (no FC layer),
        normalize=False, scale=1.0. The projection layer is freshly initialised.
        For a saved BiEncoder folder the saved config is used; an argument given (not None)
        that contradicts it raises ValueError.
        """
        from transformers import AutoModel

        path = Path(str(name_or_path))
        if (path / CONFIG_NAME).is_file():
            return cls._load_saved(path, shared, pooling, projection_dim, normalize, scale, load_tokenizer)

        ref = resolve_checkpoint(name_or_path)
        config = BiEncoderConfig(
            shared=True if shared is None else bool(shared),
            pooling=Pooling(pooling or Pooling.CLS).value,
            projection_dim=projection_dim,
            normalize=bool(normalize) if normalize is not None else False,
            similarity_scale=1.0 if scale is None else float(scale),
            base_model=str(name_or_path),
        )
        query_encoder = AutoModel.from_pretrained(ref)
        passage_encoder = None if config.shared else AutoModel.from_pretrained(ref)
        tokenizer = _try_tokenizer(ref) if load_tokenizer else None
        return cls(query_encoder, passage_encoder, config, tokenizer=tokenizer)

    @classmethod
    def _load_saved(cls, path, shared, pooling, projection_dim, normalize, scale, load_tokenizer):
        from transformers import AutoModel

        config = BiEncoderConfig(**json.loads((path / CONFIG_NAME).read_text()))
        given = {
            "shared": shared,
            "pooling": Pooling(pooling).value if pooling is not None else None,
            "projection_dim": projection_dim,
            "normalize": normalize,
            "similarity_scale": scale,
        }
        for key, value in given.items():
            if value is not None and value != getattr(config, key):
                raise ValueError(f"{path} was saved with {key}={getattr(config, key)!r}, got {value!r}")
        if config.shared:
            query_encoder, passage_encoder = AutoModel.from_pretrained(path / "encoder"), None
        else:
            query_encoder = AutoModel.from_pretrained(path / "query_encoder")
            passage_encoder = AutoModel.from_pretrained(path / "passage_encoder")
        tokenizer = None
        if load_tokenizer and (path / "tokenizer").is_dir():
            tokenizer = _try_tokenizer(str(path / "tokenizer"))
        model = cls(query_encoder, passage_encoder, config, tokenizer=tokenizer)
        heads_file = path / PROJECTION_NAME
        if heads_file.is_file():
            heads = torch.load(heads_file, map_location="cpu", weights_only=True)
            for name, state in heads.items():
                getattr(model, name).load_state_dict(state)
        elif config.projection_dim is not None:
            raise FileNotFoundError(f"{heads_file} missing for projection_dim={config.projection_dim}")
        return model


def _hidden_size(encoder: nn.Module) -> int:
    cfg = getattr(encoder, "config", None)
    size = getattr(cfg, "hidden_size", None) or getattr(cfg, "dim", None)
    if size is None:
        raise ValueError(f"cannot read the hidden size of {type(encoder).__name__}")
    return int(size)


def _try_tokenizer(ref: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(ref)
    except (OSError, ValueError):
        return None
