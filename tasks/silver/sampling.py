"""The cross-attention classifier's training pairs (paper 001 section 4.1): each gold (question,
passage) pair is a positive; per question, negatives are drawn 1:1:1 from the BM25 top-10, the
dense top-10 and the other passages of the gold document, never a gold passage or one that
contains an answer."""
from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

import pyarrow as pa

from tasks.evaluation.has_answer import has_answer


@dataclass(frozen=True)
class LabelledPair:
    qid: str
    question: str
    pid: str
    label: int          # 1: gold, 0: sampled negative
    source: str         # gold, bm25, dense, document


def held_out(qid: str, share: float, seed: int) -> bool:
    """Whether question `qid` is in the classifier's dev split (paper 001 section 5.1: 10% of the
    training data held out); a hash of (seed, qid), so it does not depend on the other questions."""
    digest = hashlib.sha256(f"{seed}:{qid}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def sample_questions(questions: pa.Table, limit: Optional[int], seed: int) -> pa.Table:
    """At most `limit` rows of `questions`, a seeded sample in their order."""
    if limit is None or questions.num_rows <= limit:
        return questions
    rows = sorted(random.Random(seed).sample(range(questions.num_rows), limit))
    return questions.take(rows)


def _top(runs: pa.Table | None, depth: int) -> dict[str, list[str]]:
    """Each question's top-`depth` passages of a runs table, in rank order."""
    top: dict[str, list[tuple[int, str]]] = {}
    if runs is None:
        return {}
    for qid, pid, rank in zip(*(runs.column(c).to_pylist() for c in ("qid", "pid", "rank"))):
        if rank <= depth:
            top.setdefault(qid, []).append((rank, pid))
    return {q: [p for _, p in sorted(v)] for q, v in top.items()}


def classifier_pairs(questions: pa.Table, gold: pa.Table, passages: pa.Table, bm25_runs: pa.Table | None,
                     dense_runs: pa.Table | None, *, depth: int = 10, seed: int = 13,
                     match_type: str = "string") -> list[LabelledPair]:
    """Positives and 1:1:1 negatives for the questions of `questions` (paper 001 section 4.1).

    Per question: every gold pair; then, for each source in (bm25, dense, document), one negative
    drawn (seeded per question and source) from the source's candidates that are neither gold
    nor answer-bearing: the run's top-`depth` (BM25, dense) or the gold document's other passages.
    A source without a clean candidate (no dense run given, a one-passage document) adds none.
    """
    text_of = dict(zip(passages.column("pid").to_pylist(), passages.column("text").to_pylist()))
    doc_of = dict(zip(passages.column("pid").to_pylist(), passages.column("doc_id").to_pylist()))
    by_doc: dict[str, list[str]] = {}
    for pid, doc in doc_of.items():
        by_doc.setdefault(doc, []).append(pid)
    gold_of: dict[str, list[str]] = {}
    for qid, pid in zip(gold.column("qid").to_pylist(), gold.column("pid").to_pylist()):
        gold_of.setdefault(qid, []).append(pid)
    bm25_top, dense_top = _top(bm25_runs, depth), _top(dense_runs, depth)

    pairs: list[LabelledPair] = []
    for qid, question, answers in zip(*(questions.column(c).to_pylist() for c in ("qid", "question", "answers"))):
        golds = gold_of.get(qid)
        if not golds:
            continue
        pairs += [LabelledPair(qid, question, pid, 1, "gold") for pid in golds]

        def clean(candidates: Sequence[str]) -> list[str]:
            return [p for p in candidates if p not in golds and p in text_of
                    and not (answers and has_answer(answers, text_of[p], match_type))]

        document = [p for g in golds for p in by_doc.get(doc_of.get(g), []) if p not in golds]
        for source, candidates in (("bm25", bm25_top.get(qid, [])), ("dense", dense_top.get(qid, [])),
                                   ("document", sorted(set(document)))):
            options = clean(candidates)
            if options:
                pick = random.Random(f"{seed}:{qid}:{source}").choice(options)
                pairs.append(LabelledPair(qid, question, pick, 0, source))
    return pairs


def source_counts(pairs: Sequence[LabelledPair]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for p in pairs:
        counts[p.source] = counts.get(p.source, 0) + 1
    return counts


def as_text_pairs(pairs: Sequence[LabelledPair], text_of: Mapping[str, str]) -> list[tuple[str, str]]:
    return [(p.question, text_of[p.pid]) for p in pairs]
