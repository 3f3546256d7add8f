"""Hard-negative mining (paper 003 section 4): candidates from a retriever's run (BM25), a dense
encoder's nearest passages (coarse, fine, self-mined), random draws, or the positive's document
(context), each filtered of gold and answer-bearing passages (and, when given, of passages a
relevance judge flags)."""
from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.evaluation.has_answer import has_answer
from tasks.schemas import NEGATIVES


#: Drops candidates a judge deems relevant (issue 11's cross-encoder fills it): given
#: (question, passage text) pairs, True where the passage answers the question.
RelevanceFilter = Callable[[Sequence[tuple[str, str]]], Sequence[bool]]
Candidate = tuple[str, str, int, Optional[float]]  # (qid, pid, rank, score)


def filter_candidates(candidates: Iterable[Candidate], questions: pa.Table, passage_text: Mapping[str, str],
                      gold: pa.Table, strategy: str, filter_answers: bool = True, match_type: str = "string",
                      is_relevant: RelevanceFilter | None = None) -> tuple[pa.Table, dict]:
    """Paper 003 section 4.1 ("filtered by answer"), for every retrieval strategy: drop a
    candidate that is a gold passage of its question, one that contains an answer (questions
    with answer strings, `filter_answers`), and one `is_relevant` flags. Returns the NEGATIVES
    table (candidates' order kept) and the counts: candidates, dropped per reason, kept, and
    the share filtered."""
    gold_of: dict[str, set[str]] = {}
    for qid, pid in zip(gold.column("qid").to_pylist(), gold.column("pid").to_pylist()):
        gold_of.setdefault(qid, set()).add(pid)
    answers = dict(zip(questions.column("qid").to_pylist(), questions.column("answers").to_pylist()))
    counts = {"candidates": 0, "dropped_gold": 0, "dropped_answer": 0, "dropped_relevant": 0}
    kept: list[Candidate] = []
    for qid, pid, rank, score in candidates:
        counts["candidates"] += 1
        if pid in gold_of.get(qid, ()):
            counts["dropped_gold"] += 1
        elif filter_answers and answers.get(qid) and has_answer(answers[qid], passage_text[pid], match_type):
            counts["dropped_answer"] += 1
        else:
            kept.append((qid, pid, rank, score))
    if is_relevant is not None and kept:
        text_of = dict(zip(questions.column("qid").to_pylist(), questions.column("question").to_pylist())) \
            if "question" in questions.column_names else {}
        verdicts = list(is_relevant([(text_of.get(q, ""), passage_text[p]) for q, p, _, _ in kept]))
        if len(verdicts) != len(kept):
            raise ValueError(f"is_relevant gave {len(verdicts)} verdicts for {len(kept)} candidates")
        counts["dropped_relevant"] = sum(map(bool, verdicts))
        kept = [c for c, relevant in zip(kept, verdicts) if not relevant]
    counts["kept"] = len(kept)
    counts["filtered_share"] = 1 - len(kept) / counts["candidates"] if counts["candidates"] else 0.0
    table = pa.table({"qid": [c[0] for c in kept], "pid": [c[1] for c in kept], "strategy": [strategy] * len(kept),
                      "rank": [c[2] for c in kept], "score": [c[3] for c in kept], "text": [None] * len(kept)},
                     schema=NEGATIVES)
    return table, counts


def run_candidates(runs: pa.Table, qids: pa.Array | pa.ChunkedArray, depth: int) -> Iterator[Candidate]:
    """The top-`depth` entries of a runs table for the questions `qids`, per question in rank order."""
    top = runs.filter(pc.and_(pc.less_equal(runs.column("rank"), depth), pc.is_in(runs.column("qid"), value_set=qids)))
    top = top.sort_by([("qid", "ascending"), ("rank", "ascending")])
    yield from zip(*(top.column(c).to_pylist() for c in ("qid", "pid", "rank", "score")))


