"""Gold linking: which passages answer which question."""
from __future__ import annotations

from collections import defaultdict
from typing import Iterable

import pyarrow as pa

import pyarrow.compute as pc

from tasks.schemas import GOLD, PAIRS


def link_span_gold(questions: pa.Table, passages: pa.Table) -> tuple[pa.Table, dict]:
    """SQuAD-style: gold = passages of the question's article that fully contain an answer span.

    Returns the gold table and stats; questions with no such passage are counted as unlinked
    (listed by reason), never silently dropped from the evaluation.
    """
    by_doc: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for doc_id, start, end, pid in zip(
        passages.column("doc_id").to_pylist(),
        passages.column("char_start").to_pylist(),
        passages.column("char_end").to_pylist(),
        passages.column("pid").to_pylist(),
    ):
        if start is not None:
            by_doc[doc_id].append((start, end, pid))
    rows: dict[str, list] = {"qid": [], "pid": [], "relevance": []}
    unlinked = {"no_article": [], "span_across_chunks": [], "no_span": []}
    for qid, doc_id, spans in zip(
        questions.column("qid").to_pylist(),
        questions.column("doc_id").to_pylist(),
        questions.column("answer_spans").to_pylist(),
    ):
        if not spans:
            unlinked["no_span"].append(qid)
            continue
        if doc_id not in by_doc:
            unlinked["no_article"].append(qid)
            continue
        linked = sorted({pid for s, e, pid in by_doc[doc_id] for sp in spans if s <= sp["start"] and sp["end"] <= e})
        if not linked:
            unlinked["span_across_chunks"].append(qid)
        for pid in linked:
            rows["qid"].append(qid)
            rows["pid"].append(pid)
            rows["relevance"].append(1)
    return pa.table(rows, schema=GOLD), _stats(questions.num_rows, rows["qid"], unlinked)


def link_qrels_gold(qrels: pa.Table, passages: pa.Table) -> tuple[pa.Table, dict]:
    """BEIR-style: every passage of a judged document inherits the document's graded relevance."""
    pids_of: dict[str, list[str]] = defaultdict(list)
    for doc_id, pid in zip(passages.column("doc_id").to_pylist(), passages.column("pid").to_pylist()):
        pids_of[doc_id].append(pid)
    rows: dict[str, list] = {"qid": [], "pid": [], "relevance": []}
    missing_docs = []
    for qid, doc_id, rel in zip(
        qrels.column("qid").to_pylist(), qrels.column("doc_id").to_pylist(), qrels.column("relevance").to_pylist()
    ):
        if doc_id not in pids_of:
            missing_docs.append(f"{qid}:{doc_id}")
            continue
        for pid in pids_of[doc_id]:
            rows["qid"].append(qid)
            rows["pid"].append(pid)
            rows["relevance"].append(rel)
    n_questions = len(set(qrels.column("qid").to_pylist()))
    stats = _stats(n_questions, [q for q, r in zip(rows["qid"], rows["relevance"]) if r > 0], {"judged_doc_not_in_corpus": missing_docs})
    return pa.table(rows, schema=GOLD), stats


def _stats(n_questions: int, linked_qids: Iterable[str], unlinked: dict[str, list[str]]) -> dict:
    linked = set(linked_qids)
    return {
        "questions": n_questions,
        "linked_questions": len(linked),
        "unlinked_questions": n_questions - len(linked),
        "unlinked_by_reason": {k: len(v) for k, v in unlinked.items()},
        "unlinked_examples": {k: v[:20] for k, v in unlinked.items() if v},
    }


def gold_pairs(questions: pa.Table, gold: pa.Table) -> pa.Table:
    """One pair per question with a relevant passage: its first gold passage (in gold order)."""
    relevant = gold.filter(pc.greater(gold.column("relevance"), 0))
    first: dict[str, str] = {}
    for qid, pid in zip(relevant.column("qid").to_pylist(), relevant.column("pid").to_pylist()):
        first.setdefault(qid, pid)
    rows = [{"qid": q, "query": text, "pid": first[q], "source": "gold", "weight": 1.0, "split": split}
            for q, text, split in zip(questions.column("qid").to_pylist(), questions.column("question").to_pylist(),
                                      questions.column("split").to_pylist()) if q in first]
    return pa.Table.from_pylist(rows, schema=PAIRS)
