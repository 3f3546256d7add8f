"""The report's adaptation section (issue 25): teacher origin, round trip and the teacher's scores."""
from tasks.evaluation.adaptation_report import adaptation_section


def test_the_section_states_origin_round_trip_and_teacher_spread():
    text = adaptation_section(
        {"imported_from": "cross_encoder:abc", "trained_by_source": {"training_pairs": 2300, "dev_auc": 0.8123}},
        {"queries": 900, "pairs": 600, "round_trip_kept": 600 / 900},
        {"adapt-mmse": {"pairs_scored": 5000, "positive": {"p5": -1.0, "p50": 2.5, "p95": 4.0},
                        "negative": {"p5": -3.0, "p50": -1.25, "p95": 1.5}, "mean_margin": 3.1,
                        "positive_above_all_negatives": 0.62}})
    assert "`cross_encoder:abc` (trained there on 2,300 pairs, dev AUC 81.2)" in text
    assert "900 generated queries; the round-trip filter" in text and "kept 600 (66.7%)" in text
    assert "| adapt-mmse | 5,000 | -1.00 / 2.50 / 4.00 | -3.00 / -1.25 / 1.50 | 3.10 | 62.0% |" in text


def test_without_a_filter_or_students_the_section_says_only_what_happened():
    text = adaptation_section({}, {"queries": 10, "pairs": 10, "round_trip_kept": 1.0}, {})
    assert "10 generated queries became training pairs (no round-trip filter)." in text and "|" not in text
    assert adaptation_section({}, {}, {}) == ""
