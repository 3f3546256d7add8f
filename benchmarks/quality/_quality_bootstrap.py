"""The quality studies' shared start. They run as `python benchmarks/quality/NAME.py`, which puts
this folder on sys.path; importing this module puts benchmarks/ there too (the modules the speed
benchmarks share: timing.py, _shared.py) and, through benchmarks/_bootstrap.py, the project root."""
from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1]
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(1, str(BENCHMARKS))  # after this folder

from _bootstrap import DEFAULT_SQUAD, ROOT  # noqa: E402,F401
