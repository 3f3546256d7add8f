"""conftest's `shared_data` fixture: a missing ../shared/data skips the end-to-end tests locally
but fails them when CI=true (a CI run must not pass by skipping them). Checked in a child pytest
whose conftest points the fixture at a folder that does not exist."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

CHILD_CONFTEST = '''
from pathlib import Path

import tests.conftest as project
from tests.conftest import shared_data  # noqa: F401  (the fixture under test)

project.SHARED_DATA = Path(__file__).parent / "no-such-shared-data"
'''

CHILD_TEST = '''
def test_needs_the_data(shared_data):
    assert shared_data.is_dir()
'''


def run_child(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(CHILD_CONFTEST)
    (tmp_path / "test_child.py").write_text(CHILD_TEST)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("ci", [None, "", "false"])
def test_missing_shared_data_skips_outside_ci(tmp_path, ci):
    out = run_child(tmp_path, ci)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 skipped" in out.stdout and "no-such-shared-data is absent" in out.stdout


@pytest.mark.parametrize("ci", ["true", "1"])
def test_missing_shared_data_fails_in_ci(tmp_path, ci):
    out = run_child(tmp_path, ci)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 error" in out.stdout and "skipped" not in out.stdout
    assert "the end-to-end tests must run in CI, not skip" in out.stdout
