"""The benchmark scripts' shared start. They run as `python benchmarks/NAME.py`, which puts this
folder on sys.path; importing this module puts the project root there too."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_SQUAD = ROOT.parent / "shared" / "data" / "squad" / "dev-v1.1-partial.json"
