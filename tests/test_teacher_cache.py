"""The teacher's logits scored in resumable shards of a train stage's work folder
(tasks/training/teacher_cache.py): a stage killed while scoring continues at its first unscored
chunk, one killed while training reads them back, and only the scores of the same pairs by the
same teacher are reused."""
import numpy as np
import pytest

from tasks.training.teacher_cache import cached_logits

PAIRS = [(f"question {i} about cells", f"passage {i}: " + "a cell is the unit of life " * (i % 3 + 1)) for i in range(7)]


class Scorer:
    """Scores a pair by its lengths, recording the pairs of each call; `fail_after` calls, it
    raises, as a killed run stops."""

    def __init__(self, fail_after=None):
        self.calls, self.fail_after = [], fail_after

    def __call__(self, pairs, progress):
        if self.fail_after is not None and len(self.calls) == self.fail_after:
            raise KeyboardInterrupt("killed")
        self.calls.append(list(pairs))
        progress(len(pairs), len(pairs))
        return [len(q) - 0.5 * len(p) for q, p in pairs]


def _want(pairs):
    return np.array([len(q) - 0.5 * len(p) for q, p in pairs], dtype=np.float32)


def test_scores_are_written_as_scored_and_read_on_resume(tmp_path):
    scorer, cache, seen = Scorer(), tmp_path / "work" / "teacher_scores", []
    first = cached_logits(PAIRS, "cross_encoder:a", cache, scorer, chunk=3, progress=lambda d, n: seen.append((d, n)))
    assert [len(c) for c in scorer.calls] == [3, 3, 1] and seen == [(3, 7), (6, 7), (7, 7)]
    assert len(list(cache.glob("shard-*.parquet"))) == 3 and not list(cache.glob(".*part"))
    again = cached_logits(PAIRS, "cross_encoder:a", cache, scorer, chunk=3)
    assert len(scorer.calls) == 3 and again.dtype == np.float32
    np.testing.assert_array_equal(again, first)
    np.testing.assert_allclose(first, _want(PAIRS), rtol=1e-6)


def test_a_run_killed_while_scoring_continues_at_its_first_unscored_chunk(tmp_path):
    cache = tmp_path / "teacher_scores"
    with pytest.raises(KeyboardInterrupt):
        cached_logits(PAIRS, "cross_encoder:a", cache, Scorer(fail_after=2), chunk=3)
    resumed = Scorer()
    out = cached_logits(PAIRS, "cross_encoder:a", cache, resumed, chunk=3)
    assert resumed.calls == [PAIRS[6:]]  # the two chunks scored before the kill are not scored again
    np.testing.assert_allclose(out, _want(PAIRS), rtol=1e-6)


@pytest.mark.parametrize("change", ["teacher", "pairs", "order"])
def test_other_pairs_or_another_teacher_are_scored_again(tmp_path, change):
    scorer, cache = Scorer(), tmp_path / "teacher_scores"
    cached_logits(PAIRS, "cross_encoder:a", cache, scorer)
    teacher = "cross_encoder:b" if change == "teacher" else "cross_encoder:a"
    pairs = {"pairs": PAIRS[:1] + [("who wrote it", "Ann wrote it.")], "order": PAIRS[::-1]}.get(change, PAIRS)
    out = cached_logits(pairs, teacher, cache, scorer)
    assert scorer.calls[-1] == list(pairs)
    np.testing.assert_allclose(out, _want(pairs), rtol=1e-6)
    cached_logits(pairs, teacher, cache, scorer)
    assert len(scorer.calls) == 2  # the new scores are the ones kept


def test_without_a_work_folder_nothing_is_kept(tmp_path):
    scorer = Scorer()
    cached_logits(PAIRS, "cross_encoder:a", None, scorer)
    cached_logits(PAIRS, "cross_encoder:a", None, scorer)
    assert len(scorer.calls) == 2 and not list(tmp_path.iterdir())
