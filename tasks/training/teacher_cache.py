"""The teacher's logits for a train stage's pairs, kept in the stage's work folder: a stage killed
mid-training resumes from its checkpoint without scoring every pair again (issue 25's student has
24,000 pairs for the cross-encoder, minutes of CPU, before its first step). A runtime matter: the
cache is keyed by the pairs and the teacher's version, and changes no artifact version."""
from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

logger = logging.getLogger("passage_forge")

CACHE_NAME = "teacher_scores.npz"


def pairs_key(pairs: Sequence[tuple[str, str]], teacher: str) -> str:
    """A digest of the teacher's identity and every (query, passage) pair, in order."""
    digest = hashlib.sha256(teacher.encode("utf-8"))
    for query, passage in pairs:
        digest.update(b"\x00" + query.encode("utf-8") + b"\x01" + passage.encode("utf-8"))
    return digest.hexdigest()


def cached_logits(pairs: Sequence[tuple[str, str]], teacher: str, cache: Optional[Path],
                  score: Callable[[list[tuple[str, str]]], Sequence[float]]) -> np.ndarray:
    """`score(pairs)` as float32, read from `cache` when it holds the scores of these pairs by this
    teacher, else computed and written there (whole or not at all: written aside, then renamed)."""
    key = pairs_key(pairs, teacher)
    if cache is not None and cache.is_file():
        with np.load(cache) as saved:
            if str(saved["key"]) == key and len(saved["logits"]) == len(pairs):
                logger.info("teacher scores: %d pairs read from %s (scored before this run resumed)", len(pairs), cache)
                return saved["logits"].astype(np.float32)
        logger.info("teacher scores: %s holds other pairs; scoring again", cache)
    logits = np.asarray(score(list(pairs)), dtype=np.float32)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_name(cache.name + ".partial")
        with open(partial, "wb") as f:
            np.savez(f, key=np.array(key), logits=logits)
        os.replace(partial, cache)
    return logits
