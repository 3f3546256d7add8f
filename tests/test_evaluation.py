"""Hand-computed cases pinning every evaluation metric (DESIGN.md section 6)."""
from __future__ import annotations

import math
import random
import unicodedata

import ir_measures
import pyarrow as pa
import pytest
from ir_measures import P, RR, R, nDCG

from tasks.evaluation.has_answer import SimpleTokenizer, has_answer, normalize
from tasks.evaluation.ir_metrics import ir_metrics
from tasks.evaluation.qa_metrics import (answer_precision_at, first_hit_ranks,
                                         qa_accuracy_metrics)
from tasks.evaluation.report import metrics_markdown, write_report
from tasks.schemas import GOLD, METRICS, QUESTION_RESULTS, QUESTIONS, RUNS


# ---------------------------------------------------------------- helpers

def runs_table(rows):
    """rows: (system, qid, [pid, ...]) -> RUNS table, ranks 1.., scores deliberately not sorted."""
    out = {"qid": [], "pid": [], "rank": [], "score": [], "system": []}
    for system, qid, pids in rows:
        for i, pid in enumerate(pids):
            out["qid"].append(qid)
            out["pid"].append(pid)
            out["rank"].append(i + 1)
            out["score"].append(float((i * 7) % 5))  # scores disagree with ranks on purpose
            out["system"].append(system)
    return pa.table(out, schema=RUNS)


def questions_table(rows):
    """rows: (qid, answers, split)"""
    n = len(rows)
    return pa.table({"qid": [r[0] for r in rows], "question": ["?"] * n,
                     "answers": [r[1] for r in rows], "split": [r[2] for r in rows],
                     "source": ["toy"] * n, "doc_id": [None] * n, "answer_spans": [[]] * n},
                    schema=QUESTIONS)


def metric_values(table):
    """{(system, metric, k, split): value}"""
    assert table.schema.equals(METRICS)
    d = {}
    for r in table.to_pylist():
        key = (r["system"], r["metric"], r["k"], r["split"])
        assert key not in d
        d[key] = r["value"]
    return d


# ---------------------------------------------------------------- tokenizer / has_answer

def test_tokenizer_words_and_punctuation():
    tok = SimpleTokenizer()
    assert tok.tokenize("The U.S. has 1,000 cats!") == \
        ["The", "U", ".", "S", ".", "has", "1", ",", "000", "cats", "!"]
    assert tok.tokenize("The U.S.", uncased=True) == ["the", "u", ".", "s", "."]
    # spaces (\p{Z}) and controls (\p{C}) are dropped; tabs/newlines are controls
    assert tok.tokenize("a\tb\nc\u00a0d") == ["a", "b", "c", "d"]
    assert tok.tokenize("") == []


def test_normalize_is_nfd_and_marks_stay_in_tokens():
    assert normalize("é") == "e\u0301"
    assert SimpleTokenizer().tokenize(normalize("Beyoncé"), uncased=True) == ["beyonce\u0301"]


def test_accents():
    nfc, nfd = unicodedata.normalize("NFC", "Beyoncé"), unicodedata.normalize("NFD", "Beyoncé")
    assert nfc != nfd
    for answer in (nfc, nfd):
        for passage in (f"Songs by {nfc} in 2003", f"Songs by {nfd} in 2003"):
            assert has_answer([answer], passage)
    # NFD keeps the combining accent inside the word token: the unaccented form does not match
    assert not has_answer(["Beyonce"], f"Songs by {nfc}")
    assert not has_answer([nfc], "Songs by Beyonce")


def test_punctuation_and_numbers():
    assert has_answer(["U.S."], "He moved to the U.S. in 1990.")
    assert has_answer(["U.S."], "He moved to the u.s. in 1990.")
    assert not has_answer(["U.S."], "He moved to the US in 1990.")
    assert has_answer(["1,000"], "about 1,000 people")
    assert not has_answer(["1,000"], "about 1000 people")
    assert not has_answer(["1000"], "about 1,000 people")
    # punctuation is its own token, so the bare word still matches next to it
    assert has_answer(["Paris"], "(Paris), France")


