"""Measurements live in docs/benchmarks.md (generated from benchmarks/results/), not in the code: no
comment or string literal (docstrings and pydantic Field descriptions, which the Prefect UI shows,
included) under tasks/, models/, flows/ or storage/ names a CPU model (Zen N, EPYC, Xeon) or a
measured ratio such as "1.21x". The code says what a setting does and why, and names the benchmark
that measured it. flows/study/ records the CPUs its runs ran on, so it is left out. The check is
proven on examples (it flags them and passes their rewrites), then run on every module."""
from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

from tasks.config import PROJECT_ROOT

CHECKED = ("tasks", "models", "flows", "storage")
EXEMPT = ("flows/study/",)

FORBIDDEN = {
    "a CPU model": re.compile(r"\bZen\s?\d\b|\bEPYCs?\b|\bXeons?\b", re.IGNORECASE),
    "a measured ratio": re.compile(r"\b\d+\.\d+x\b"),
}


def prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and string literal in a module's source."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.COMMENT, tokenize.STRING):
            found.append((token.start[0], token.string))
    return found


def offences(source: str) -> list[tuple[int, str, str]]:
    """(line number, what, the matched text) of every forbidden mention in a module's prose."""
    found = []
    for first_line, text in prose(source):
        for what, pattern in FORBIDDEN.items():
            for match in pattern.finditer(text):
                found.append((first_line + text.count("\n", 0, match.start()), what, match.group()))
    return sorted(found)


def checked_files() -> list[Path]:
    files = []
    for top in CHECKED:
        for path in sorted((PROJECT_ROOT / top).rglob("*.py")):
            rel = path.relative_to(PROJECT_ROOT).as_posix()
            if not rel.startswith(EXEMPT):
                files.append(path)
    return files


@pytest.mark.parametrize("bad", [
    'x = Field("auto", description="torch elsewhere (ONNX Runtime fp32 at parity on a Zen 1 "\n'
    '                              "EPYC, 1.21x on a Zen 3)")',
    '"""bf16 units: AMX tiles (encoding ran 3.33x fp32 on a Xeon)."""',
    "# measured on the EPYC: llama.cpp q8_0 faster than CTranslate2 int8",
    "# llama.cpp bf16: 4.60x the plain loop against q8_0's 2.96x",
    "def f():\n    \"\"\"its int8 1.85-2.05x there\"\"\"",
    "# on the AVX2 AMD EPYCs, Zen1 to 3",
])
def test_the_check_flags_a_cpu_model_or_a_measured_ratio(bad):
    assert offences(bad), bad


@pytest.mark.parametrize("good", [
    'x = Field("auto", description="auto: openvino at bf16 where the CPU has bf16 units, torch elsewhere '
    '(measured in docs/benchmarks.md, \'CPU runtimes\')")',
    '"""bf16 units: AMX tiles (`amx_bf16`) or AVX-512\'s bf16 dot product (`avx512_bf16`)."""',
    "# llama.cpp ahead of CTranslate2 on the CPU (docs/benchmarks.md, \"CPU runtimes\")",
    "HEX = 0x1F  # a mask, not a ratio",
    "zenith = 3.5  # a name with zen in it",
    "SHAPE = '2x2'",
])
def test_the_check_passes_the_rewrites(good):
    assert offences(good) == [], good


def test_no_module_names_a_cpu_model_or_a_measured_ratio():
    files = checked_files()
    assert PROJECT_ROOT / "models" / "cpu_features.py" in files
    assert not any(p.relative_to(PROJECT_ROOT).as_posix().startswith("flows/study/") for p in files)
    report = [f"{path.relative_to(PROJECT_ROOT).as_posix()}:{number}: {what}: {text}"
              for path in files for number, what, text in offences(path.read_text(encoding="utf-8"))]
    assert not report, ("measurements or CPU models in the code (they belong in docs/benchmarks.md, "
                        f"generated from benchmarks/results/) ({len(report)}):\n" + "\n".join(report))
