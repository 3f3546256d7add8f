"""Progress for long loops: a log line every `every` items (Prefect shows the `passage_forge` logger)."""
from __future__ import annotations

import logging
import time
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")
logger = logging.getLogger("passage_forge")


def with_progress(items: Iterable[T], label: str, every: int = 10_000, total: int | None = None) -> Iterator[T]:
    start = time.perf_counter()
    count = 0
    for count, item in enumerate(items, 1):
        if count % every == 0:
            rate = count / max(time.perf_counter() - start, 1e-9)
            of = f"/{total:,}" if total else ""
            logger.info("%s: %s%s (%.0f/s)", label, f"{count:,}", of, rate)
        yield item
    logger.info("%s: done, %s in %.1f s", label, f"{count:,}", time.perf_counter() - start)


def progress_logger(label: str, every_s: float = 30.0):
    """A `progress(done, total)` callback logging at most every `every_s` seconds, and at the end:
    for loops that report progress themselves (e.g. generation over batches)."""
    last = time.monotonic()

    def log(done: int, total: int) -> None:
        nonlocal last
        if done == total or time.monotonic() - last >= every_s:
            last = time.monotonic()
            logger.info("%s: %s/%s", label, f"{done:,}", f"{total:,}")
    return log
