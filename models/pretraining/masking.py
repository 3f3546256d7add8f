"""Masked language modelling inputs (paper 002 section 2, "Masked Language Modeling"): a share of
each sequence's positions is chosen, and replaced with [MASK] or a random token.

Every draw comes from a generator seeded by (seed, step, stream), never from the global RNG: a
run resumed from a checkpoint at step k masks step k+1 exactly as an uninterrupted run does, and
masking leaves the training's own random stream alone.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterable

import torch

IGNORE = -100  # label of an unmasked position (ignored by cross_entropy)

# BERT's split of the chosen positions: 80% [MASK], 10% a random token, 10% kept (Devlin et al.
# 2018; paper 002 section 2: "replaced with a special token [MASK] or a random token").
MASK_SHARE, RANDOM_SHARE = 0.8, 0.1


def step_generator(seed: int, step: int, stream: str) -> torch.Generator:
    """A CPU generator seeded by (seed, step, stream), the same in every process and on resume."""
    digest = hashlib.sha256(f"{seed}:{step}:{stream}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


@dataclass(frozen=True)
class MaskSpec:
    """What masking needs to know about the tokenizer and the vocabulary."""
    mask_id: int
    special_ids: tuple[int, ...]   # never masked ([CLS], [SEP], [PAD], ...)
    vocab_size: int                # random replacements are drawn from [0, vocab_size) minus specials

    @classmethod
    def of(cls, tokenizer, vocab_size: int | None = None) -> "MaskSpec":
        if tokenizer.mask_token_id is None:
            raise ValueError(f"{type(tokenizer).__name__} has no mask token: masked language modelling needs one")
        size = min(len(tokenizer), vocab_size) if vocab_size else len(tokenizer)
        return cls(int(tokenizer.mask_token_id), tuple(sorted(set(int(i) for i in tokenizer.all_special_ids))), int(size))


def masked_count(maskable: torch.Tensor, rate: float) -> torch.Tensor:
    """Positions masked per sequence: round(rate * maskable tokens), at least 1 where any is maskable."""
    n = maskable.sum(dim=1)
    k = torch.floor(n.to(torch.float64) * rate + 0.5).to(torch.long)
    return torch.where(n > 0, k.clamp(min=1), torch.zeros_like(k)).minimum(n)


def mask_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor, rate: float, spec: MaskSpec,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(masked input_ids, labels) on the input's device. Exactly `masked_count` positions per
    sequence are chosen uniformly among its non-special, non-padding tokens; labels hold the
    original token there and IGNORE elsewhere; of the chosen, MASK_SHARE become the mask token,
    RANDOM_SHARE a random non-special token and the rest stay."""
    if not 0 < rate < 1:
        raise ValueError(f"mask rate must be in (0, 1), got {rate}")
    device = input_ids.device
    ids = input_ids.detach().cpu()
    maskable = attention_mask.detach().cpu().bool() & ~torch.isin(ids, torch.tensor(spec.special_ids, dtype=ids.dtype))
    scores = torch.rand(ids.shape, generator=generator)
    scores[~maskable] = 2.0  # never among the first k
    ranks = scores.argsort(dim=1).argsort(dim=1)
    chosen = ranks < masked_count(maskable, rate)[:, None]
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE))
    action = torch.rand(ids.shape, generator=generator)
    replacements = _random_tokens(ids.shape, spec, generator)
    masked = ids.clone()
    masked[chosen & (action < MASK_SHARE)] = spec.mask_id
    swap = chosen & (action >= MASK_SHARE) & (action < MASK_SHARE + RANDOM_SHARE)
    masked[swap] = replacements[swap]
    return masked.to(device), labels.to(device)


def _random_tokens(shape, spec: MaskSpec, generator: torch.Generator) -> torch.Tensor:
    allowed = _non_special(spec.vocab_size, spec.special_ids)
    return allowed[torch.randint(len(allowed), shape, generator=generator)]


def _non_special(vocab_size: int, special_ids: Iterable[int]) -> torch.Tensor:
    keep = torch.ones(vocab_size, dtype=torch.bool)
    specials = [i for i in special_ids if 0 <= i < vocab_size]
    keep[specials] = False
    if not keep.any():
        raise ValueError("every token of the vocabulary is special: nothing to replace a masked token with")
    return keep.nonzero().squeeze(1)
