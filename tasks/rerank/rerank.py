"""Reranking a run with the cross-attention classifier: each question's top `depth` passages are
reordered by the classifier's logit; the rest of the run follows in its own order."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa

from tasks.schemas import RUNS


def rerank_run(run: pa.Table, question_of: Mapping[str, str], text_of: Mapping[str, str], scorer, depth: int,
               system: str) -> pa.Table:
    """RUNS of `system`: per question, the top `depth` by `scorer(pairs) -> logits` (ties keep the
    run's order), then ranks depth+1.. as the run had them. Scores: the logits for the reranked
    head; below it, the head's lowest logit minus the rank distance (monotone, so any consumer of
    scores sees the same order)."""
    run = run.sort_by([("qid", "ascending"), ("rank", "ascending")])
    qids, pids = run.column("qid").to_pylist(), run.column("pid").to_pylist()
    ranks = run.column("rank").to_pylist()
    head = [i for i, r in enumerate(ranks) if r <= depth]
    logits = np.asarray(scorer([(question_of[qids[i]], text_of[pids[i]]) for i in head]), dtype=np.float64)
    logit_of = dict(zip(head, logits))
    rows: dict[str, list] = {"qid": [], "pid": [], "rank": [], "score": [], "system": []}
    start = 0
    while start < len(qids):
        end = start
        while end < len(qids) and qids[end] == qids[start]:
            end += 1
        top = sorted((i for i in range(start, end) if i in logit_of), key=lambda i: (-logit_of[i], ranks[i]))
        rest = [i for i in range(start, end) if i not in logit_of]
        floor = min((logit_of[i] for i in top), default=0.0)
        for new_rank, i in enumerate(top + rest, 1):
            score = logit_of[i] if i in logit_of else floor - (new_rank - len(top))
            for key, value in (("qid", qids[i]), ("pid", pids[i]), ("rank", new_rank), ("score", score),
                               ("system", system)):
                rows[key].append(value)
        start = end
    return pa.table(rows, schema=RUNS)


def questions_in_shards(qids: Sequence[str], shard_size: int) -> list[list[str]]:
    """The run's questions (sorted) cut into shards of `shard_size` questions."""
    ordered = sorted(set(qids))
    return [ordered[i:i + shard_size] for i in range(0, len(ordered), shard_size)]
