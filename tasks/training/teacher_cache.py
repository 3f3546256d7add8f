"""The teacher's logits for a train stage's pairs, kept in the stage's work folder as they are
scored: a stage killed while scoring resumes at the first unscored chunk, and one killed while
training reads them all back (issue 25's student has 24,000 pairs for the cross-encoder, half an
hour of CPU, before its first step). A runtime matter: keyed by the pairs and the teacher's
version, and no artifact version depends on it."""
from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

logger = logging.getLogger("passage_forge")

CACHE_NAME = "teacher_scores.npz"
Progress = Callable[[int, int], None]


def pairs_key(pairs: Sequence[tuple[str, str]], teacher: str) -> str:
    """A digest of the teacher's identity and every (query, passage) pair, in order."""
    digest = hashlib.sha256(teacher.encode("utf-8"))
    for query, passage in pairs:
        digest.update(b"\x00" + query.encode("utf-8") + b"\x01" + passage.encode("utf-8"))
    return digest.hexdigest()


def _scored_so_far(cache: Optional[Path], key: str, total: int) -> np.ndarray:
    """The logits of the first pairs, as a previous run of the same pairs and teacher left them."""
    if cache is None or not cache.is_file():
        return np.zeros(0, dtype=np.float32)
    with np.load(cache) as saved:
        if str(saved["key"]) == key and len(saved["logits"]) <= total:
            return saved["logits"].astype(np.float32)
    logger.info("teacher scores: %s holds other pairs; scoring again", cache)
    return np.zeros(0, dtype=np.float32)


def _save(cache: Path, key: str, logits: np.ndarray) -> None:
    """Whole or not at all: written aside, then renamed over the previous file."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.with_name(cache.name + ".partial")
    with open(partial, "wb") as f:
        np.savez(f, key=np.array(key), logits=logits)
    os.replace(partial, cache)


def cached_logits(pairs: Sequence[tuple[str, str]], teacher: str, cache: Optional[Path],
                  score: Callable[[list[tuple[str, str]], Progress], Sequence[float]],
                  chunk: int = 2048, progress: Optional[Progress] = None) -> np.ndarray:
    """`score(pairs, progress)` as float32, `chunk` pairs at a time, each chunk's logits added to
    `cache`; a cache holding this teacher's scores of the first pairs is continued, not redone."""
    key, total = pairs_key(pairs, teacher), len(pairs)
    parts = [_scored_so_far(cache, key, total)]
    done = len(parts[0])
    if done == total and total:
        logger.info("teacher scores: %d pairs read from %s (scored before this run resumed)", total, cache)
    elif done:
        logger.info("teacher scores: resuming at pair %d of %d (%s)", done, total, cache)
    for start in range(done, total, chunk):
        rows = list(pairs[start:start + chunk])
        offset = (lambda d, n, start=start: progress(start + d, total)) if progress is not None else (lambda d, n: None)
        parts.append(np.asarray(score(rows, offset), dtype=np.float32).reshape(-1))
        if cache is not None:
            _save(cache, key, np.concatenate(parts))
    return np.concatenate(parts)
