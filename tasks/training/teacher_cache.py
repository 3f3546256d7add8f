"""The teacher's logits for a train stage's pairs, scored in resumable shards of the stage's work
folder (storage/shards.py): a stage killed while scoring continues at the first unscored shard,
and one killed while training reads them all back (issue 25's student has 24,000 pairs for the
cross-encoder, half an hour of CPU, before its first step). A runtime matter: the shard plan is
the pairs and the teacher's version, and no artifact version depends on it."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from storage.shards import build_shards

logger = logging.getLogger("passage_forge")

CACHE_NAME = "teacher_scores"  # the shards' folder inside the stage's work folder
Progress = Callable[[int, int], None]


def cached_logits(pairs: Sequence[tuple[str, str]], teacher: str, cache: Optional[Path],
                  score: Callable[[list[tuple[str, str]], Progress], Sequence[float]],
                  chunk: int = 2048, progress: Optional[Progress] = None) -> np.ndarray:
    """`score(pairs, progress)` as float32, `chunk` pairs a shard; with a `cache` folder, the
    shards another run of the same pairs and teacher finished there are read, not scored again."""
    total = len(pairs)
    spans = [(start, min(start + chunk, total)) for start in range(0, total, chunk)]

    def compute(span: tuple[int, int]) -> pa.Table:
        start, stop = span
        report = (lambda d, n: progress(start + d, total)) if progress is not None else (lambda d, n: None)
        logits = np.asarray(score(list(pairs[start:stop]), report), dtype=np.float32).reshape(-1)
        return pa.table({"logit": logits})

    if cache is None:
        tables = [compute(span) for span in spans]
    else:
        cache.mkdir(parents=True, exist_ok=True)
        reused = []
        files = build_shards(cache, spans, compute, on_shard=lambda i, was_there: reused.append(was_there),
                             label="teacher scores", plan=(teacher, list(pairs)))
        if any(reused):
            logger.info("teacher scores: %d of %d pairs read from %s (scored before this run resumed)",
                        sum(stop - start for (start, stop), r in zip(spans, reused) if r), total, cache)
        tables = [pq.read_table(f) for f in files]
    return np.concatenate([t.column("logit").to_numpy() for t in tables]) if tables else np.zeros(0, np.float32)