def test_case_and_boundaries():
    assert has_answer(["paris"], "PARIS is the capital")
    assert has_answer(["Paris"], "Paris is the capital")      # at the start
    assert has_answer(["capital"], "Paris is the capital")    # at the end
    assert has_answer(["capital"], "Paris is the capital.")
    assert not has_answer(["art"], "a party for everyone")     # no partial-word matches
    assert not has_answer(["part"], "a party")
    assert has_answer(["party"], "a party")


def test_multi_token_answers():
    assert has_answer(["Barack Obama"], "president barack   obama said")
    assert has_answer(["Barack Obama"], "president barack\nobama said")   # whitespace-insensitive
    assert not has_answer(["Barack Obama"], "barack h. obama")             # must be contiguous
    assert not has_answer(["Obama Barack"], "barack obama")                 # order matters
    assert has_answer(["nope", "Obama"], "barack obama")                    # any answer
    assert not has_answer(["longer than the passage"], "longer than")


def test_empty_answers_never_match():
    assert not has_answer([], "anything")
    assert not has_answer([""], "anything")
    assert not has_answer(["   "], "anything")
    assert not has_answer(["", "..."], "nothing")  # '...' has tokens but they are absent
    assert not has_answer([""], "", match_type="regex")
    assert not has_answer(["  "], "x", match_type="regex")


def test_regex_answers():
    assert has_answer([r"\d{4}"], "It opened in 1887.", match_type="regex")
    assert not has_answer([r"\d{4}"], "It opened in 887.", match_type="regex")
    assert has_answer([r"eiffel\s+tower"], "The EIFFEL  Tower", match_type="regex")  # IGNORECASE
    assert has_answer([r"^tower"], "the\nTower", match_type="regex")               # MULTILINE
    # invalid patterns are skipped, never raise; valid ones beside them still count
    assert not has_answer([r"(unclosed"], "(unclosed", match_type="regex")
    assert not has_answer([r"[a-"], "[a-", match_type="regex")
    assert has_answer([r"(unclosed", r"\d+"], "42", match_type="regex")
    # the passage is NFD-normalised (as is the pattern): accents as combining marks
    assert has_answer(["Beyoncé"], "by Beyoncé", match_type="regex")
    assert has_answer(["Beyonce\u0301"], unicodedata.normalize("NFC", "by Beyoncé"),
                      match_type="regex")
    # regex is a search, not a token match: partial words match
    assert has_answer(["art"], "party", match_type="regex")


def test_bad_match_type():
    with pytest.raises(ValueError):
        has_answer(["a"], "a", match_type="fuzzy")


# ---------------------------------------------------------------- QA accuracy / MRR

FILLER = {f"f{i}": f"filler passage number {i}" for i in range(1, 20)}
TEXTS = {**FILLER,
         "paris": "Paris is the capital of France.",
         "thousand": "About 1,000 people came.",
         "everest": "Mount Everest is the highest mountain."}

QUESTIONS_TOY = questions_table([
    ("q1", ["Paris"], "dev"),
    ("q2", ["1,000", "one thousand"], "dev"),
    ("q3", ["Everest"], "test"),
    ("q4", ["Nowhere"], "test"),       # bm25 retrieves nothing for q4
])
# bm25: q1 first hit at rank 2, q2 at 1, q3 at 12, q4 nothing retrieved
# dense: q1 at 1, q2 no hit among retrieved, q3 not retrieved, q4 not retrieved
RUNS_TOY = runs_table([
    ("bm25", "q1", ["f1", "paris", "f2", "paris"]),
    ("bm25", "q2", ["thousand", "f1"]),
    ("bm25", "q3", [f"f{i}" for i in range(1, 12)] + ["everest"]),
    ("bm25", "q9", ["paris"]),               # not a question: ignored
    ("dense", "q1", ["paris"]),
    ("dense", "q2", ["f3", "paris"]),
])


def test_first_hit_ranks():
    res = first_hit_ranks(RUNS_TOY, TEXTS, QUESTIONS_TOY)
    assert res.schema.equals(QUESTION_RESULTS)
    rows = [(r["system"], r["qid"], r["split"], r["first_hit_rank"]) for r in res.to_pylist()]
    assert rows == [
        ("bm25", "q1", "dev", 2), ("bm25", "q2", "dev", 1),
        ("bm25", "q3", "test", 12), ("bm25", "q4", "test", None),
        ("dense", "q1", "dev", 1), ("dense", "q2", "dev", None),
        ("dense", "q3", "test", None), ("dense", "q4", "test", None),
    ]
    # max_k cuts the ranks looked at; a callable works as well as a mapping
    res10 = first_hit_ranks(RUNS_TOY, TEXTS.__getitem__, QUESTIONS_TOY, max_k=10)
    assert res10.column("first_hit_rank").to_pylist()[:4] == [2, 1, None, None]