def random_candidates(qids: Sequence[str], pids: Sequence[str], depth: int, seed: int) -> Iterator[Candidate]:
    """`depth` passages drawn uniformly without replacement per question, seeded per (seed, qid)
    so a question's draw does not depend on the others; rank is the draw order."""
    k = min(depth, len(pids))
    for qid in qids:
        for rank, i in enumerate(random.Random(f"{seed}:{qid}").sample(range(len(pids)), k), 1):
            yield qid, pids[i], rank, None


def dense_candidates(qids: Sequence[str], query_vectors: np.ndarray, shards: Iterable[tuple[Sequence[str], np.ndarray]],
                     depth: int, query_block: int = 1024) -> Iterator[Candidate]:
    """Each question's top-`depth` passages by inner product, over passage shards streamed once
    (memory bounded by a shard and the questions' top lists, never questions x passages)."""
    from tasks.negatives.blocked_topk import blocked_top_k

    top = blocked_top_k(query_vectors, shards, depth, query_block=query_block)
    for qid, pids, scores in zip(qids, top.pids, top.scores):
        for rank, (pid, score) in enumerate(zip(pids, scores), 1):
            yield qid, pid, rank, float(score)


def answer_free_negatives(runs: pa.Table, questions: pa.Table, passage_text: Mapping[str, str], gold: pa.Table,
                          strategy: str, depth: int, filter_answers: bool = True, match_type: str = "string") -> pa.Table:
    """Paper 003 section 4.1, "BM25 filtered by answer": for each question, the passages of its
    top-`depth` run that are neither gold nor (with `filter_answers`) answer-bearing, in run
    order; `rank` is the run's rank. Only the questions of `questions` are mined."""
    table, _ = filter_candidates(run_candidates(runs, questions.column("qid"), depth), questions, passage_text, gold,
                                 strategy, filter_answers, match_type)
    return table


def _halves(text: str) -> tuple[str, str]:
    words = text.split()
    middle = len(words) // 2
    return " ".join(words[:middle]), " ".join(words[middle:])


def _answer_half(text: str, query: str, answers: list[str]) -> int:
    """Which half of `text` answers: the one holding an answer string; without answers (synthetic
    questions) the one sharing more words with the query."""
    halves = _halves(text)
    for i, half in enumerate(halves):
        if answers and has_answer(answers, half):
            return i
    overlap = [len(set(query.lower().split()) & set(h.lower().split())) for h in halves]
    return 0 if overlap[0] >= overlap[1] else 1


def context_negatives(pairs: pa.Table, passages: pa.Table, answers: Mapping[str, list[str]] | None = None) -> pa.Table:
    """Paper 003 section 4.1, "context negatives": for each (query, positive passage) pair, the
    other passages of the positive's document, nearest first (rank by distance in the document).
    A single-passage document is split in half and the half that does not answer is the negative
    (a new pid `<pid>~half<1|2>` carrying its own `text`)."""
    answers = answers or {}
    doc_of, index_of, text_of, by_doc = {}, {}, {}, {}
    for pid, doc, index, text in zip(*(passages.column(c).to_pylist() for c in ("pid", "doc_id", "chunk_index", "text"))):
        doc_of[pid], index_of[pid], text_of[pid] = doc, index, text
        by_doc.setdefault(doc, []).append(pid)
    rows: dict[str, list] = {"qid": [], "pid": [], "strategy": [], "rank": [], "score": [], "text": []}

    def add(qid, pid, rank, text=None):
        for key, value in (("qid", qid), ("pid", pid), ("strategy", "context"), ("rank", rank), ("score", None), ("text", text)):
            rows[key].append(value)

    for qid, query, positive in zip(*(pairs.column(c).to_pylist() for c in ("qid", "query", "pid"))):
        siblings = [p for p in by_doc.get(doc_of.get(positive), []) if p != positive]
        if siblings:
            siblings.sort(key=lambda p: (abs(index_of[p] - index_of[positive]), index_of[p]))
            for rank, pid in enumerate(siblings, 1):
                add(qid, pid, rank)
        elif positive in text_of and len(text_of[positive].split()) >= 2:
            other = 1 - _answer_half(text_of[positive], query, answers.get(qid, []))
            add(qid, f"{positive}~half{other + 1}", 1, _halves(text_of[positive])[other])
    return pa.table(rows, schema=NEGATIVES)
