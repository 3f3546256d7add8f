"""Answer-match metrics for open-domain QA: DPR top-k accuracy and MRR (DESIGN.md section 6).

Two steps:

1. :func:`first_hit_ranks` turns runs into one row per (system, question): the rank of the
   first retrieved passage (within ``max_k``) that contains an answer, or null when none does
   (including questions the system retrieved nothing for). Schema ``QUESTION_RESULTS``.
2. :func:`qa_accuracy_metrics` aggregates those rows into ``METRICS`` rows per system and split,
   plus split ``'all'``. Values are fractions in [0, 1].

Metrics (``metric``, ``k``):

* ``top_k_accuracy``, k: fraction of questions with ``first_hit_rank <= k`` (DPR).
* ``mrr``, k (100 and 10 by default): mean of ``1 / first_hit_rank`` when it is ``<= k``, else 0
  ("MRR@k over answer matches").
* ``n_questions``, 0: number of questions (value is the count, not a fraction).

:func:`answer_precision_at` is ReQA's P@N over answer-containing passages: the fraction of
questions whose first answer-containing passage is within the top N (at rank 1 for P@1). With a
single relevant "answer" per question this is what ReQA reports as P@N; it equals top-k accuracy
at k = N and is given separately only so reports can label it as ReQA does.

Rank is the ``rank`` column of the run as stored (1-based); runs are not re-sorted by score.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import pyarrow as pa

from tasks.schemas import METRICS, QUESTION_RESULTS
from .has_answer import MATCH_TYPES, answer_tokens, contains_tokens, normalize, regex_match

__all__ = ["first_hit_ranks", "qa_accuracy_metrics", "answer_precision_at", "carries_answers", "ALL_SPLITS"]

ALL_SPLITS = "all"

PassageText = Mapping[str, str] | Callable[[str], str]


def _lookup(passage_text: PassageText) -> Callable[[str], str]:
    if callable(passage_text) and not isinstance(passage_text, Mapping):
        return passage_text

    def get(pid: str) -> str:
        try:
            return passage_text[pid]
        except KeyError:
            raise KeyError(f"no passage text for pid {pid!r} (retrieved in the run)") from None

    return get


def _require(table: pa.Table, columns: Iterable[str], name: str) -> None:
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ValueError(f"{name} table lacks column(s) {missing}; has {table.column_names}")


def carries_answers(questions: pa.Table) -> bool:
    """Whether any question has an answer string (SQuAD, NQ) rather than only qrels (BEIR)."""
    return any(len(a) > 0 for a in questions.column("answers").to_pylist())


def first_hit_ranks(runs: pa.Table, passage_text: PassageText, questions: pa.Table,
                    match_type: str = "string", max_k: int = 100) -> pa.Table:
    """Rank of each question's first answer-containing passage, per system (QUESTION_RESULTS).

    One row per (system, question in ``questions``), systems in order of first appearance in
    ``runs``, questions in table order. Run rows for qids not in ``questions`` are ignored; only
    ranks ``<= max_k`` are looked at. ``passage_text`` maps pid to the text matched against
    (DPR matches the passage text without its title). Answer matching is cached per (qid, pid),
    so hybrids that share passages with other systems cost little more.
    """
    if match_type not in MATCH_TYPES:
        raise ValueError(f"match_type must be one of {MATCH_TYPES}, got {match_type!r}")
    if max_k < 1:
        raise ValueError(f"max_k must be >= 1, got {max_k}")
    _require(runs, ("qid", "pid", "rank", "system"), "runs")
    _require(questions, ("qid", "answers", "split"), "questions")
    text_of = _lookup(passage_text)

    q_ids = questions.column("qid").to_pylist()
    q_answers = questions.column("answers").to_pylist()
    q_splits = questions.column("split").to_pylist()
    answers_of: dict[str, list[str]] = {}
    for qid, answers in zip(q_ids, q_answers):
        if qid in answers_of:
            raise ValueError(f"questions table has qid {qid!r} more than once")
        answers_of[qid] = [a for a in (answers or []) if a]

    # per system: qid -> [(rank, pid)] within max_k
    systems: dict[str, dict[str, list[tuple[int, str]]]] = {}
    for system, qid, pid, rank in zip(runs.column("system").to_pylist(),
                                      runs.column("qid").to_pylist(),
                                      runs.column("pid").to_pylist(),
                                      runs.column("rank").to_pylist()):
        per_q = systems.setdefault(system, {})
        if qid not in answers_of or rank is None or rank > max_k:
            continue
        if rank < 1:
            raise ValueError(f"run of system {system!r}, qid {qid!r}: rank {rank} < 1 "
                             "(ranks are 1-based)")
        per_q.setdefault(qid, []).append((rank, pid))

    # answer representation per question, built lazily
    prepared: dict[str, list] = {}

    def prepare(qid: str) -> list:
        if qid not in prepared:
            if match_type == "string":
                prepared[qid] = [t for t in (answer_tokens(a) for a in answers_of[qid]) if t]
            else:
                prepared[qid] = [normalize(a) for a in answers_of[qid]]
        return prepared[qid]

    passage_cache: dict[str, object] = {}

    def passage_repr(pid: str):
        if pid not in passage_cache:
            text = text_of(pid) or ""
            if match_type == "string":
                tokens = answer_tokens(text)
                passage_cache[pid] = (tokens, frozenset(tokens))
            else:
                passage_cache[pid] = normalize(text)
        return passage_cache[pid]

    match_cache: dict[tuple[str, str], bool] = {}

    def matches(qid: str, pid: str) -> bool:
        key = (qid, pid)
        hit = match_cache.get(key)
        if hit is None:
            answers = prepare(qid)
            if not answers:
                hit = False
            else:
                passage = passage_repr(pid)
                if match_type == "string":
                    tokens, vocab = passage
                    hit = any(a[0] in vocab and contains_tokens(tokens, a) for a in answers)
                else:
                    hit = any(regex_match(a, passage) for a in answers)
            match_cache[key] = hit
        return hit

    out_system, out_qid, out_split, out_rank = [], [], [], []
    for system, per_q in systems.items():
        for qid, split in zip(q_ids, q_splits):
            first = None
            for rank, pid in sorted(per_q.get(qid, ())):
                if matches(qid, pid):
                    first = rank
                    break
            out_system.append(system)
            out_qid.append(qid)
            out_split.append(split)
            out_rank.append(first)
    return pa.table([pa.array(out_system, pa.string()), pa.array(out_qid, pa.string()),
                     pa.array(out_split, pa.string()), pa.array(out_rank, pa.int32())],
                    schema=QUESTION_RESULTS)


def _groups(results: pa.Table) -> list[tuple[str, str, list]]:
    """(system, split, first_hit_ranks) groups: every split of each system, then 'all'."""
    _require(results, ("system", "qid", "split", "first_hit_rank"), "results")
    by_system: dict[str, dict[str, list]] = {}
    for system, split, rank in zip(results.column("system").to_pylist(),
                                   results.column("split").to_pylist(),
                                   results.column("first_hit_rank").to_pylist()):
        by_system.setdefault(system, {}).setdefault(split, []).append(rank)
    groups = []
    for system, splits in by_system.items():
        named = sorted(s for s in splits if s is not None and s != ALL_SPLITS)
        for split in named:
            groups.append((system, split, splits[split]))
        groups.append((system, ALL_SPLITS, [r for ranks in splits.values() for r in ranks]))
    return groups


def _metrics_table(rows: list[tuple[str, str, int, float, str]]) -> pa.Table:
    cols = list(zip(*rows)) if rows else [[], [], [], [], []]
    return pa.table([pa.array(list(cols[0]), pa.string()), pa.array(list(cols[1]), pa.string()),
                     pa.array(list(cols[2]), pa.int32()), pa.array(list(cols[3]), pa.float64()),
                     pa.array(list(cols[4]), pa.string())], schema=METRICS)


def _accuracy(ranks: Sequence, k: int) -> float:
    return sum(1 for r in ranks if r is not None and r <= k) / len(ranks) if ranks else 0.0


def _mrr(ranks: Sequence, k: int) -> float:
    return sum(1.0 / r for r in ranks if r is not None and r <= k) / len(ranks) if ranks else 0.0


def qa_accuracy_metrics(results: pa.Table, ks: Sequence[int] = (1, 5, 10, 20, 100),
                        mrr_ks: Sequence[int] = (10, 100)) -> pa.Table:
    """Top-k accuracy, MRR@k and question counts per system and split, plus split 'all'."""
    rows = []
    for system, split, ranks in _groups(results):
        for k in ks:
            rows.append((system, "top_k_accuracy", int(k), _accuracy(ranks, k), split))
        for k in mrr_ks:
            rows.append((system, "mrr", int(k), _mrr(ranks, k), split))
        rows.append((system, "n_questions", 0, float(len(ranks)), split))
    return _metrics_table(rows)


def answer_precision_at(results: pa.Table, n: int = 1) -> pa.Table:
    """ReQA P@N: fraction of questions whose first answer-containing passage is at rank <= n.

    For n = 1 this is the fraction of questions whose rank-1 passage contains an answer.
    Returns METRICS rows (metric ``'answer_precision'``, k = n) per system and split, plus 'all'.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return _metrics_table([(system, "answer_precision", int(n), _accuracy(ranks, n), split)
                           for system, split, ranks in _groups(results)])