def test_first_hit_ranks_regex_and_missing_text():
    qs = questions_table([("r1", [r"\d,\d{3}"], "test")])
    runs = runs_table([("bm25", "r1", ["paris", "thousand"])])
    res = first_hit_ranks(runs, TEXTS, qs, match_type="regex")
    assert res.column("first_hit_rank").to_pylist() == [2]
    with pytest.raises(KeyError, match="nope"):
        first_hit_ranks(runs_table([("bm25", "r1", ["nope"])]), TEXTS, qs)


def test_qa_accuracy_metrics_by_hand():
    m = metric_values(qa_accuracy_metrics(first_hit_ranks(RUNS_TOY, TEXTS, QUESTIONS_TOY)))
    b = lambda metric, k, split="all": m[("bm25", metric, k, split)]  # noqa: E731
    # bm25 first hits: q1=2, q2=1, q3=12, q4=none (4 questions)
    assert b("top_k_accuracy", 1) == pytest.approx(1 / 4)      # q2
    assert b("top_k_accuracy", 5) == pytest.approx(2 / 4)      # q1, q2
    assert b("top_k_accuracy", 10) == pytest.approx(2 / 4)
    assert b("top_k_accuracy", 20) == pytest.approx(3 / 4)     # + q3
    assert b("top_k_accuracy", 100) == pytest.approx(3 / 4)
    assert b("mrr", 100) == pytest.approx((1 / 2 + 1 / 1 + 1 / 12 + 0) / 4)   # = 19/48
    assert b("mrr", 10) == pytest.approx((1 / 2 + 1 / 1 + 0 + 0) / 4)        # rank 12 -> 0
    assert b("n_questions", 0) == 4
    # per split: dev = q1, q2; test = q3, q4
    assert b("top_k_accuracy", 1, "dev") == pytest.approx(1 / 2)
    assert b("top_k_accuracy", 5, "dev") == pytest.approx(1.0)
    assert b("mrr", 10, "dev") == pytest.approx((1 / 2 + 1) / 2)
    assert b("top_k_accuracy", 10, "test") == 0.0
    assert b("top_k_accuracy", 20, "test") == pytest.approx(1 / 2)
    assert b("mrr", 100, "test") == pytest.approx((1 / 12) / 2)
    assert b("mrr", 10, "test") == 0.0
    assert b("n_questions", 0, "dev") == 2 and b("n_questions", 0, "test") == 2
    # dense: q1 at 1, the rest none
    assert m[("dense", "top_k_accuracy", 1, "all")] == pytest.approx(1 / 4)
    assert m[("dense", "mrr", 100, "all")] == pytest.approx(1 / 4)
    assert m[("dense", "top_k_accuracy", 100, "test")] == 0.0
    # exactly the expected rows: 2 systems x 3 splits x (5 acc + 2 mrr + 1 count)
    assert len(m) == 2 * 3 * 8
    assert {k[3] for k in m} == {"dev", "test", "all"}


def test_answer_precision_at():
    res = first_hit_ranks(RUNS_TOY, TEXTS, QUESTIONS_TOY)
    m = metric_values(answer_precision_at(res, 1))
    assert m[("bm25", "answer_precision", 1, "all")] == pytest.approx(1 / 4)
    assert m[("bm25", "answer_precision", 1, "dev")] == pytest.approx(1 / 2)
    assert m[("dense", "answer_precision", 1, "dev")] == pytest.approx(1 / 2)
    m5 = metric_values(answer_precision_at(res, 5))
    assert m5[("bm25", "answer_precision", 5, "all")] == pytest.approx(2 / 4)


# ---------------------------------------------------------------- qrels metrics

def qrels_table(rows):
    return pa.table({"qid": [r[0] for r in rows], "pid": [r[1] for r in rows],
                     "relevance": [r[2] for r in rows]}, schema=GOLD)


