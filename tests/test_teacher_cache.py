"""The teacher's logits kept in a train stage's work folder (tasks/training/teacher_cache.py): a
resumed stage reads them instead of scoring every pair again, and only when they are the scores of
the same pairs by the same teacher."""
import numpy as np
import pytest

from tasks.training.teacher_cache import cached_logits

PAIRS = [("what is a cell", "A cell is the unit of life."), ("who wrote it", "It was written by Ann.")]


class Scorer:
    """Scores a pair by its lengths, counting its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, pairs):
        self.calls += 1
        return [len(q) - 0.5 * len(p) for q, p in pairs]


def test_scores_are_written_once_and_read_on_resume(tmp_path):
    scorer, cache = Scorer(), tmp_path / "work" / "teacher_scores.npz"
    first = cached_logits(PAIRS, "cross_encoder:a", cache, scorer)
    assert cache.is_file() and not list(cache.parent.glob("*.partial"))
    again = cached_logits(PAIRS, "cross_encoder:a", cache, scorer)
    assert scorer.calls == 1 and again.dtype == np.float32
    np.testing.assert_array_equal(again, first)
    np.testing.assert_allclose(first, scorer(PAIRS), rtol=1e-6)


@pytest.mark.parametrize("change", ["teacher", "pairs", "order"])
def test_other_pairs_or_another_teacher_are_scored_again(tmp_path, change):
    scorer, cache = Scorer(), tmp_path / "teacher_scores.npz"
    cached_logits(PAIRS, "cross_encoder:a", cache, scorer)
    teacher = "cross_encoder:b" if change == "teacher" else "cross_encoder:a"
    pairs = {"pairs": PAIRS[:1] + [("who wrote it", "Ann wrote it.")], "order": PAIRS[::-1]}.get(change, PAIRS)
    out = cached_logits(pairs, teacher, cache, scorer)
    assert scorer.calls == 2
    np.testing.assert_allclose(out, scorer(pairs), rtol=1e-6)
    assert cached_logits(pairs, teacher, cache, scorer) is not None and scorer.calls == 3  # the new scores are kept


def test_without_a_work_folder_nothing_is_kept(tmp_path):
    scorer = Scorer()
    cached_logits(PAIRS, "cross_encoder:a", None, scorer)
    cached_logits(PAIRS, "cross_encoder:a", None, scorer)
    assert scorer.calls == 2 and not list(tmp_path.iterdir())
