"""Hard-negative mining over a runs table: the passages a retriever ranks high that are not gold
and (for questions with answer strings) contain no answer."""
from __future__ import annotations

from typing import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from tasks.evaluation.has_answer import has_answer
from tasks.schemas import NEGATIVES


def answer_free_negatives(runs: pa.Table, questions: pa.Table, passage_text: Mapping[str, str], gold: pa.Table,
                          strategy: str, depth: int, filter_answers: bool = True, match_type: str = "string") -> pa.Table:
    """Paper 003 section 4.1, "BM25 filtered by answer": for each question, the passages of its
    top-`depth` run that are neither gold nor (with `filter_answers`) answer-bearing, in run
    order; `rank` is the run's rank. Only the questions of `questions` are mined."""
    gold_of: dict[str, set[str]] = {}
    for qid, pid in zip(gold.column("qid").to_pylist(), gold.column("pid").to_pylist()):
        gold_of.setdefault(qid, set()).add(pid)
    answers = dict(zip(questions.column("qid").to_pylist(), questions.column("answers").to_pylist()))
    top = runs.filter(pc.and_(pc.less_equal(runs.column("rank"), depth),
                              pc.is_in(runs.column("qid"), value_set=questions.column("qid"))))
    top = top.sort_by([("qid", "ascending"), ("rank", "ascending")])
    rows: dict[str, list] = {"qid": [], "pid": [], "strategy": [], "rank": [], "score": [], "text": []}
    for qid, pid, rank, score in zip(*(top.column(c).to_pylist() for c in ("qid", "pid", "rank", "score"))):
        if pid in gold_of.get(qid, ()):
            continue
        if filter_answers and answers[qid] and has_answer(answers[qid], passage_text[pid], match_type):
            continue
        for key, value in (("qid", qid), ("pid", pid), ("strategy", strategy), ("rank", rank), ("score", score), ("text", None)):
            rows[key].append(value)
    return pa.table(rows, schema=NEGATIVES)


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
