"""Deterministic train/dev/test assignment of questions by article (no article in two splits)."""
from __future__ import annotations

import random
from typing import Mapping, Sequence


def assign_article_splits(
    doc_ids: Sequence[str],
    ratios: Mapping[str, float],
    seed: int,
    explicit: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, str]:
    """Map each doc_id to a split.

    Articles named in `explicit` (split -> doc_ids) go to that split; the rest are shuffled with
    `seed` and cut by `ratios` (in the order given). Same inputs always give the same assignment.
    """
    assignment: dict[str, str] = {}
    for split, named in (explicit or {}).items():
        for doc_id in named:
            if doc_id in assignment and assignment[doc_id] != split:
                raise ValueError(f"article {doc_id!r} is listed in splits {assignment[doc_id]!r} and {split!r}")
            assignment[doc_id] = split
    rest = sorted(d for d in set(doc_ids) if d not in assignment)
    random.Random(seed).shuffle(rest)
    total = sum(ratios.values())
    if rest and total <= 0:
        raise ValueError("split ratios must sum to a positive number")
    names = list(ratios)
    start = 0
    for i, name in enumerate(names):
        # The last split takes the remainder so rounding never drops an article.
        end = len(rest) if i == len(names) - 1 else start + round(len(rest) * ratios[name] / total)
        for doc_id in rest[start:end]:
            assignment[doc_id] = name
        start = end
    return assignment
