"""The comparison benchmarks' shared protocol: alternated timing, medians, ranges and ratios.

Protocol (every comparison script uses it):

- **Alternated runs.** `alternate` runs every system once per repeat, in the given order on even
  repeats and in the reverse order on odd ones (A B, B A, A B, ...), so a load change on a shared
  machine, a warm cache or a thermal drift hits every system alike instead of whichever ran last.
- **At least `MIN_REPEAT` (5) repeats.** `add_repeat_argument` gives a ``--repeat`` option that
  defaults to 5 and refuses fewer.
- **Median and spread.** `summarize` reports each system's median and its range (min..max) over
  the repeats; nothing is "best of".
- **Ratio of medians with a range.** `ratio(a, b)` is ``median(a) / median(b)``; its range is the
  envelope ``min(a) / max(b) .. max(a) / min(b)`` over the per-repeat values (the most pessimistic
  and most optimistic pairing; chosen over per-repeat paired ratios because it agrees exactly with
  the parity rule below).
- **Parity.** Two systems are at parity when their ranges overlap (``min(a) <= max(b)`` and
  ``min(b) <= max(a)``), which is the same as the ratio's range containing 1: the run cannot tell
  them apart, whatever the ratio of medians says.

Values are whatever the script measures per repeat: seconds, or rates (items / seconds). A ratio
of rates reads "times faster", a ratio of seconds "times slower"; the scripts say which.

Tables, headers and result files: reporting.py.
"""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

MIN_REPEAT = 5
DEFAULT_REPEAT = 5


# --------------------------------------------------------------------------- arguments
def repeat_count(value: str | int) -> int:
    """argparse ``type`` for --repeat: an int of at least MIN_REPEAT."""
    n = int(value)
    if n < MIN_REPEAT:
        raise argparse.ArgumentTypeError(
            f"--repeat must be at least {MIN_REPEAT} (medians and ranges need repeats), got {n}")
    return n


def add_repeat_argument(parser: argparse.ArgumentParser, default: int = DEFAULT_REPEAT,
                        what: str = "runs of each system") -> None:
    parser.add_argument("--repeat", type=repeat_count, default=default,
                        help=f"{what}, alternated, order swapped each repeat (at least {MIN_REPEAT}; "
                             f"default {default})")


# --------------------------------------------------------------------------- running
def order_for(repeat_index: int, names: Sequence[str]) -> list[str]:
    """The systems' order in one repeat: as given on even repeats, reversed on odd ones."""
    return list(names) if repeat_index % 2 == 0 else list(reversed(names))


def alternate(systems: dict[str, Callable[[int], Any]], repeat: int,
              sync: Callable[[], None] | None = None) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Run each system ``repeat`` times, alternated (`order_for`), timing every call.

    ``systems`` maps a name to a callable taking the repeat index (so a script can hand each
    repeat its own batch); ``sync`` (e.g. ``torch.cuda.synchronize``) runs before starting and
    after stopping each clock. Returns (seconds per repeat, in repeat order, by name; each
    system's last return value by name). Warm-ups are the caller's business: run them before.
    """
    repeat_count(repeat)
    seconds: dict[str, list[float]] = {name: [] for name in systems}
    last: dict[str, Any] = {}
    for r in range(repeat):
        for name in order_for(r, list(systems)):
            if sync:
                sync()
            t = time.perf_counter()
            last[name] = systems[name](r)
            if sync:
                sync()
            seconds[name].append(time.perf_counter() - t)
    return seconds, last


def rates(work: float, seconds: Sequence[float]) -> list[float]:
    """Per-repeat throughput: ``work / s`` for each repeat's seconds."""
    return [work / s for s in seconds]


# --------------------------------------------------------------------------- statistics
@dataclass(frozen=True)
class Summary:
    values: tuple[float, ...]
    median: float
    lo: float
    hi: float


def summarize(values: Sequence[float]) -> Summary:
    """Median (the mean of the two middle values for an even count) and range of ``values``."""
    if not values:
        raise ValueError("no values to summarize")
    vals = tuple(float(v) for v in values)
    return Summary(vals, statistics.median(vals), min(vals), max(vals))


@dataclass(frozen=True)
class Ratio:
    median: float
    lo: float
    hi: float
    parity: bool


def overlap(a: Summary, b: Summary) -> bool:
    """Whether the two ranges overlap (closed intervals: touching counts)."""
    return a.lo <= b.hi and b.lo <= a.hi


def ratio(a: Summary, b: Summary) -> Ratio:
    """a over b: ratio of medians, envelope range min(a)/max(b) .. max(a)/min(b), parity = overlap."""
    return Ratio(a.median / b.median, a.lo / b.hi, a.hi / b.lo, overlap(a, b))


# --------------------------------------------------------------------------- formatting
def fmt_summary(s: Summary, spec: str = ".1f") -> str:
    """``median (min-max)``, e.g. ``28.0 (26.1-29.3)``; ``spec`` is a format spec (``",.0f"``)."""
    return f"{s.median:{spec}} ({s.lo:{spec}}-{s.hi:{spec}})"


def fmt_ratio(r: Ratio, spec: str = ".2f") -> str:
    """``1.04x (0.95-1.12x), parity``; parity is said only where the ranges overlap."""
    text = f"{r.median:{spec}}x ({r.lo:{spec}}-{r.hi:{spec}}x)"
    return text + (", parity" if r.parity else "")


def comparison_rows(summaries: dict[str, Summary], reference: str, spec: str = ".1f",
                    ratio_spec: str = ".2f") -> list[list[str]]:
    """One row per system: name, median (range), ratio vs ``reference`` with its range and parity."""
    ref = summaries[reference]
    rows = []
    for name, s in summaries.items():
        cell = "1.00x (reference)" if name == reference else fmt_ratio(ratio(s, ref), ratio_spec)
        rows.append([name, fmt_summary(s, spec), cell])
    return rows


def protocol_line(repeat: int, names: Sequence[str]) -> str:
    """One sentence saying how the figures were taken (for the scripts' printed reports)."""
    first, second = " ".join(order_for(0, names)), " ".join(order_for(1, names))
    return (f"{repeat} repeats, systems alternated ({first} | {second} | ...); median (min-max) over "
            "the repeats; ratio of medians (range min(a)/max(b)..max(a)/min(b)); "
            "parity = the ranges overlap")

