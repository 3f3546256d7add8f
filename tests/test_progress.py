"""Progress logging for long loops."""
import logging

from tasks import progress


def test_progress_logger_throttles_by_time_and_always_logs_the_end(monkeypatch, caplog):
    clock = iter([0.0, 1.0, 2.0, 31.0, 32.0, 33.0, 34.0])  # creation, then one reading per call
    log = progress.progress_logger("gen", every_s=30.0, clock=lambda: next(clock))
    with caplog.at_level(logging.INFO, logger="passage_forge"):
        for done in (16, 32, 48, 64):
            log(done, 64)
    assert [r.getMessage() for r in caplog.records] == ["gen: 48/64", "gen: 64/64"]
