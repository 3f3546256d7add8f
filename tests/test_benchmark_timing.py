"""benchmarks/timing.py: the comparison benchmarks' median / range / ratio / parity rules."""
import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "timing.py"
_spec = importlib.util.spec_from_file_location("benchmark_timing", _PATH)
timing = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("benchmark_timing", timing)  # dataclasses look their module up
_spec.loader.exec_module(timing)


def test_summary_median_and_range_odd_and_even():
    s = timing.summarize([30.0, 10.0, 20.0, 50.0, 40.0])
    assert (s.median, s.lo, s.hi) == (30.0, 10.0, 50.0)
    s = timing.summarize([4.0, 1.0, 3.0, 2.0])
    assert (s.median, s.lo, s.hi) == (2.5, 1.0, 4.0)  # mean of the two middle values
    with pytest.raises(ValueError):
        timing.summarize([])


def test_ratio_of_medians_with_envelope_range_not_at_parity():
    a = timing.summarize([30, 32, 28, 31, 29])  # median 30, range 28..32
    b = timing.summarize([20, 21, 19, 25, 20])  # median 20, range 19..25
    r = timing.ratio(a, b)
    assert r.median == pytest.approx(1.5)
    assert r.lo == pytest.approx(28 / 25)  # 1.12
    assert r.hi == pytest.approx(32 / 19)  # 1.6842...
    assert r.parity is False
    assert timing.fmt_ratio(r) == "1.50x (1.12-1.68x)"


def test_overlapping_ranges_are_parity_even_with_different_medians():
    a = timing.summarize([28.0, 26.0, 29.0, 27.5, 28.5])  # median 28, range 26..29
    b = timing.summarize([20.0, 26.5, 21.0, 19.6, 20.5])  # median 20.5, range 19.6..26.5
    r = timing.ratio(a, b)
    assert r.median == pytest.approx(28 / 20.5)
    assert r.lo == pytest.approx(26 / 26.5) and r.lo < 1 < r.hi
    assert r.parity is True
    assert timing.fmt_ratio(r).endswith(", parity")
    # touching ranges count as overlapping; a gap does not
    assert timing.overlap(timing.summarize([1, 2]), timing.summarize([2, 3]))
    assert not timing.overlap(timing.summarize([1, 2]), timing.summarize([2.01, 3]))


def test_parity_is_symmetric_and_ratio_inverts():
    a = timing.summarize([10, 12, 11, 13, 9])
    b = timing.summarize([5, 6, 7, 5.5, 6.5])
    ab, ba = timing.ratio(a, b), timing.ratio(b, a)
    assert ab.parity == ba.parity is False
    assert ab.median == pytest.approx(1 / ba.median)
    assert ab.lo == pytest.approx(1 / ba.hi) and ab.hi == pytest.approx(1 / ba.lo)


def test_formatting():
    s = timing.summarize([3487.2, 3300.0, 3600.9, 3400.0, 3500.0])
    assert timing.fmt_summary(s, ",.0f") == "3,487 (3,300-3,601)"
    rows = timing.comparison_rows({"st": timing.summarize([20, 19, 21, 20, 22]),
                                   "ours": timing.summarize([40, 38, 42, 41, 39])}, reference="st")
    assert rows == [["st", "20.0 (19.0-22.0)", "1.00x (reference)"],
                    ["ours", "40.0 (38.0-42.0)", "2.00x (1.73-2.21x)"]]


def test_repeat_floor_and_alternating_order():
    assert timing.repeat_count("5") == 5
    with pytest.raises(argparse.ArgumentTypeError):
        timing.repeat_count("4")
    parser = argparse.ArgumentParser()
    timing.add_repeat_argument(parser)
    assert parser.parse_args([]).repeat == 5
    with pytest.raises(SystemExit):
        parser.parse_args(["--repeat", "3"])

    calls = []
    seconds, last = timing.alternate({"A": lambda r: calls.append(("A", r)) or r,
                                      "B": lambda r: calls.append(("B", r)) or -r}, repeat=5)
    assert [c[0] for c in calls] == list("ABBAABBAAB")
    assert [r for name, r in calls if name == "A"] == [0, 1, 2, 3, 4]
    assert {k: len(v) for k, v in seconds.items()} == {"A": 5, "B": 5}
    assert last == {"A": 4, "B": -4}
    with pytest.raises(argparse.ArgumentTypeError):
        timing.alternate({"A": lambda r: r}, repeat=2)
    assert timing.rates(10, [2.0, 5.0]) == [5.0, 2.0]
