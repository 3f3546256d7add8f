"""The synthetic-query quality measures on hand-made cases."""
import pytest

from tasks.qgen.quality import bleu_rouge, duplicate_share


def test_identical_queries_score_100_and_unrelated_ones_near_0():
    refs = {"p1": ["who designed the eiffel tower in paris"], "p2": ["what is the capital of france"]}
    same = bleu_rouge({"p1": ["who designed the eiffel tower in paris"]}, refs)
    assert same["bleu4"] == pytest.approx(100) and same["rougeL"] == pytest.approx(100) and same["scored_queries"] == 1
    other = bleu_rouge({"p1": ["banana smoothie recipe"]}, refs)
    assert other["rougeL"] == 0 and other["bleu4"] < 5


def test_rouge_l_takes_the_best_reference_and_skips_passages_without_references():
    refs = {"p1": ["what river flows through paris", "who designed the eiffel tower"]}
    # LCS with the second reference: "who designed the tower" (4 of 4 and 4 of 5 words).
    got = bleu_rouge({"p1": ["who designed the tower"], "p9": ["ignored query"]}, refs)
    assert got["scored_queries"] == 1
    assert got["rougeL"] == pytest.approx(100 * 2 * (1.0 * 0.8) / (1.0 + 0.8))
    assert bleu_rouge({"p9": ["x"]}, refs) == {"scored_queries": 0, "bleu4": None, "rougeL": None}


def test_duplicate_share_counts_repeats_across_passages_case_insensitively():
    assert duplicate_share({"a": ["What is X", "what is  x"], "b": ["What is X", "other"]}) == pytest.approx(2 / 4)
    assert duplicate_share({}) == 0.0
