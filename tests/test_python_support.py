"""The Pythons the package accepts are the Pythons it installs on: requirements.lock pins every
dependency a locked package declares for any accepted version (redis needs async-timeout below
3.11.3), and the Makefile refuses a Python outside requires-python before it makes a venv."""
import re
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, distribution

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from tasks.config import PROJECT_ROOT

REQUIRES_PYTHON = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["requires-python"]


def _pins() -> list[Requirement]:
    lines = (PROJECT_ROOT / "requirements.lock").read_text().splitlines()
    return [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]


def _locked() -> dict[str, Requirement]:
    return {canonicalize_name(r.name): r for r in _pins()}


def _accepted_pythons() -> list[str]:
    spec = SpecifierSet(REQUIRES_PYTHON)
    return [v for v in (f"3.{minor}.{micro}" for minor in range(8, 15) for micro in range(25)) if v in spec]


def _environment(version: str) -> dict[str, str]:
    return {"python_full_version": version, "python_version": ".".join(version.split(".")[:2])}


def test_the_lock_pins_what_every_locked_package_needs_on_every_accepted_python():
    locked, missing = _locked(), set()
    assert _accepted_pythons(), REQUIRES_PYTHON
    for name in locked:
        try:
            declared = distribution(name).requires or []
        except PackageNotFoundError:  # another Python's entry (a marker that is false here)
            continue
        for text in declared:
            need = Requirement(text)
            for version in _accepted_pythons():
                env = {**_environment(version), "extra": ""}
                if need.marker is None or need.marker.evaluate(env):
                    if canonicalize_name(need.name) not in locked:
                        missing.add(f"{name} needs {need} on Python {version}")
    assert not missing, sorted(missing)


def test_on_every_accepted_python_no_locked_package_has_two_pins():
    for version in _accepted_pythons():
        env = _environment(version)
        applying = [canonicalize_name(r.name) for r in _pins() if r.marker is None or r.marker.evaluate(env)]
        assert len(applying) == len(set(applying)), version
    oldest = _environment(_accepted_pythons()[0])
    # redis imports async-timeout below 3.11.3; pymdown-extensions 13 needs 3.11.5
    assert _locked()["async-timeout"].marker.evaluate(oldest)
    assert [str(r.specifier) for r in _pins() if r.name == "pymdown-extensions" and r.marker.evaluate(oldest)] == ["==12.3"]


def _makefile_check() -> str:
    text = (PROJECT_ROOT / "Makefile").read_text()
    return re.search(r"define CHECK_PYTHON\n(.*?)\nendef", text, re.S).group(1)


@pytest.mark.parametrize("version, accepted", [((3, 11, 7), True), ((3, 11, 2), True), ((3, 11, 1), False),
                                               ((3, 12, 0), False), ((3, 10, 14), False)])
def test_the_makefile_refuses_a_python_outside_requires_python(version, accepted):
    pretend = f"import sys; sys.version_info = {version + ('final', 0)!r}\n"
    proc = subprocess.run([sys.executable, "-c", pretend + _makefile_check()], cwd=PROJECT_ROOT,
                          capture_output=True, text=True)
    assert (proc.returncode == 0) is accepted, proc.stderr
    if not accepted:
        assert f"Passage Forge needs Python {REQUIRES_PYTHON}" in proc.stderr
        assert "make PYTHON=" in proc.stderr