# q1: graded; d4 is relevant but never retrieved; d3 judged non-relevant; d5 unjudged
# q2: the only relevant passage is at rank 11
# q3: judged, but the system retrieved nothing for it -> counts 0 (trec_eval -c)
# q4: retrieved but has no qrels -> ignored
QRELS_TOY = qrels_table([("q1", "d1", 2), ("q1", "d2", 1), ("q1", "d3", 0), ("q1", "d4", 1),
                         ("q2", "d7", 1), ("q3", "d9", 1)])
IR_RUNS = runs_table([
    ("sys", "q1", ["d3", "d1", "d5", "d2"]),
    ("sys", "q2", [f"n{i}" for i in range(1, 11)] + ["d7"]),
    ("sys", "q4", ["d1"]),
])
SPLIT_OF = {"q1": "dev", "q2": "dev", "q3": "test", "q4": "test"}

# q1 by hand
Q1_DCG = 0 / math.log2(2) + 2 / math.log2(3) + 0 / math.log2(4) + 1 / math.log2(5)
#      = 0 + 1.2618595 + 0 + 0.4306766 = 1.6925361
Q1_IDCG = 2 / math.log2(2) + 1 / math.log2(3) + 1 / math.log2(4) + 0 / math.log2(5)
#       = 2 + 0.6309298 + 0.5 = 3.1309298  (ideal order of all judgements: 2, 1, 1, 0)
Q1_NDCG = Q1_DCG / Q1_IDCG  # = 0.5405858
Q1 = {("P", 1): 0.0, ("P", 5): 2 / 5, ("P", 10): 2 / 10, ("recall", 20): 2 / 3,
      ("recall", 100): 2 / 3, ("ndcg_cut", 10): Q1_NDCG, ("mrr", 10): 1 / 2}
# q2: nothing relevant in the top 10; recall@20 finds d7 at rank 11; MRR@10 = 0 (not 1/11)
Q2 = {("P", 1): 0.0, ("P", 5): 0.0, ("P", 10): 0.0, ("recall", 20): 1.0, ("recall", 100): 1.0,
      ("ndcg_cut", 10): 0.0, ("mrr", 10): 0.0}
Q3 = {key: 0.0 for key in Q1}


def test_ir_metrics_by_hand():
    assert Q1_NDCG == pytest.approx(0.5405858, abs=1e-7)
    m = metric_values(ir_metrics(IR_RUNS, QRELS_TOY, SPLIT_OF))
    for (metric, k), v1 in Q1.items():
        v2, v3 = Q2[(metric, k)], Q3[(metric, k)]
        assert m[("sys", metric, k, "all")] == pytest.approx((v1 + v2 + v3) / 3), (metric, k)
        assert m[("sys", metric, k, "dev")] == pytest.approx((v1 + v2) / 2), (metric, k)
        assert m[("sys", metric, k, "test")] == pytest.approx(v3), (metric, k)  # q4 ignored
    # spelled out for the headline numbers
    assert m[("sys", "P", 5, "all")] == pytest.approx(0.4 / 3)
    assert m[("sys", "recall", 20, "all")] == pytest.approx(5 / 9)
    assert m[("sys", "ndcg_cut", 10, "all")] == pytest.approx(0.5405858 / 3, abs=1e-7)
    assert m[("sys", "mrr", 10, "dev")] == pytest.approx(0.25)
    assert len(m) == 7 * 3


def test_ir_metrics_uses_rank_not_score_and_no_split():
    m = metric_values(ir_metrics(IR_RUNS, QRELS_TOY))
    assert {k[3] for k in m} == {"all"}
    # scores in runs_table disagree with ranks; rank 1 (d3, non-relevant) decides P@1 = 0
    assert m[("sys", "P", 1, "all")] == 0.0
    assert m[("sys", "mrr", 10, "all")] == pytest.approx(0.5 / 3)


def test_mrr_at_10_cut_at_rank_11():
    qrels = qrels_table([("q", "rel", 1)])
    for rank, expected in ((10, 1 / 10), (11, 0.0), (1, 1.0)):
        run = runs_table([("s", "q", [f"x{i}" for i in range(1, rank)] + ["rel"])])
        m = metric_values(ir_metrics(run, qrels))
        assert m[("s", "mrr", 10, "all")] == pytest.approx(expected)


