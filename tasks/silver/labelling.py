"""Silver labelling (paper 001 section 4.3): a retriever's top-K candidates for a set of queries,
scored by the cross-attention classifier; a candidate that is not already a gold pair and has
p >= 0.5 becomes a silver pair of weight p^2 (section 4.2); gold pairs keep weight 1."""
from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from models.losses.weighted import silver_weight
from tasks.compute.score import ScoreJob, cross_encoder_on
from tasks.schemas import PAIRS

# One row per scored candidate; `source` is the query set: train (questions) or synthetic.
SCORED = pa.schema([("qid", pa.string()), ("query", pa.string()), ("pid", pa.string()), ("rank", pa.int32()),
                    ("p", pa.float32()), ("source", pa.string())])
# The stage's named table: the kept pairs with their probability and loss weight.
SILVER_PAIRS = pa.schema([("qid", pa.string()), ("pid", pa.string()), ("p", pa.float32()),
                          ("weight", pa.float32()), ("source", pa.string())])


@dataclass(frozen=True)
class Candidate:
    qid: str
    query: str
    pid: str
    rank: int
    source: str


def sample_queries(queries: dict[str, str], limit: Optional[int], seed: int) -> dict[str, str]:
    """At most `limit` of `queries` (qid -> text), a seeded sample."""
    if limit is None or len(queries) <= limit:
        return queries
    keep = set(random.Random(seed).sample(sorted(queries), limit))
    return {q: t for q, t in queries.items() if q in keep}


def candidates_from_runs(runs: pa.Table, queries: Mapping[str, str], source: str, top_k: int,
                         known: set[tuple[str, str]]) -> list[Candidate]:
    """The top-`top_k` of each query's run, minus its known (gold) pairs, in (qid, rank) order."""
    rows = sorted((q, r, p) for q, p, r in zip(*(runs.column(c).to_pylist() for c in ("qid", "pid", "rank")))
                  if q in queries and r <= top_k and (q, p) not in known)
    return [Candidate(q, queries[q], p, r, source) for q, r, p in rows]


def first_per_query(candidates: Iterable[Candidate], k: int) -> list[Candidate]:
    """The first `k` candidates of each query, in the given order."""
    by_query: dict[str, int] = {}
    kept = []
    for cand in candidates:
        by_query[cand.qid] = by_query.get(cand.qid, 0) + 1
        if by_query[cand.qid] <= k:
            kept.append(cand)
    return kept


def score_candidates(model, candidates: Sequence[Candidate], text_of: Mapping[str, str], batch_size: int,
                     device, bf16: bool = False, progress=None) -> pa.Table:
    """The SCORED table of `candidates`: p = sigmoid of the classifier's logit per pair, scored
    in length-sorted batches."""
    p = model.score([(c.query, text_of[c.pid]) for c in candidates], batch_size=batch_size, device=device, bf16=bf16,
                    progress=progress)
    return pa.table({"qid": [c.qid for c in candidates], "query": [c.query for c in candidates],
                     "pid": [c.pid for c in candidates], "rank": [c.rank for c in candidates],
                     "p": p.astype(np.float32), "source": [c.source for c in candidates]}, schema=SCORED)


def score_shard(job: ScoreJob, spec: tuple[int, list, dict]) -> pa.Table:
    """Shard i's candidates scored, with the texts of their passages (the shard carries them)."""
    from tasks.progress import progress_logger

    i, shard, text_of = spec
    if not shard:
        return SCORED.empty_table()
    device = job.scoring.device(job.device)
    return score_candidates(cross_encoder_on(job.model, device, job.scoring), shard, text_of, job.batch_size, device,
                            bf16=job.scoring.autocast_bf16(device), progress=progress_logger(f"{job.label}: shard {i + 1}/{job.n_shards}: pairs"))


def keep_silver(scored: pa.Table, threshold: float = 0.5) -> pa.Table:
    """SILVER_PAIRS: the scored pairs with p >= `threshold` (paper 001 section 5.1: 0.5), weight p^2."""
    p = scored.column("p").to_numpy()
    kept = scored.filter(pa.array(p >= threshold))
    return pa.table({"qid": kept.column("qid"), "pid": kept.column("pid"), "p": kept.column("p"),
                     "weight": pa.array(silver_weight(kept.column("p").to_numpy().astype(np.float64)).astype(np.float32)),
                     "source": kept.column("source")}, schema=SILVER_PAIRS)


def silver_training_pairs(silver: pa.Table, queries: Mapping[str, str], split: str = "train") -> pa.Table:
    """The kept pairs as training pairs (the PAIRS table every trainer reads): source silver,
    weight p^2."""
    qids = silver.column("qid").to_pylist()
    return pa.table({"qid": qids, "query": [queries[q] for q in qids], "pid": silver.column("pid"),
                     "source": ["silver"] * len(qids), "weight": silver.column("weight"),
                     "split": [split] * len(qids)}, schema=PAIRS)


def probability_histogram(p: Iterable[float], edges: Sequence[float] = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)) -> list[dict]:
    """Counts of p per bin [lo, hi) (the last bin includes 1.0): the distribution the report shows."""
    values = np.asarray(list(p), dtype=np.float64)
    counts, _ = np.histogram(values, bins=np.asarray(edges))
    return [{"from": float(lo), "to": float(hi), "pairs": int(c)} for lo, hi, c in zip(edges[:-1], edges[1:], counts)]


def added_share(silver: pa.Table, gold_pairs: int) -> float | None:
    """Silver pairs relative to the gold pairs (paper 001 section 5.3: +53% NQ, +12% SQuAD)."""
    return silver.num_rows / gold_pairs if gold_pairs else None


def source_summary(scored: pa.Table, silver: pa.Table, source: str, gold_pairs: int) -> dict:
    """One query set's figures in the stage's stats: queries and candidates scored, silver pairs
    kept, the gold pairs they add to, and the histogram of p."""
    kept = silver.filter(pc.equal(silver.column("source"), source))
    seen = scored.filter(pc.equal(scored.column("source"), source))
    return {"queries": len(set(seen.column("qid").to_pylist())), "candidates": seen.num_rows,
            "silver": kept.num_rows, "gold_pairs": gold_pairs, "added_vs_gold": added_share(kept, gold_pairs),
            "p_histogram": probability_histogram(seen.column("p").to_numpy())}
