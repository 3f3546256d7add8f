"""Importing a script of benchmarks/ in a test: the scripts import their siblings (timing, roofline,
_bootstrap) as top-level modules, so the folder is on sys.path while the test's module uses it."""
import contextlib
import importlib
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@contextlib.contextmanager
def benchmark_script(name: str):
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))