def test_ir_metrics_matches_ir_measures():
    """The same numbers from ir_measures (which also averages over all qrels queries)."""
    rng = random.Random(7)
    qrels_rows, run_rows = [], []
    for q in range(30):
        qid = f"q{q}"
        pids = [f"p{i}" for i in range(60)]
        for pid in rng.sample(pids, 8):
            qrels_rows.append((qid, pid, rng.choice([0, 1, 2, 3])))
        if q % 7 != 0:  # some judged queries get no run at all
            run_rows.append(("sys", qid, rng.sample(pids, rng.randint(1, 40))))
    run_rows.append(("sys", "unjudged", ["p1", "p2"]))
    qrels, runs = qrels_table(qrels_rows), runs_table(run_rows)
    ours = metric_values(ir_metrics(runs, qrels))

    qrels_ir = [ir_measures.Qrel(r["qid"], r["pid"], r["relevance"]) for r in qrels.to_pylist()]
    run_ir = [ir_measures.ScoredDoc(r["qid"], r["pid"], -float(r["rank"]))
              for r in runs.to_pylist()]
    measures = {("P", 1): P @ 1, ("P", 5): P @ 5, ("P", 10): P @ 10, ("recall", 20): R @ 20,
                ("recall", 100): R @ 100, ("ndcg_cut", 10): nDCG @ 10, ("mrr", 10): RR @ 10}
    theirs = ir_measures.calc_aggregate(list(measures.values()), qrels_ir, run_ir)
    for (metric, k), measure in measures.items():
        assert ours[("sys", metric, k, "all")] == pytest.approx(theirs[measure], abs=1e-9), measure


def test_ir_metrics_multiple_systems_and_empty():
    runs = runs_table([("a", "q1", ["d1"]), ("b", "q1", ["d3", "d1"])])
    m = metric_values(ir_metrics(runs, QRELS_TOY, p_at=(1,), recall_at=(), ndcg_at=(),
                                 mrr_at=(10,)))
    # 3 judged queries; only q1 retrieved
    assert m[("a", "P", 1, "all")] == pytest.approx(1 / 3)
    assert m[("b", "P", 1, "all")] == 0.0
    assert m[("b", "mrr", 10, "all")] == pytest.approx(0.5 / 3)
    assert len(m) == 4
    empty = ir_metrics(runs_table([]), QRELS_TOY)
    assert empty.num_rows == 0 and empty.schema.equals(METRICS)


# ---------------------------------------------------------------- report

def test_metrics_markdown_and_report(tmp_path):
    res = first_hit_ranks(RUNS_TOY, TEXTS, QUESTIONS_TOY)
    metrics = pa.concat_tables([qa_accuracy_metrics(res, ks=(1, 20)),
                                ir_metrics(IR_RUNS, QRELS_TOY, SPLIT_OF, p_at=(1,),
                                           recall_at=(), ndcg_at=(10,), mrr_at=())])
    md = metrics_markdown(metrics, systems=["dense", "bm25", "sys"])
    lines = md.splitlines()
    assert lines[0] == ("| System | Top-1 | Top-20 | P@1 | nDCG@10 | MRR@10 | MRR@100 | N |")
    assert lines[1] == "|---|---:|---:|---:|---:|---:|---:|---:|"
    assert lines[2] == "| dense | 25.0 | 25.0 | \u2013 | \u2013 | 0.250 | 0.250 | 4 |"
    assert lines[3] == "| bm25 | 25.0 | 75.0 | \u2013 | \u2013 | 0.375 | 0.396 | 4 |"
    assert lines[4] == f"| sys | \u2013 | \u2013 | 0.0 | {100 * Q1_NDCG / 3:.1f} | \u2013 | \u2013 | \u2013 |"
    assert "Split: all." in md and "MRR (0..1)" in md
    dev = metrics_markdown(metrics, systems=["bm25"], split="dev")
    assert "| bm25 | 50.0 | 100.0 | \u2013 | \u2013 | 0.750 | 0.750 | 2 |" in dev
    # without 'all' rows and no split chosen: one row per (system, split)
    per_split = metrics.filter(pa.compute.not_equal(metrics.column("split"), "all"))
    md2 = metrics_markdown(per_split, systems=["bm25"])
    assert md2.splitlines()[0].startswith("| System | Split | Top-1")
    assert "| bm25 | dev | 50.0 |" in md2 and "| bm25 | test | 0.0 |" in md2

    path = write_report(tmp_path / "sub" / "report.md", "Toy evaluation",
                        [("QA accuracy", md), ("Dev", dev)])
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# Toy evaluation\n\n## QA accuracy\n\n| System |")
    assert "\n## Dev\n\n| System |" in text
    assert list(path.parent.iterdir()) == [path]  # no temporary files left


