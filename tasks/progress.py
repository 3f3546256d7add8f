"""Progress for long loops: a log line every `every` items (Prefect shows the `passage_forge` logger),
and `report(label, done, total)` to whoever listens: the Prefect layer turns it into a progress
artifact of the running stage (flows/stage_task.py); plain runs and tests have no listener."""
from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")
logger = logging.getLogger("passage_forge")

Listener = Callable[[str, int, int], None]
_listeners: list[Listener] = []
_lock = threading.Lock()  # shards may report from a thread pool


def report(label: str, done: int, total: int | None) -> None:
    """`done` of `total` items of the loop `label` are finished (unknown totals are not reported)."""
    if not total or not _listeners:
        return
    with _lock:
        for listener in list(_listeners):
            listener(label, done, total)


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """`listener(label, done, total)` receives every report made inside the block."""
    with _lock:
        _listeners.append(listener)
    try:
        yield
    finally:
        with _lock:
            _listeners.remove(listener)


def with_progress(items: Iterable[T], label: str, every: int = 10_000, total: int | None = None) -> Iterator[T]:
    start = time.perf_counter()
    count = 0
    for count, item in enumerate(items, 1):
        if count % every == 0:
            rate = count / max(time.perf_counter() - start, 1e-9)
            of = f"/{total:,}" if total else ""
            logger.info("%s: %s%s (%.0f/s)", label, f"{count:,}", of, rate)
            report(label, count, total)
        yield item
    logger.info("%s: done, %s in %.1f s", label, f"{count:,}", time.perf_counter() - start)
    report(label, count, count)  # the end: whatever was counted is all there was (total or not)


def progress_logger(label: str, every_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
    """A `progress(done, total)` callback logging at most every `every_s` seconds of `clock`, and at
    the end: for loops that report progress themselves (e.g. generation over batches). Every call is
    reported to the listeners, which throttle on their own."""
    last = clock()

    def log(done: int, total: int) -> None:
        nonlocal last
        report(label, done, total)
        if done == total or clock() - last >= every_s:
            last = clock()
            logger.info("%s: %s/%s", label, f"{done:,}", f"{total:,}")
    return log
