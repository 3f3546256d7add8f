"""The docs' own scripts (docs/generate.py, docs/browser.py) as modules in a test, and the site
built as `make docs-build` builds it: strict, its log returned for the test to read."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

DOCS = Path(__file__).resolve().parents[1] / "docs"


def docs_script(name: str) -> ModuleType:
    """docs/NAME.py, loaded from its file (docs/ is no package)."""
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_site(project: Path, site: Path) -> tuple[int, str]:
    """`mkdocs build --strict` of `project` into `site`: (exit code, its log)."""
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=project, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_COLOR": "1", "NO_MKDOCS_2_WARNING": "1"})
    return proc.returncode, proc.stdout + proc.stderr