def test_metrics_markdown_rejects_duplicates():
    dup = pa.table({"system": ["a", "a"], "metric": ["mrr", "mrr"], "k": [10, 10],
                    "value": [0.1, 0.2], "split": ["all", "all"]}, schema=METRICS)
    with pytest.raises(ValueError):
        metrics_markdown(dup)


# ---------------------------------------------------------------- BEIR's ignore_identical_ids

# A corpus whose queries are documents too (ArguAna-like): query "Q1" is document "Q1", chunked
# whole (chunk.words 0), so its passage is "Q1#0". Q1's only relevant passage is D1#0, which
# comes second, after Q1's own passage; Q2 is no document and its relevant passage is second too.
SELF_PASSAGES = pa.table({"pid": ["Q1#0", "D1#0", "D2#0", "D3#0"], "doc_id": ["Q1", "D1", "D2", "D3"],
                          "text": ["q1 text", "d1 text", "d2 text", "d3 text"]})
SELF_QRELS = qrels_table([("Q1", "D1#0", 1), ("Q2", "D2#0", 1)])
SELF_RUNS = runs_table([("bm25", "Q1", ["Q1#0", "D1#0", "D2#0"]), ("bm25", "Q2", ["D3#0", "D2#0", "D1#0"])])
NDCG_RANK_2 = 1 / math.log2(3)  # one relevant passage at rank 2 (ideal DCG 1) = 0.6309298


def test_drop_identical_ids_matches_the_query_document_and_reranks():
    from tasks.evaluation.identical_ids import drop_identical_ids

    doc_of = dict(zip(SELF_PASSAGES.column("pid").to_pylist(), SELF_PASSAGES.column("doc_id").to_pylist()))
    kept = drop_identical_ids(SELF_RUNS, doc_of)
    assert kept.schema.equals(RUNS)
    assert [(r["qid"], r["pid"], r["rank"]) for r in kept.to_pylist()] == [
        ("Q1", "D1#0", 1), ("Q1", "D2#0", 2), ("Q2", "D3#0", 1), ("Q2", "D2#0", 2), ("Q2", "D1#0", 3)]
    # a run whose pids are the document ids themselves (pid == qid) loses the self-hit as well
    plain = runs_table([("s", "Q1", ["D2", "Q1", "D1"])])
    assert [(r["pid"], r["rank"]) for r in drop_identical_ids(plain, {}).to_pylist()] == [("D2", 1), ("D1", 2)]
    assert drop_identical_ids(SELF_RUNS.filter(pa.compute.equal(SELF_RUNS.column("qid"), "Q2")),
                              doc_of).to_pylist() == SELF_RUNS.slice(3).to_pylist()  # nothing to drop


def test_evaluate_runs_ignore_identical_ids_by_hand():
    from tasks.evaluation.evaluate import evaluate_runs

    questions = questions_table([("Q1", [], "test"), ("Q2", [], "test")])  # no answers: qrels metrics

    def metrics(**kw):
        _, table, _ = evaluate_runs(questions, SELF_PASSAGES, SELF_QRELS, [SELF_RUNS], title="self", **kw)
        return metric_values(table)

    off, on = metrics(), metrics(ignore_identical_ids=True)
    assert metrics(ignore_identical_ids=False) == off  # the default is off
    # off: Q1's own passage takes rank 1, D1#0 is second; Q2 the same shape
    assert off[("bm25", "P", 1, "all")] == 0.0
    assert off[("bm25", "ndcg_cut", 10, "all")] == pytest.approx(NDCG_RANK_2)
    assert off[("bm25", "mrr", 10, "all")] == pytest.approx(0.5)
    # on: Q1's self-hit dropped, D1#0 moves to rank 1 (P@1 1, nDCG 1); Q2 unchanged
    assert on[("bm25", "P", 1, "all")] == pytest.approx(0.5)
    assert on[("bm25", "ndcg_cut", 10, "all")] == pytest.approx((1.0 + NDCG_RANK_2) / 2)
    assert on[("bm25", "mrr", 10, "all")] == pytest.approx(0.75)
