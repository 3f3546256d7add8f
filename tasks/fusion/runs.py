"""Which stage produces each system's runs, for the families whose systems read other systems'
runs (fusion, rerank)."""
from __future__ import annotations

from tasks.engine import Stage


def run_stages_by_system(earlier: list[Stage]) -> dict[str, str]:
    """{system name: the stage that produces its runs}."""
    return {s.variant["system"]: s.name for s in earlier if s.produces_runs and "system" in s.variant}
