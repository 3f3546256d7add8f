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
    rows: dict[str, list] = {"qid": [], "pid": [], "strategy": [], "rank": [], "score": []}
    for qid, pid, rank, score in zip(*(top.column(c).to_pylist() for c in ("qid", "pid", "rank", "score"))):
        if pid in gold_of.get(qid, ()):
            continue
        if filter_answers and answers[qid] and has_answer(answers[qid], passage_text[pid], match_type):
            continue
        for key, value in (("qid", qid), ("pid", pid), ("strategy", strategy), ("rank", rank), ("score", score)):
            rows[key].append(value)
    return pa.table(rows, schema=NEGATIVES)
